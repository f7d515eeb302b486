// Device-side helpers shared by the C API entry points (forward.cu, backward.cu): CUDA errors as
// CallErrors, the sm_90a device check, and quantizing one operand into workspace buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "capi/validate.h"
#include "core/options.h"
#include "flamia/flamia.h"

namespace flamia::capi {

// FLAMIA_ERROR_CUDA naming what failed, with the CUDA error name and text.
CallError cuda_error(const std::string& what, cudaError_t err);

// The kernels are SASS for sm_90a alone: any other device (or none) is NOT_SUPPORTED up front
// rather than a cudaErrorNoKernelImageForDevice from the first launch. Attribute queries do not
// synchronize and are legal during stream capture.
CallError check_device();

// Quantizes the BF16 tensor t (heads heads) with document-local groups into E4M3 codes and UE8M0
// scales (workspace buffers), asynchronously on stream. name says which operand, for errors.
CallError quantize_operand(const flamia_tensor& t, const flamia_documents& docs, const NumericsOptions& numerics,
                           uint8_t* codes, uint8_t* scales, cudaStream_t stream, const char* name);

// The softmax scale the kernels use: options.softmax_scale, or 1/sqrt(D) when it is 0.
float resolved_softmax_scale(const flamia_options& options, int head_dim);

}  // namespace flamia::capi
