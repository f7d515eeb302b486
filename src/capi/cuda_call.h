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

// Quantizes the BF16 tensor t (heads heads) with document-local groups into UE8M0 scales and E4M3
// codes in the row layout [T, H, D] and/or the transposed layout of core/operand_layout.h (either
// codes pointer may be null), asynchronously on stream. name says which operand, for errors.
CallError quantize_operand(const flamia_tensor& t, const flamia_documents& docs, const NumericsOptions& numerics,
                           uint8_t* codes, uint8_t* transposed_codes, uint8_t* scales, cudaStream_t stream,
                           const char* name);

// Quantizes q, k and v into the regions of a forward or backward workspace layout, whose base is
// `workspace`: both calls encode the same operands the same way. A layout holds V's codes in the
// row layout (v_codes) or the transposed one (v_codes_t), whichever its kernels read.
template <class Workspace>
CallError quantize_qkv(const flamia_tensor& q, const flamia_tensor& k, const flamia_tensor& v,
                       const flamia_documents& docs, const NumericsOptions& numerics, uint8_t* workspace,
                       const Workspace& ws, cudaStream_t stream) {
  uint8_t *v_codes = nullptr, *v_codes_t = nullptr;
  if constexpr (requires { ws.v_codes_t; }) v_codes_t = workspace + ws.v_codes_t.offset;
  else v_codes = workspace + ws.v_codes.offset;
  const std::tuple<const flamia_tensor&, uint8_t*, uint8_t*, uint8_t*, const char*> operands[] = {
      {q, workspace + ws.q_codes.offset, nullptr, workspace + ws.q_scales.offset, "q"},
      {k, workspace + ws.k_codes.offset, nullptr, workspace + ws.k_scales.offset, "k"},
      {v, v_codes, v_codes_t, workspace + ws.v_scales.offset, "v"}};
  for (const auto& [t, codes, transposed, scales, name] : operands)
    if (CallError e = quantize_operand(t, docs, numerics, codes, transposed, scales, stream, name); !e.ok()) return e;
  return CallError::success();
}

// The softmax scale the kernels use: options.softmax_scale, or 1/sqrt(D) when it is 0.
float resolved_softmax_scale(const flamia_options& options, int head_dim);

}  // namespace flamia::capi
