// flamia_forward and flamia_forward_train: validate, carve the caller's workspace (and saved codes
// buffer), check cu_seqlens and build the work order (the call's first kernel: what follows reads its
// checked copy of the offsets), quantize Q, K and V, build the V fold reference, then run the Hopper
// forward kernel, all asynchronously on the caller's stream. No allocation, no host synchronization
// and no device-to-host copy, so the call can be captured in a CUDA graph. Malformed offsets leave
// no document to the later kernels, and the builder fills o and lse with NaN.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <exception>
#include <string>

#include "capi/cuda_call.h"
#include "capi/validate.h"
#include "core/operand_layout.h"
#include "cuda/quant/quantize_mxfp8.cuh"
#include "cuda/sm90/forward.h"
#include "flamia/flamia.h"

namespace flamia::capi {
namespace {

// The forward after quantization, over the codes already in qkv: the V fold reference and the
// forward kernel, into workspace's regions of ws, on stream. problem: the kernels' fields, with the
// checked offsets and work order; docs: the call's documents with the checked offsets. row_max_prob:
// where the forward keeps 1 / l_i for the backward, or null.
CallError attend(const cuda::sm90::KernelProblem& problem, const flamia_documents& docs, const QkvCodePointers& qkv,
                 int64_t interior_scales_shift, uint8_t* workspace, const ForwardWorkspace& ws, flamia_tensor* o,
                 float* lse, float* row_max_prob, cudaStream_t s) {
  // validate_forward bounds T * H * D by 2^31 - 1, so every extent fits an int.
  const int T = problem.total_tokens, Hkv = problem.kv_heads;
  auto region = [workspace](const WorkspaceRegion& r) { return region_pointer(workspace, r); };
  if (const cudaError_t err = cuda::launch_prefix_max_scales(qkv.v_scales, T, Hkv, docs.cu_seqlens, docs.num_docs,
                                                             docs.max_seqlen, region(ws.v_fold_ref), s);
      err != cudaSuccess)
    return cuda_error("the V fold reference (launch_prefix_max_scales)", err);

  cuda::sm90::ForwardParams p{};
  static_cast<cuda::sm90::KernelProblem&>(p) = problem;
  p.q_codes = qkv.q_codes;
  p.q_scales = qkv.q_scales;
  p.k_codes = qkv.k_codes;
  p.k_scales = qkv.k_scales;
  p.v_codes_t = qkv.v_codes_t;
  p.vt_pitch = layout::transposed_tokens(T, docs.num_docs);
  p.v_scales = qkv.v_scales;
  p.v_fold_ref = region(ws.v_fold_ref);
  p.k_interior_codes = qkv.k_interior_codes;
  p.v_interior_codes_t = qkv.v_interior_codes_t;
  p.interior_scales_shift = interior_scales_shift;
  p.o = o->data;
  p.o_stride_token = o->stride_token;
  p.o_stride_head = o->stride_head;
  p.lse = lse;
  p.row_max_prob = row_max_prob;
  p.work_counter = reinterpret_cast<int*>(region(ws.work_counter));
  cudaError_t err = static_cast<cudaError_t>(cuda::sm90::launch_forward(p, s));
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_error("the forward kernel (launch_forward)", err);
  return CallError::success();
}

// codes: kInWorkspace for flamia_forward, kSaved for flamia_forward_train (q, k and v quantized
// into saved_codes, in every layout the backward reads too).
CallError forward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v, const flamia_documents* docs,
                  const flamia_options* options, flamia_tensor* o, float* lse, QkvCodes codes, void* saved_codes,
                  size_t saved_codes_bytes, void* workspace, size_t workspace_bytes, void* stream) {
  if (CallError e = validate_forward(q, k, v, docs, options, o, lse); !e.ok()) return e;
  const bool saving = codes == QkvCodes::kSaved;
  // Prefix isolation: per-token scales, and with block32 geometry K's and V's interior codes too.
  const NumericsOptions numerics = attention_options(*options).numerics;
  const bool interior = numerics.interior_codes();
  const ForwardWorkspace ws =
      forward_workspace_layout(q->tokens, q->heads, k->heads, q->dim, docs->num_docs, interior, codes);
  const SavedCodes saved = saved_codes_layout(q->tokens, q->heads, k->heads, q->dim, docs->num_docs, interior);
  if (CallError e = check_caller_buffers(ws, saving ? "flamia_forward_train_workspace_size" : "flamia_forward_workspace_size",
                                         workspace, workspace_bytes, codes, saved, saved_codes, saved_codes_bytes);
      !e.ok())
    return e;
  if (CallError e = check_device(); !e.ok()) return e;

  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint8_t* const base = static_cast<uint8_t*>(workspace);

  // First the offsets: malformed ones fill o and lse with NaN, and leave no document to what follows.
  cuda::sm90::KernelProblem problem = kernel_problem(*q, *k, *docs, *options, numerics);
  cuda::OffsetsCheck poison;
  poison.rows[0] = nan_rows(*o);
  poison.lse = lse, poison.lse_heads = int(q->heads);
  flamia_documents checked{};
  if (CallError e = check_offsets_and_order(*docs, problem, base, ws, poison, s, checked); !e.ok()) return e;

  const QkvCodePointers qkv =
      saving ? qkv_code_pointers(static_cast<uint8_t*>(saved_codes), saved) : qkv_code_pointers(base, ws);
  if (CallError e = quantize_qkv(*q, *k, *v, checked, numerics, qkv, s); !e.ok()) return e;
  // The saving forward keeps each row's largest probability for the backward's FP16 dQ partials.
  float* row_max_prob =
      saving ? reinterpret_cast<float*>(region_pointer(static_cast<uint8_t*>(saved_codes), saved.row_max_prob)) : nullptr;
  return attend(problem, checked, qkv, saving ? interior_scales_shift(saved) : interior_scales_shift(ws), base, ws, o,
                lse, row_max_prob, s);
}

}  // namespace
}  // namespace flamia::capi

extern "C" flamia_status flamia_forward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                        const flamia_documents* docs, const flamia_options* options, flamia_tensor* o,
                                        float* lse, void* workspace, size_t workspace_bytes, void* stream,
                                        flamia_error* error) {
  return flamia::capi::guarded(error, [&] {
    return flamia::capi::forward(q, k, v, docs, options, o, lse, flamia::capi::QkvCodes::kInWorkspace, nullptr, 0,
                                 workspace, workspace_bytes, stream);
  });
}

extern "C" flamia_status flamia_forward_train(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                              const flamia_documents* docs, const flamia_options* options,
                                              flamia_tensor* o, float* lse, void* saved_codes, size_t saved_codes_bytes,
                                              void* workspace, size_t workspace_bytes, void* stream,
                                              flamia_error* error) {
  return flamia::capi::guarded(error, [&] {
    return flamia::capi::forward(q, k, v, docs, options, o, lse, flamia::capi::QkvCodes::kSaved, saved_codes,
                                 saved_codes_bytes, workspace, workspace_bytes, stream);
  });
}
