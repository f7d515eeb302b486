// Hopper MXFP8 attention backward: launcher interface (host-callable, no CUDA headers needed).
//
// Two passes, after Q, K, V and dO were quantized with the forward's groups and rule and dO's
// quantizer formed D_i = 2^eg_i sum_f cg_if O_if per (token, query head) from dO's codes and the
// saved O (cuda/gradient_row_dot.cuh):
//  1. dK dV: a work item (document, 128-key block, KV head) owns its keys' dK and dV and walks the
//            query heads of its group and the 64-query tiles that see its keys (one CTA per item,
//            or persistent CTAs when the documents are short on average);
//  2. dQ:    a work item (document, 128-query tile, query head) owns its rows' dQ and walks the
//            128-key tiles its rows see (persistent: one CTA per SM takes items in turn).
// Both main passes rebuild S and P from the forward's codes and LSE. Every output element has one
// owner that sums in a fixed order, so the backward is deterministic (no atomics) and a row's dQ
// is computed from that row's visible keys alone.
#pragma once

#include <cstdint>

#include "cuda/sm90/kernel_problem.h"

namespace flamia::cuda::sm90 {

struct BackwardParams : KernelProblem {
  // E4M3 codes [T, H, D] and UE8M0 scales [T, H] (H = Hq for q and dout, Hkv for k and v).
  const uint8_t *q_codes, *q_scales;
  const uint8_t *k_codes, *k_scales;
  const uint8_t *v_codes, *v_scales;
  const uint8_t *g_codes, *g_scales;  // dO
  // The same codes of Q, K and dO in the transposed layout [H, D, t_pitch] (core/operand_layout.h).
  const uint8_t *q_codes_t, *k_codes_t, *g_codes_t;
  int64_t t_pitch;  // layout::transposed_tokens(T, num_docs)
  // Interior tiles' K and V codes (KernelProblem::interior_codes; else the same as the fields
  // above) and scales, at k_scales + interior_scales_shift and v_scales + interior_scales_shift (0
  // without interior codes; the C API's layouts place both at one shift).
  const uint8_t *k_interior_codes, *v_interior_codes, *k_interior_codes_t;
  int64_t interior_scales_shift;
  const uint8_t* g_scale_prefix_max;  // [T, Hq]: running max of dO's scales within the document
  const void* o;                      // BF16 [T, Hq, D], the saved forward output
  int64_t o_stride_token, o_stride_head;
  const float* lse;  // [Hq, T], natural log, the saved forward LSE
  float* delta;      // [Hq, T]: D_i, from dO's quantizer or (dq_partials) the prep pass
  void *dq, *dk, *dv;  // BF16 outputs [T, Hq, D], [T, Hkv, D], [T, Hkv, D] with the strides below
  int64_t dq_stride_token, dq_stride_head, dk_stride_token, dk_stride_head, dv_stride_token, dv_stride_head;
  int* work_counter;  // the persistent kernels' item counter (launch.cuh; zeroed by each launch)

