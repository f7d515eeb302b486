// dQ by boosted FP16 partials: the per-row factors of the non-deterministic backward, shared by the
// CPU emulation (the spec) and the GPU kernels, which must agree on them bit for bit.
//
// The deterministic backward rebuilds S and E a second time in a dQ pass of its own (seven
// GEMM-sized products). The FP16-partials backward computes dQ inside the dK dV pass (five
// products): each (128-key tile, query tile) step forms its partial
//   dQ_i,tile = 2^sigma_i sum_{j in tile} E4M3(U_ij 2^(ek_j - sigma_i)) ck_j
// and adds FP16(2^beta_i dQ_i,tile) into an FP16 accumulator of dQ; a last pass writes
// dQ_i = scale 2^-beta_i acc_i as BF16. Both sigma_i and beta_i must be known before the pass,
// because the two consumer warpgroups that share a query row never exchange a row max. They come
// from bounds that see only the row and its prefix (so they never read the future):
//   r_i     = |G^_i| 2^(ev_max_i + code_norm_log2(D)) + |D_i|   >= max_j |E_ij - D_i|
//   sigma_i = the ceil UE8M0 scale of p_max_i r_i 2^ek_max_i     >= max_j |U_ij 2^ek_j| / 448
//   beta_i  = kAccumulatorLog2 - (kPartialCodeLog2 + ek_max_i + ceil_log2(r_i))
// with p_max_i = 1 / l_i the row's largest probability (saved by the forward), ek_max_i and ev_max_i
// the largest K and V scale exponents over the keys j <= i of the row's document and KV head, and
// |G^_i| the norm of the reconstructed dO row. |dQ_i| <= sum_j |U~_ij| |K_j| <= 2 r_i 2^ek_max_i 448
// (rounding at most doubles a subnormal E4M3 code), so every partial sum of the accumulator stays
// below 2^kAccumulatorLog2 < 65504: no FP16 overflow, whatever the inputs' range.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/host_device.h"
#include "formats/scales.h"

namespace flamia::dq_partials {

// The accumulator's bound, 2^15 (FP16's largest finite value is 65504 < 2^16): room for the
// rounding of up to thousands of FP16 additions above it.
inline constexpr int kAccumulatorLog2 = 15;
// log2 of 2 x 448 rounded up: a rounded U code times a K code, over the bound r 2^ek_max.
inline constexpr int kPartialCodeLog2 = 10;
// Boosts are clamped to this range (they are stored as int8); inputs that would need more lose
// precision to FP16 subnormals but never overflow.
inline constexpr int kMaxBoost = 120;

// ceil(log2(448 sqrt(D))): |cv_j| <= 2^code_norm_log2(D) for any E4M3 code row of D features.
FLAMIA_HD constexpr int code_norm_log2(int head_dim) {
  int c = 0;
  while ((int64_t(1) << (2 * c)) < int64_t(448) * 448 * head_dim) ++c;
  return c;
}
static_assert(code_norm_log2(128) == 13 && code_norm_log2(64) == 12, "448 sqrt(D) <= 2^c");

// ceil(log2 x) for a finite x > 0 (normal or subnormal float), from its bits.
FLAMIA_HD int ceil_log2(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  int biased = int(bits >> 23) & 0xff;
  uint32_t mantissa = bits & 0x7fffffu;
  if (biased == 0) {  // subnormal: x = mantissa 2^-149
    int e = -149, m = int(mantissa);
    int top = 0;
    while ((m >> (top + 1)) != 0) ++top;  // floor(log2 mantissa)
    return e + top + ((m & ((1 << top) - 1)) != 0 ? 1 : 0);
  }
  return biased - 127 + (mantissa != 0 ? 1 : 0);
}

// What a row's factors are computed from.
struct RowInputs {
  float code_norm;  // |cg_i| = sqrt(sum_f cg_if^2), the dO row's codes (its scale is eg)
  int eg;           // dO's scale exponent of the row (formats' NaN scale: pass nan_scale = true)
  float delta;      // D_i
  float p_max;      // the row's largest probability, 1 / l_i, from the forward
  int ek_max, ev_max;  // the largest K and V scale exponents over the keys j <= i
  bool nan_scale;      // some input scale of the row is NaN (dO's, or a K or V scale up to i)
};
struct RowFactors {
  uint8_t sigma;  // UE8M0 code of U's row scale for dQ (kUe8m0NaN: the row's dQ is NaN)
  int8_t beta;    // the FP16 accumulator's boost exponent
};

FLAMIA_HD RowFactors row_factors(const RowInputs& in, int head_dim) {
  if (in.nan_scale || std::isnan(in.delta) || std::isnan(in.p_max) || std::isnan(in.code_norm))
    return {formats::kUe8m0NaN, 0};
  // r = |cg| 2^(eg + ev_max + c) + |D| = 2^a (|cg| + |D| 2^-a): the sum at a scale where neither
  // term overflows for any finite scales.
  const int a = in.eg + in.ev_max + code_norm_log2(head_dim);
  const float t = in.code_norm + std::ldexp(std::fabs(in.delta), -a);
  if (!(t > 0.f)) return {formats::encode_ue8m0(formats::kMinScaleExponent), 0};  // U and dQ are 0
  if (std::isinf(t)) return {formats::kUe8m0NaN, 0};
  const int r_log2 = ceil_log2(t) + a;
  // sigma: the ceil scale of p_max r 2^ek_max, formed as (p_max t) 2^(a + ek_max), the exponent
  // clamped where the float would leave its range (the UE8M0 code clamps to [-127, 127] anyway).
  int shift = a + in.ek_max;
  shift = shift < -200 ? -200 : shift > 200 ? 200 : shift;
  const float u_bound = std::ldexp(in.p_max * t, shift);
  const uint8_t sigma = std::isinf(u_bound) ? formats::encode_ue8m0(formats::kMaxScaleExponent)
                                            : formats::scale_for_float_amax(u_bound, formats::ScaleRule::kCeil);
  int beta = kAccumulatorLog2 - (kPartialCodeLog2 + in.ek_max + r_log2);
  beta = beta < -kMaxBoost ? -kMaxBoost : beta > kMaxBoost ? kMaxBoost : beta;
  return {sigma, int8_t(beta)};
}

}  // namespace flamia::dq_partials
