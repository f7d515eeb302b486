// flamia_backward and flamia_backward_saved: validate, carve the caller's workspace, check cu_seqlens
// and build the work order (the call's first kernel: what follows reads its checked copy of the
// offsets), quantize Q, K and V (bitwise the codes the forward used; flamia_backward_saved reads them
// from the saved codes instead) and dO, with each row's D_i formed beside dO's codes, build dO's
// running scale max, then run the dK dV and dQ kernels, all asynchronously on the caller's stream.
// No allocation, no host synchronization and no device-to-host copy, so the call can be captured in
// a CUDA graph. Malformed offsets leave no document to the later kernels, and the offsets check
// fills dq, dk and dv with NaN.
// Where it applies (validate.h's plan_backward), dQ comes from FP16 partials of the dK dV pass
// instead of a dQ pass (core/dq_partials.h): a prep pass forms D_i with the rows' factors and zeroes
// dq, which holds the FP16 accumulator until the finish pass writes BF16 dQ.
#include <cuda_runtime.h>

#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <tuple>

#include "capi/cuda_call.h"
#include "capi/validate.h"
#include "core/operand_layout.h"
#include "cuda/quant/quantize_mxfp8.cuh"
#include "cuda/sm90/backward.h"
#include "flamia/flamia.h"

namespace flamia::capi {
namespace {

// codes: kInWorkspace for flamia_backward (q, k, v quantized again), kSaved for
// flamia_backward_saved (their codes read from flamia_forward_train's saved_codes).
CallError backward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v, const flamia_tensor* o,
                   const float* lse, const flamia_tensor* dout, const flamia_documents* docs,
                   const flamia_options* options, QkvCodes codes, const void* saved_codes, size_t saved_codes_bytes,
                   flamia_tensor* dq, flamia_tensor* dk, flamia_tensor* dv, void* workspace, size_t workspace_bytes,
                   void* stream) {
  if (CallError e = validate_backward(q, k, v, o, lse, dout, docs, options, dq, dk, dv, codes); !e.ok()) return e;
  const bool saved = codes == QkvCodes::kSaved;
  const BackwardPlan plan = plan_backward(*q, *dq, *docs, *options, codes);
  const NumericsOptions& numerics = plan.numerics;
  const bool interior = numerics.interior_codes();
  const BackwardWorkspace ws =
      backward_workspace_layout(q->tokens, q->heads, k->heads, q->dim, docs->num_docs, interior, codes);
  const SavedCodes saved_layout =
      saved_codes_layout(q->tokens, q->heads, k->heads, q->dim, docs->num_docs, interior);
  if (CallError e = check_caller_buffers(ws, saved ? "flamia_backward_saved_workspace_size" : "flamia_backward_workspace_size",
                                         workspace, workspace_bytes, codes, saved_layout, saved_codes, saved_codes_bytes);
      !e.ok())
    return e;
  if (CallError e = check_device(); !e.ok()) return e;

  // validate_backward bounds T * H * D by 2^31 - 1, so every extent fits an int.
  const int T = int(q->tokens), Hq = int(q->heads);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint8_t* const base = static_cast<uint8_t*>(workspace);
  auto region = [base](const WorkspaceRegion& r) { return region_pointer(base, r); };

  // First the offsets: malformed ones fill dq, dk and dv with NaN (FP16 NaN where dq holds the FP16
  // partials' accumulator: the finish pass turns it into BF16 NaN) and leave no document to what
  // follows.
  const bool dq_partials = plan.dq_partials;
  cuda::sm90::BackwardParams p{};
  static_cast<cuda::sm90::KernelProblem&>(p) = kernel_problem(*q, *k, *docs, *options, numerics);
  cuda::OffsetsCheck poison;
  poison.rows[0] = nan_rows(*dq, dq_partials ? cuda::kFp16NanPair : cuda::kBf16NanPair);
  poison.rows[1] = nan_rows(*dk);
  poison.rows[2] = nan_rows(*dv);
  flamia_documents checked_docs{};
  if (CallError e = check_offsets_and_order(*docs, p, base, ws, poison, s, checked_docs); !e.ok()) return e;
  const flamia_documents* const docs_checked = &checked_docs;

  // The saved buffer is only read here (the kernels take const pointers).
  const QkvCodePointers qkv = saved ? qkv_code_pointers(static_cast<uint8_t*>(const_cast<void*>(saved_codes)), saved_layout)
                                    : qkv_code_pointers(base, ws);
  if (!saved) {
    if (CallError e = quantize_qkv(*q, *k, *v, *docs_checked, numerics, qkv, s); !e.ok()) return e;
  }
  // The deterministic passes take D_i from dO's quantizer; the FP16 partials' prep pass forms it.
  const cuda::RowDelta row_delta{static_cast<const __nv_bfloat16*>(o->data), o->stride_token, o->stride_head,
                                 reinterpret_cast<float*>(region(ws.delta))};
  if (CallError e = quantize_operand(*dout, *docs_checked, numerics.effective_geometry(), numerics.scale_rule,
                                     region(ws.g_codes), region(ws.g_codes_t), region(ws.g_scales), s, "dout",
                                     nullptr, dq_partials ? nullptr : &row_delta);
      !e.ok())
    return e;
  // The dV fold reference gamma is the document's largest dO exponent (over a KV group's heads):
  // the running max at the document's end.
  if (const cudaError_t err = cuda::launch_prefix_max_scales(region(ws.g_scales), T, Hq, docs_checked->cu_seqlens,
                                                             docs_checked->num_docs, docs_checked->max_seqlen,
                                                             region(ws.g_scale_prefix_max), s);
      err != cudaSuccess)
    return cuda_error("dout's running scale max (launch_prefix_max_scales)", err);

  if (dq_partials) {  // U's and the accumulator's bounds read K's and V's running scale max
    const int Hkv = int(k->heads);
    for (const auto& [scales, prefix_max, what] :
         {std::tuple{qkv.k_scales, region(ws.k_scale_prefix_max), "K's running scale max (launch_prefix_max_scales)"},
          std::tuple{qkv.v_scales, region(ws.v_scale_prefix_max), "V's running scale max (launch_prefix_max_scales)"}})
      if (const cudaError_t err = cuda::launch_prefix_max_scales(scales, T, Hkv, docs_checked->cu_seqlens,
                                                                 docs_checked->num_docs, docs_checked->max_seqlen,
                                                                 prefix_max, s);
          err != cudaSuccess)
        return cuda_error(what, err);
  }

  p.q_codes = qkv.q_codes, p.q_scales = qkv.q_scales;
  p.k_codes = qkv.k_codes, p.k_scales = qkv.k_scales;
  p.v_codes = qkv.v_codes, p.v_scales = qkv.v_scales;
  p.g_codes = region(ws.g_codes), p.g_scales = region(ws.g_scales);
  p.q_codes_t = qkv.q_codes_t, p.k_codes_t = qkv.k_codes_t, p.g_codes_t = region(ws.g_codes_t);
  p.t_pitch = layout::transposed_tokens(T, docs->num_docs);
  p.k_interior_codes = qkv.k_interior_codes, p.v_interior_codes = qkv.v_interior_codes;
  p.k_interior_codes_t = qkv.k_interior_codes_t;
  p.interior_scales_shift = saved ? interior_scales_shift(saved_layout) : interior_scales_shift(ws);
  p.g_scale_prefix_max = region(ws.g_scale_prefix_max);
  p.o = o->data, p.o_stride_token = o->stride_token, p.o_stride_head = o->stride_head;
  p.lse = lse;
  p.delta = reinterpret_cast<float*>(region(ws.delta));
  p.work_counter = reinterpret_cast<int*>(region(ws.work_counter));
  p.dq = dq->data, p.dq_stride_token = dq->stride_token, p.dq_stride_head = dq->stride_head;
  p.dk = dk->data, p.dk_stride_token = dk->stride_token, p.dk_stride_head = dk->stride_head;
  p.dv = dv->data, p.dv_stride_token = dv->stride_token, p.dv_stride_head = dv->stride_head;
  p.dq_partials = dq_partials;
  if (dq_partials) {
    p.row_max_prob = reinterpret_cast<const float*>(
        region_pointer(static_cast<uint8_t*>(const_cast<void*>(saved_codes)), saved_layout.row_max_prob));
    p.k_scale_prefix_max = region(ws.k_scale_prefix_max);
    p.v_scale_prefix_max = region(ws.v_scale_prefix_max);
    p.dq_sigma = region(ws.dq_sigma);
    p.dq_beta = reinterpret_cast<int8_t*>(region(ws.dq_beta));
  }

  using Launch = int (*)(const cuda::sm90::BackwardParams&, void*);
  const std::pair<Launch, const char*> dkdv{cuda::sm90::launch_backward_dkdv, "the dK dV kernel (launch_backward_dkdv)"};
  const std::pair<Launch, const char*> deterministic[] = {
      dkdv, {cuda::sm90::launch_backward_dq, "the dQ kernel (launch_backward_dq)"}};
  const std::pair<Launch, const char*> with_partials[] = {
      {cuda::sm90::launch_backward_prep, "the backward prep kernel (launch_backward_prep)"},
      dkdv,
      {cuda::sm90::launch_backward_dq_finish, "the dQ finish kernel (launch_backward_dq_finish)"}};
  using Passes = std::span<const std::pair<Launch, const char*>>;
  const Passes passes = dq_partials ? Passes(with_partials) : Passes(deterministic);
  for (const auto& [launch, what] : passes) {
    cudaError_t err = static_cast<cudaError_t>(launch(p, stream));
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) return cuda_error(what, err);
  }
  return CallError::success();
}

}  // namespace
}  // namespace flamia::capi

