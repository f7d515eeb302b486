// flamia_forward: validate, carve the caller's workspace, quantize Q, K and V, build the V fold
// reference, then run the Hopper forward kernel, all asynchronously on the caller's stream. No
// allocation, no host synchronization and no device-to-host copy, so the call can be captured in
// a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <exception>
#include <string>

#include "capi/validate.h"
#include "cuda/quant/quantize_mxfp8.cuh"
#include "cuda/sm90/forward.h"
#include "flamia/flamia.h"

namespace flamia::capi {
namespace {

CallError cuda_error(const std::string& what, cudaError_t err) {
  return {FLAMIA_ERROR_CUDA, what + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
}

// The kernels are SASS for sm_90a alone: any other device (or none) is NOT_SUPPORTED up front
// rather than a cudaErrorNoKernelImageForDevice from the first launch. Attribute queries do not
// synchronize and are legal during stream capture.
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

CallError forward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v, const flamia_documents* docs,
                  const flamia_options* options, flamia_tensor* o, float* lse, void* workspace,
                  size_t workspace_bytes, void* stream) {
  if (CallError e = validate_forward(q, k, v, docs, options, o, lse); !e.ok()) return e;
  const ForwardWorkspace ws = forward_workspace_layout(q->tokens, q->heads, k->heads, q->dim);
  if (CallError e = check_workspace(ws, workspace, workspace_bytes); !e.ok()) return e;
  if (CallError e = check_device(); !e.ok()) return e;

  // validate_forward bounds T * H * D by 2^31 - 1, so every extent fits an int.
  const int T = int(q->tokens), Hq = int(q->heads), Hkv = int(k->heads), D = int(q->dim);
  const NumericsOptions numerics = numerics_options(*options);
  const ScaleGeometry geometry = numerics.effective_geometry();  // prefix isolation: per-token scales
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint8_t* const base = static_cast<uint8_t*>(workspace);
  auto region = [base](const WorkspaceRegion& r) { return base + r.offset; };

  struct Operand {
    const flamia_tensor* t;
    int heads;
    const WorkspaceRegion& codes;
    const WorkspaceRegion& scales;
    const char* name;
  };
  const Operand operands[] = {{q, Hq, ws.q_codes, ws.q_scales, "q"},
                              {k, Hkv, ws.k_codes, ws.k_scales, "k"},
                              {v, Hkv, ws.v_codes, ws.v_scales, "v"}};
  for (const Operand& op : operands) {
    const cudaError_t err = cuda::launch_quantize_mxfp8(
        static_cast<const __nv_bfloat16*>(op.t->data), op.t->stride_token, op.t->stride_head, T, op.heads, D,
        docs->cu_seqlens, docs->num_docs, docs->max_seqlen, geometry, numerics.scale_rule, region(op.codes),
        region(op.scales), s);
    if (err != cudaSuccess) return cuda_error(std::string("quantizing ") + op.name + " (launch_quantize_mxfp8)", err);
  }
  if (const cudaError_t err = cuda::launch_prefix_max_scales(region(ws.v_scales), T, Hkv, docs->cu_seqlens,
                                                             docs->num_docs, region(ws.v_fold_ref), s);
      err != cudaSuccess)
    return cuda_error("the V fold reference (launch_prefix_max_scales)", err);

  cuda::sm90::ForwardParams p{};
  p.q_codes = region(ws.q_codes);
  p.q_scales = region(ws.q_scales);
  p.k_codes = region(ws.k_codes);
  p.k_scales = region(ws.k_scales);
  p.v_codes = region(ws.v_codes);
  p.v_scales = region(ws.v_scales);
  p.v_fold_ref = region(ws.v_fold_ref);
  p.o = o->data;
  p.o_stride_token = o->stride_token;
  p.o_stride_head = o->stride_head;
  p.lse = lse;
  p.cu_seqlens = docs->cu_seqlens;
  p.num_docs = docs->num_docs;
  p.max_seqlen = docs->max_seqlen;
  p.total_tokens = T;
  p.q_heads = Hq;
  p.kv_heads = Hkv;
  p.head_dim = D;
  p.softmax_scale = options->softmax_scale > 0.0f ? options->softmax_scale : float(1.0 / std::sqrt(double(D)));
  p.p_boost_log2 = options->p_boost_log2;
  p.causal = options->causal == 1;
  cudaError_t err = static_cast<cudaError_t>(cuda::sm90::launch_forward(p, stream));
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_error("the forward kernel (launch_forward)", err);
  return CallError::success();
}

}  // namespace
}  // namespace flamia::capi

extern "C" flamia_status flamia_forward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                        const flamia_documents* docs, const flamia_options* options, flamia_tensor* o,
                                        float* lse, void* workspace, size_t workspace_bytes, void* stream,
                                        flamia_error* error) {
  using flamia::capi::CallError;
  try {
    return flamia::capi::report(
        flamia::capi::forward(q, k, v, docs, options, o, lse, workspace, workspace_bytes, stream), error);
  } catch (const std::exception& e) {
    return flamia::capi::report({FLAMIA_ERROR_INVALID_ARGUMENT, std::string("internal error: ") + e.what()}, error);
  } catch (...) {
    return flamia::capi::report({FLAMIA_ERROR_INVALID_ARGUMENT, "internal error"}, error);
  }
}
