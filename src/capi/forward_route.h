// How flamia_forward sends short documents (core/short_documents.h): through the short-document
// kernel, which quantizes them itself (kFused: what the C API does wherever the options allow it),
// or like every other document through the quantization pass and the forward kernel (kUnfused).
// The two give bitwise the same O and LSE; the GPU tests call both to check it. No public switch:
// the choice changes no result, only the time.
#pragma once

#include "flamia/flamia.h"

namespace flamia::capi {

enum class ShortDocuments { kFused, kUnfused };

// flamia_forward (same arguments, same contract) with the short documents' route chosen.
flamia_status forward_with(ShortDocuments route, const flamia_tensor* q, const flamia_tensor* k,
                           const flamia_tensor* v, const flamia_documents* docs, const flamia_options* options,
                           flamia_tensor* o, float* lse, void* workspace, size_t workspace_bytes, void* stream,
                           flamia_error* error);

}  // namespace flamia::capi
