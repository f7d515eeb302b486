// The FP16 dQ partials' passes around the dK dV pass (core/dq_partials.h).
// Prep: each row's D_i = sum_f dO^_if O_if with dO^ the reconstructed (quantized) incoming gradient
// and O the saved BF16 forward output, as the emulation defines it, D_i = 2^eg_i * sum_f cg_if *
// O_if, and from the same sums the row's dQ factors sigma_i and beta_i (|cg_i| summed in the same
// order); it zeroes the row's FP16 dQ accumulator. A row (token, query head) per D / 8 lanes, 8
// features per lane: one 8-byte load of dO's codes and one 16-byte load of O each (one warp per row
// with 1- and 2-byte loads took 174 us per 16x4096 call, half of DRAM's bandwidth), summed in
// cuda/gradient_row_dot.cuh's fixed order: bitwise the D_i that dO's quantizer forms for the
// deterministic passes.
// Finish: launch_backward_dq_finish turns the accumulator into BF16 dQ after the dK dV pass.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/dq_partials.h"
#include "cuda/gradient_row_dot.cuh"
#include "cuda/sm90/backward.h"
#include "cuda/sm90/fp8_math.cuh"

namespace flamia::cuda::sm90 {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kFeaturesPerLane = gradient_row_dot::kFeaturesPerLane;
template <int D>
constexpr int kRowsPerWarp = 32 / (D / kFeaturesPerLane);

// Where a lane's 8 features sit: a row (token, query head) per D / 8 lanes.
template <int D>
struct PrepLane {
  static constexpr int kLanesPerRow = D / kFeaturesPerLane;
  static_assert(kLanesPerRow * kFeaturesPerLane == D && kRowsPerWarp<D> * kLanesPerRow == 32, "rows split a warp evenly");
  int64_t row, token;  // row = token * Hq + head
  int head, f0;
  bool valid;  // every lane shuffles, valid or not
  __device__ PrepLane(const BackwardParams& p) {
    const int lane = int(threadIdx.x) % 32;
    const int64_t warp = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
    row = warp * kRowsPerWarp<D> + lane / kLanesPerRow;
    valid = row < int64_t(p.total_tokens) * p.q_heads;
    token = row / p.q_heads;
    head = int(row % p.q_heads);
    f0 = lane % kLanesPerRow * kFeaturesPerLane;
  }
};

template <int D>
__device__ __forceinline__ __nv_bfloat16* dq_row(const BackwardParams& p, const PrepLane<D>& at) {
  return static_cast<__nv_bfloat16*>(p.dq) + at.token * p.dq_stride_token + at.head * p.dq_stride_head;
}

// Malformed offsets (the work order builder's checked copy, p.cu_seqlens, is then all zeros and
// does not end at T): the builder has filled dq with FP16 NaN, which this pass leaves.
template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) backward_prep_kernel(const BackwardParams p) {
  const PrepLane<D> at(p);
  if (__ldg(p.cu_seqlens + p.num_docs) != p.total_tokens) return;  // the same in every thread
  float sum = 0.f, squares = 0.f;
  if (at.valid) {
    const uint2 codes = __ldg(reinterpret_cast<const uint2*>(p.g_codes + at.row * D + at.f0));
    const auto* o_row = static_cast<const __nv_bfloat16*>(p.o) + at.token * p.o_stride_token + at.head * p.o_stride_head;
    const uint4 o = __ldg(reinterpret_cast<const uint4*>(o_row + at.f0));  // rows are 16-byte aligned (C API)
    gradient_row_dot::add_lane_products<true>(codes, o, sum, squares);
    *reinterpret_cast<uint4*>(dq_row<D>(p, at) + at.f0) = make_uint4(0, 0, 0, 0);  // FP16 zeros
  }
  sum = gradient_row_dot::row_sum(sum, PrepLane<D>::kLanesPerRow);
  squares = gradient_row_dot::row_sum(squares, PrepLane<D>::kLanesPerRow);
  if (!at.valid || at.f0 != 0) return;
  const uint8_t g_scale = p.g_scales[at.row];
  const float delta = gradient_row_dot::row_delta(sum, g_scale);
  const int64_t out = int64_t(at.head) * p.total_tokens + at.token;
  p.delta[out] = delta;
  const int64_t key_row = at.token * p.kv_heads + at.head / (p.q_heads / p.kv_heads);
  const uint8_t ek = p.k_scale_prefix_max[key_row], ev = p.v_scale_prefix_max[key_row];
  using formats::ue8m0_is_nan, formats::ue8m0_exponent;
  dq_partials::RowInputs in;
  in.code_norm = sqrtf(squares);
  in.nan_scale = ue8m0_is_nan(g_scale) || ue8m0_is_nan(ek) || ue8m0_is_nan(ev);
  in.eg = in.nan_scale ? 0 : ue8m0_exponent(g_scale);
  in.ek_max = in.nan_scale ? 0 : ue8m0_exponent(ek);
  in.ev_max = in.nan_scale ? 0 : ue8m0_exponent(ev);
  in.delta = delta;
  in.p_max = p.row_max_prob[out];
  const dq_partials::RowFactors f = dq_partials::row_factors(in, D);
  p.dq_sigma[out] = f.sigma;
  p.dq_beta[out] = f.beta;
}

// dQ = scale 2^-beta_i acc_i: the FP16 accumulator, read and rewritten as BF16 in place.
template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) backward_dq_finish_kernel(const BackwardParams p) {
  const PrepLane<D> at(p);
  if (!at.valid) return;
  const float factor = p.softmax_scale * pow2i(-int(p.dq_beta[int64_t(at.head) * p.total_tokens + at.token]));
  auto* row = dq_row<D>(p, at) + at.f0;
  const uint4 acc = *reinterpret_cast<const uint4*>(row);
  uint32_t words[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&words[k]));
    const __nv_bfloat162 y = __floats2bfloat162_rn(x.x * factor, x.y * factor);
    words[k] = *reinterpret_cast<const uint32_t*>(&y);
  }
  *reinterpret_cast<uint4*>(row) = make_uint4(words[0], words[1], words[2], words[3]);
}

// One thread block per kWarpsPerBlock warps of rows. Both passes run only with the FP16 partials
// (the deterministic passes take D_i from dO's quantizer), which take one head dim
// (dq_partials_supported), so each has one instance.
template <class Kernel>
int launch_over_rows(const BackwardParams& p, void* stream, Kernel kernel) {
  if (!p.dq_partials || p.head_dim != kDqPartialsHeadDim) return int(cudaErrorInvalidValue);
  const int64_t rows = int64_t(p.total_tokens) * p.q_heads;
  const int64_t per_block = int64_t(kWarpsPerBlock) * kRowsPerWarp<kDqPartialsHeadDim>;
  const auto s = static_cast<cudaStream_t>(stream);
  kernel<<<unsigned((rows + per_block - 1) / per_block), kWarpsPerBlock * 32, 0, s>>>(p);
  return int(cudaGetLastError());
}

}  // namespace

int launch_backward_prep(const BackwardParams& p, void* stream) {
  return launch_over_rows(p, stream, backward_prep_kernel<kDqPartialsHeadDim>);
}

int launch_backward_dq_finish(const BackwardParams& p, void* stream) {
  return launch_over_rows(p, stream, backward_dq_finish_kernel<kDqPartialsHeadDim>);
}

}  // namespace flamia::cuda::sm90
