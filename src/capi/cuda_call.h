// Device-side helpers shared by the C API entry points (forward.cu, backward.cu): CUDA errors as
// CallErrors, the sm_90a device check, quantizing one operand into workspace buffers, and the
// kernels' problem description and work order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "capi/validate.h"
#include "core/offsets_check.h"
#include "core/options.h"
#include "cuda/quant/quantize_mxfp8.cuh"
#include "cuda/schedule/work_order.cuh"
#include "cuda/sm90/kernel_problem.h"
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
// second: a block32 encoding in the same pass, as launch_quantize_mxfp8's (null: none); row_delta:
// the backward's D_i beside dO's codes, as launch_quantize_mxfp8's (null: none).
CallError quantize_operand(const flamia_tensor& t, const flamia_documents& docs, ScaleGeometry geometry,
                           ScaleRule rule, uint8_t* codes, uint8_t* transposed_codes, uint8_t* scales,
                           cudaStream_t stream, const char* name, const cuda::BlockCodes* second = nullptr,
                           const cuda::RowDelta* row_delta = nullptr);

// An output tensor as the offsets check fills it with NaN (nan_pair: two NaNs of its format).
inline cuda::NanRows nan_rows(const flamia_tensor& t, uint32_t nan_pair = cuda::kBf16NanPair) {
  return {t.data, t.stride_token, t.stride_head, int(t.heads), int(t.dim), nan_pair};
}

// The buffer of a workspace region, or null where the layout has none (bytes 0).
inline uint8_t* region_pointer(uint8_t* workspace, const WorkspaceRegion& r) {
  return r.bytes == 0 ? nullptr : workspace + r.offset;
}

// Where q, k and v's codes and scales are, or go: into a call's workspace or a saved codes buffer
// (validate.h's QkvCodes). A code layout the call does not use is null.
struct QkvCodePointers {
  uint8_t *q_codes, *k_codes, *v_codes;        // rows [T, H, D]
  uint8_t *q_codes_t, *k_codes_t, *v_codes_t;  // transposed (core/operand_layout.h)
  uint8_t *q_scales, *k_scales, *v_scales;     // [T, H]
  // The codes interior tiles read: K and V's interior codes (validate.h) where the layout has
  // them, else the same as the fields above (every tile reads one code set).
  uint8_t *k_interior_codes, *v_interior_codes, *k_interior_codes_t, *v_interior_codes_t;
  uint8_t *k_interior_scales, *v_interior_scales;
};
// The q, k, v regions of a layout (ForwardWorkspace, BackwardWorkspace or SavedCodes: the same
// field names) placed at base.
template <class Layout>
QkvCodePointers qkv_code_pointers(uint8_t* base, const Layout& l) {
  auto at = [base](const WorkspaceRegion& r) { return region_pointer(base, r); };
  QkvCodePointers p{at(l.q_codes),           at(l.k_codes),           at(l.v_codes),
                    at(l.q_codes_t),         at(l.k_codes_t),         at(l.v_codes_t),
                    at(l.q_scales),          at(l.k_scales),          at(l.v_scales),
                    at(l.k_interior_codes),  at(l.v_interior_codes),  at(l.k_interior_codes_t),
                    at(l.v_interior_codes_t), at(l.k_interior_scales), at(l.v_interior_scales)};
  if (!has_interior_codes(l)) {
    p.k_interior_codes = p.k_codes, p.v_interior_codes = p.v_codes;
    p.k_interior_codes_t = p.k_codes_t, p.v_interior_codes_t = p.v_codes_t;
    p.k_interior_scales = p.k_scales, p.v_interior_scales = p.v_scales;
  }
  return p;
}

// Quantizes q, k and v into dst: the forward, the backward and the saving forward encode the same
// operands the same way, each into the code layouts (rows, transposed) that dst has; with interior
// codes, k and v a second time with block32 groups.
CallError quantize_qkv(const flamia_tensor& q, const flamia_tensor& k, const flamia_tensor& v,
                       const flamia_documents& docs, const NumericsOptions& numerics, const QkvCodePointers& dst,
                       cudaStream_t stream);

// The softmax scale the kernels use: options.softmax_scale, or 1/sqrt(D) when it is 0.
float resolved_softmax_scale(const flamia_options& options, int head_dim);

// The problem as every attention kernel sees it, from validated arguments (T * H * D < 2^31, so
// every extent fits an int): the same for the forward and the backward call.
cuda::sm90::KernelProblem kernel_problem(const flamia_tensor& q, const flamia_tensor& k, const flamia_documents& docs,
                                         const flamia_options& options, const NumericsOptions& numerics);

// A call's first kernel, the work order builder (cuda/schedule/work_order.cuh), on stream: it checks
// docs.cu_seqlens on the device into the workspace's checked copy (the offsets, or zeros when they
// are malformed), records a violation in docs.status and fills the outputs `poison` names with NaN,
// and orders the attention kernels' work (core/schedule.h) into the workspace's work_order
// (table) and work_order_counters (scratch) regions. Returns docs as every later kernel of the call
// must see them, cu_seqlens the checked copy, and points problem at that copy and at the order.
// check_offsets_and_order_into takes the regions one by one (check.checked_cu_seqlens not null).
CallError check_offsets_and_order_into(const flamia_documents& docs, cuda::sm90::KernelProblem& problem,
                                       uint8_t* table, uint8_t* counters, const cuda::OffsetsCheck& check,
                                       cudaStream_t stream, flamia_documents& checked_docs);
template <class Workspace>
CallError check_offsets_and_order(const flamia_documents& docs, cuda::sm90::KernelProblem& problem, uint8_t* workspace,
                                  const Workspace& ws, cuda::OffsetsCheck poison, cudaStream_t stream,
                                  flamia_documents& checked_docs) {
  poison.checked_cu_seqlens = reinterpret_cast<int32_t*>(region_pointer(workspace, ws.checked_cu_seqlens));
  poison.status = reinterpret_cast<OffsetsRecord*>(docs.status);
  return check_offsets_and_order_into(docs, problem, region_pointer(workspace, ws.work_order),
                                      region_pointer(workspace, ws.work_order_counters), poison, stream, checked_docs);
}

}  // namespace flamia::capi
