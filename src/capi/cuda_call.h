// Device-side helpers shared by the C API entry points (forward.cu, backward.cu): CUDA errors as
// CallErrors, the sm_90a device check, and quantizing one operand into workspace buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "capi/validate.h"
#include "core/options.h"
#include "cuda/sm90/attention_shape.h"
#include "flamia/flamia.h"

namespace flamia::capi {

// FLAMIA_ERROR_CUDA naming what failed, with the CUDA error name and text.
CallError cuda_error(const std::string& what, cudaError_t err);

// The kernels are SASS for sm_90a alone: any other device (or none) is NOT_SUPPORTED up front
// rather than a cudaErrorNoKernelImageForDevice from the first launch. Attribute queries do not
// synchronize and are legal during stream capture.
CallError check_device();

// Quantizes the BF16 tensor t (heads heads) with document-local groups into UE8M0 scales and E4M3
// codes in the row layout [T, H, D] and/or the transposed layout of core/operand_layout.h (either
// codes pointer may be null), asynchronously on stream. name says which operand, for errors.
CallError quantize_operand(const flamia_tensor& t, const flamia_documents& docs, const NumericsOptions& numerics,
                           uint8_t* codes, uint8_t* transposed_codes, uint8_t* scales, cudaStream_t stream,
                           const char* name);

// The buffer of a workspace region, or null where the layout has none (bytes 0).
inline uint8_t* region_pointer(uint8_t* workspace, const WorkspaceRegion& r) {
  return r.bytes == 0 ? nullptr : workspace + r.offset;
}

// Quantizes q, k and v into the regions of a forward or backward workspace layout, whose base is
// `workspace`: both calls encode the same operands the same way, each into the code layouts
// (rows, transposed) that its layout has.
template <class Workspace>
CallError quantize_qkv(const flamia_tensor& q, const flamia_tensor& k, const flamia_tensor& v,
                       const flamia_documents& docs, const NumericsOptions& numerics, uint8_t* workspace,
                       const Workspace& ws, cudaStream_t stream) {
  auto at = [workspace](const WorkspaceRegion& r) { return region_pointer(workspace, r); };
  const std::tuple<const flamia_tensor&, uint8_t*, uint8_t*, uint8_t*, const char*> operands[] = {
      {q, at(ws.q_codes), at(ws.q_codes_t), at(ws.q_scales), "q"},
      {k, at(ws.k_codes), at(ws.k_codes_t), at(ws.k_scales), "k"},
      {v, at(ws.v_codes), at(ws.v_codes_t), at(ws.v_scales), "v"}};
  for (const auto& [t, codes, transposed, scales, name] : operands)
    if (CallError e = quantize_operand(t, docs, numerics, codes, transposed, scales, stream, name); !e.ok()) return e;
  return CallError::success();
}

// The softmax scale the kernels use: options.softmax_scale, or 1/sqrt(D) when it is 0.
float resolved_softmax_scale(const flamia_options& options, int head_dim);

// The problem as every attention kernel sees it, from validated arguments (T * H * D < 2^31, so
// every extent fits an int): the same for the forward and the backward call.
cuda::sm90::AttentionShape attention_shape(const flamia_tensor& q, const flamia_tensor& k, const flamia_documents& docs,
                                           const flamia_options& options, const NumericsOptions& numerics);

}  // namespace flamia::capi
