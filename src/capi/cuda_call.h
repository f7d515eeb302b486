// Device-side helpers shared by the C API entry points (forward.cu, backward.cu): CUDA errors as
// CallErrors, the sm_90a device check, and quantizing one operand into workspace buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <tuple>

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

// Quantizes q, k and v into the {q,k,v}_{codes,scales} regions of a forward or backward workspace
// layout, whose base is `workspace`: both calls encode the same operands the same way.
template <class Workspace>
CallError quantize_qkv(const flamia_tensor& q, const flamia_tensor& k, const flamia_tensor& v,
                       const flamia_documents& docs, const NumericsOptions& numerics, uint8_t* workspace,
                       const Workspace& ws, cudaStream_t stream) {
  const std::tuple<const flamia_tensor&, const WorkspaceRegion&, const WorkspaceRegion&, const char*> operands[] = {
      {q, ws.q_codes, ws.q_scales, "q"}, {k, ws.k_codes, ws.k_scales, "k"}, {v, ws.v_codes, ws.v_scales, "v"}};
  for (const auto& [t, codes, scales, name] : operands)
    if (CallError e = quantize_operand(t, docs, numerics, workspace + codes.offset, workspace + scales.offset, stream, name);
        !e.ok())
      return e;
  return CallError::success();
}

// The softmax scale the kernels use: options.softmax_scale, or 1/sqrt(D) when it is 0.
float resolved_softmax_scale(const flamia_options& options, int head_dim);

}  // namespace flamia::capi