  // dQ by boosted FP16 partials (core/dq_partials.h), when dq_partials: the dK dV pass adds each
  // step's FP16 partial into dq's own buffer (FP16 [T, Hq, D] with dq's strides until the finish
  // pass rewrites it as BF16), and no dQ pass runs.
  bool dq_partials;
  const float* row_max_prob;                              // [Hq, T]: the forward's 1 / l_i
  const uint8_t *k_scale_prefix_max, *v_scale_prefix_max;  // [T, Hkv]: running max within the document
  uint8_t* dq_sigma;                                      // [Hq, T]: U's row scale for dQ (UE8M0)
  int8_t* dq_beta;                                        // [Hq, T]: the accumulator's boost exponent
};

// Each returns the cudaError_t of its launch as an int (0 = success); head_dim must be 64 or 128.
// They run on one stream after dO's quantizer: dK dV, then dQ. The deterministic passes read D_i
// (params.delta) from the quantizer (launch_quantize_mxfp8's row_delta); with dq_partials the prep
// pass forms it, with the rows' dQ factors, before dK dV, and the finish pass replaces dQ's.
int launch_backward_prep(const BackwardParams& params, void* stream);  // dq_partials only (D = 128)
int launch_backward_dkdv(const BackwardParams& params, void* stream);
// launch_backward_dkdv runs persistent CTAs when the mean document (T / num_docs) is shorter than
// this many tokens, one CTA per item otherwise (backward_dkdv.cu, DkdvSchedule). Measured dK dV ms
// on the H200 (one CTA per item vs persistent, mean document length): tiny-unaligned (236) 1.22 vs
// 0.89, 8192+224x256 (291) 1.73 vs 1.61, longtail (1074) 4.87 vs 5.15, 16x4096 3.68 vs 3.76,
// 4x16384 12.6 vs 13.2.
inline constexpr int kDkdvPersistentBelowMeanDocument = 512;
inline bool dkdv_runs_persistent(int64_t total_tokens, int64_t num_docs) {
  return total_tokens < int64_t(kDkdvPersistentBelowMeanDocument) * num_docs;
}
int launch_backward_dq(const BackwardParams& params, void* stream);
// After the dK dV pass of a call with dq_partials (D = 128): dQ = scale 2^-beta_i acc_i, FP16 to BF16
// in place.
int launch_backward_dq_finish(const BackwardParams& params, void* stream);

// Whether a call's backward takes dQ from FP16 partials (the C API runs the deterministic passes
// otherwise): the dK dV kernel has the instance (D = 128, causal, document isolation: no interior
// codes; the grid schedule) and the documents are long enough on average. Backward ms on the H200
// (deterministic vs FP16 partials, the partials forced on): 16x4096 5.47 vs 5.64, 8x8192 10.48 vs
// 10.09, 4x16384 20.2 vs 18.8, 2x32768 39.3 vs 37.1, 1x65536 80.0 vs 73.4. Per step the partials
// add U~'s transposed copy, a barrier of the two consumers, the dQ product and its reduction, which
// short items pay for most: below a mean document of 8,192 tokens they are slower (docs/KERNELS.md).
inline constexpr int kDqPartialsFromMeanDocument = 8192;
inline constexpr int kDqPartialsHeadDim = 128;  // the one head dim with a kDqPartials instance
inline bool dq_partials_supported(int head_dim, bool causal, bool interior_codes, int64_t total_tokens,
                                  int64_t num_docs) {
  return head_dim == kDqPartialsHeadDim && causal && !interior_codes &&
         total_tokens >= int64_t(kDqPartialsFromMeanDocument) * num_docs;
}

// The dK dV kernel's instances (backward_dkdv.cu's template arguments), each compiled for D = 64 and
// 128 except the FP16 partials' (D = 128 only): 11 kernels.
struct DkdvInstance {
  bool persistent;      // one CTA per SM taking items in turn (short documents), else one CTA per item
  bool turns;           // the consumers take turns at their products (tma.cuh's ConsumerTurns)
  bool interior_codes;  // prefix isolation's block32 interior codes (KernelProblem::interior_codes)
  bool dq_partials;     // dQ by FP16 partials inside the pass (BackwardParams::dq_partials)
  constexpr bool operator==(const DkdvInstance&) const = default;
};
inline constexpr DkdvInstance kDkdvInstances[] = {
    {.persistent = false, .turns = false, .interior_codes = false, .dq_partials = false},
    {.persistent = false, .turns = true, .interior_codes = false, .dq_partials = false},
    {.persistent = false, .turns = false, .interior_codes = true, .dq_partials = false},
    {.persistent = true, .turns = false, .interior_codes = false, .dq_partials = false},
    {.persistent = true, .turns = false, .interior_codes = true, .dq_partials = false},
    {.persistent = false, .turns = false, .interior_codes = false, .dq_partials = true},
};
// The instance a call runs: the FP16 partials' where the C API chose them, else the persistent
// schedule for short documents (dkdv_runs_persistent), else one CTA per item, with turns where they
// pay (kernel_problem.h's consumers_take_turns) and never with interior codes.
inline DkdvInstance dkdv_instance(const BackwardParams& p) {
  if (p.dq_partials) return {.persistent = false, .turns = false, .interior_codes = false, .dq_partials = true};
  if (dkdv_runs_persistent(p.total_tokens, p.num_docs))
    return {.persistent = true, .turns = false, .interior_codes = p.interior_codes, .dq_partials = false};
  const bool turns = !p.interior_codes && consumers_take_turns(p.group_scales, p.total_tokens, p.num_docs);
  return {.persistent = false, .turns = turns, .interior_codes = p.interior_codes, .dq_partials = false};
}

}  // namespace flamia::cuda::sm90
