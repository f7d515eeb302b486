#include "capi/cuda_call.h"

#include <cuda_bf16.h>

#include <cmath>

#include "core/tiling.h"
#include "cuda/quant/quantize_mxfp8.cuh"
#include "cuda/schedule/work_order.cuh"

namespace flamia::capi {

CallError cuda_error(const std::string& what, cudaError_t err) {
  return {FLAMIA_ERROR_CUDA, what + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
}

CallError check_device() {
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
      cudaGetLastError();  // reported here; do not leave it for the caller's next check
      return {FLAMIA_ERROR_NOT_SUPPORTED,
              std::string("no usable CUDA device (") + cudaGetErrorString(err) + "): flamia needs an sm_90a GPU"};
    }
    return cuda_error("cudaGetDevice", err);
  }
  int major = 0, minor = 0;
  if (const cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device); err != cudaSuccess)
    return cuda_error("cudaDeviceGetAttribute(compute capability major)", err);
  if (const cudaError_t err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device); err != cudaSuccess)
    return cuda_error("cudaDeviceGetAttribute(compute capability minor)", err);
  if (major != 9 || minor != 0) {
    return {FLAMIA_ERROR_NOT_SUPPORTED, "the current device " + std::to_string(device) + " is sm_" +
                                            std::to_string(major) + std::to_string(minor) +
                                            "; this build has kernels for sm_90a (Hopper) only"};
  }
  return CallError::success();
}

CallError quantize_operand(const flamia_tensor& t, const flamia_documents& docs, ScaleGeometry geometry,
                           ScaleRule rule, uint8_t* codes, uint8_t* transposed_codes, uint8_t* scales,
                           cudaStream_t stream, const char* name, const cuda::BlockCodes* second,
                           const cuda::RowDelta* row_delta) {
  // The validators bound T * H * D by 2^31 - 1, so every extent fits an int.
  const cudaError_t err = cuda::launch_quantize_mxfp8(
      static_cast<const __nv_bfloat16*>(t.data), t.stride_token, t.stride_head, int(t.tokens), int(t.heads),
      int(t.dim), docs.cu_seqlens, docs.num_docs, geometry, rule, codes, transposed_codes, scales, stream, second,
      row_delta);
  if (err != cudaSuccess) return cuda_error(std::string("quantizing ") + name + " (launch_quantize_mxfp8)", err);
  return CallError::success();
}

CallError quantize_qkv(const flamia_tensor& q, const flamia_tensor& k, const flamia_tensor& v,
                       const flamia_documents& docs, const NumericsOptions& numerics, const QkvCodePointers& dst,
                       cudaStream_t stream) {
  const ScaleGeometry geometry = numerics.effective_geometry();
  const ScaleRule rule = numerics.scale_rule;
  // K and V's interior codes come out of their per-token pass; no pair reads a document's last
  // kFrontierTiles frontier tiles with them, so those are not encoded twice.
  const bool interior = numerics.interior_codes();
  const cuda::BlockCodes k_interior{dst.k_interior_codes, dst.k_interior_codes_t, dst.k_interior_scales,
                                    tiling::kFrontierTile, tiling::kFrontierTiles};
  const cuda::BlockCodes v_interior{dst.v_interior_codes, dst.v_interior_codes_t, dst.v_interior_scales,
                                    tiling::kFrontierTile, tiling::kFrontierTiles};
  if (CallError e = quantize_operand(q, docs, geometry, rule, dst.q_codes, dst.q_codes_t, dst.q_scales, stream, "q");
      !e.ok())
    return e;
  if (CallError e = quantize_operand(k, docs, geometry, rule, dst.k_codes, dst.k_codes_t, dst.k_scales, stream, "k",
                                     interior ? &k_interior : nullptr);
      !e.ok())
    return e;
  return quantize_operand(v, docs, geometry, rule, dst.v_codes, dst.v_codes_t, dst.v_scales, stream, "v",
                          interior ? &v_interior : nullptr);
}

float resolved_softmax_scale(const flamia_options& options, int head_dim) {
  return options.softmax_scale > 0.0f ? options.softmax_scale : float(1.0 / std::sqrt(double(head_dim)));
}

cuda::sm90::KernelProblem kernel_problem(const flamia_tensor& q, const flamia_tensor& k, const flamia_documents& docs,
                                         const flamia_options& options, const NumericsOptions& numerics) {
  cuda::sm90::KernelProblem p{};
  p.cu_seqlens = docs.cu_seqlens;
  p.num_docs = docs.num_docs;
  p.total_tokens = int(q.tokens);
  p.q_heads = int(q.heads);
  p.kv_heads = int(k.heads);
  p.head_dim = int(q.dim);
  p.softmax_scale = resolved_softmax_scale(options, p.head_dim);
  p.p_boost_log2 = options.p_boost_log2;
  p.causal = options.causal == 1;
  p.group_scales = numerics.effective_geometry() == ScaleGeometry::kBlock32;
  p.interior_codes = numerics.interior_codes();
  return p;
}

CallError check_offsets_and_order_into(const flamia_documents& docs, cuda::sm90::KernelProblem& problem,
                                       uint8_t* table, uint8_t* counters, const cuda::OffsetsCheck& check,
                                       cudaStream_t stream, flamia_documents& checked_docs) {
  auto* const order_table = reinterpret_cast<order::OrderedTile*>(table);
  if (const cudaError_t err = cuda::launch_build_work_order(docs.cu_seqlens, docs.num_docs, problem.total_tokens,
                                                            problem.causal, order_table,
                                                            reinterpret_cast<int*>(counters), stream, check);
      err != cudaSuccess)
    return cuda_error("the offsets check and work order (launch_build_work_order)", err);
  checked_docs = docs;
  checked_docs.cu_seqlens = check.checked_cu_seqlens;
  problem.cu_seqlens = check.checked_cu_seqlens;
  problem.work_order = order_table;
  problem.work_order_tiles = reinterpret_cast<const int*>(counters);  // counter 0 holds the tile count
  return CallError::success();
}

}  // namespace flamia::capi