extern "C" flamia_status flamia_backward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                         const flamia_tensor* o, const float* lse, const flamia_tensor* dout,
                                         const flamia_documents* docs, const flamia_options* options,
                                         flamia_tensor* dq, flamia_tensor* dk, flamia_tensor* dv, void* workspace,
                                         size_t workspace_bytes, void* stream, flamia_error* error) {
  return flamia::capi::guarded(error, [&] {
    return flamia::capi::backward(q, k, v, o, lse, dout, docs, options, flamia::capi::QkvCodes::kInWorkspace, nullptr,
                                  0, dq, dk, dv, workspace, workspace_bytes, stream);
  });
}

extern "C" flamia_status flamia_backward_saved(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                               const flamia_tensor* o, const float* lse, const flamia_tensor* dout,
                                               const flamia_documents* docs, const flamia_options* options,
                                               const void* saved_codes, size_t saved_codes_bytes, flamia_tensor* dq,
                                               flamia_tensor* dk, flamia_tensor* dv, void* workspace,
                                               size_t workspace_bytes, void* stream, flamia_error* error) {
  return flamia::capi::guarded(error, [&] {
    return flamia::capi::backward(q, k, v, o, lse, dout, docs, options, flamia::capi::QkvCodes::kSaved, saved_codes,
                                  saved_codes_bytes, dq, dk, dv, workspace, workspace_bytes, stream);
  });
}
