// Element-wise helpers shared by the Hopper attention kernels (forward and backward): exact powers
// of two from UE8M0 scale codes, the NaN-propagating max, E4M3 packing (from cuda/fp8_convert.cuh,
// shared with the quantizer), and packing an accumulator's 32-column step into the register A
// operand of the next product (the key permutation of core/operand_layout.h: no shuffles).
#pragma once

#include <cstdint>

#include "cuda/fp8_convert.cuh"
#include "formats/scales.h"

namespace flamia::cuda::sm90 {

// max(a, b), NaN when either is NaN (the canonical NaN): one FMNMX.NAN (PTX max.NaN, sm_80+).
__device__ __forceinline__ float nan_max(float a, float b) {
  float y;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

// log2(e) and ln(2) as floats: the kernels take exponentials and the LSE in base 2.
inline constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

inline constexpr int kNaNExponent = 1 << 20;  // stands for the UE8M0 NaN code in exponent arithmetic

// 2^e, exact, for any integer e: 0 below the float range, +inf above it, NaN for the NaN marker.
__device__ __forceinline__ float pow2i(int e) {
  return e >= kNaNExponent / 2 ? __int_as_float(0x7fc00000) : exp2i_float(e);
}
__device__ __forceinline__ int scale_exponent(uint8_t code) {
  return formats::ue8m0_is_nan(code) ? kNaNExponent : formats::ue8m0_exponent(code);
}
// 2^e and 2^-e of a UE8M0 scale code (cuda/fp8_convert.cuh) are exactly pow2i(+-scale_exponent(code)).
using cuda::inv_pow2_of_scale;
using cuda::pow2_of_scale;
// a + b for scale exponents, where the NaN marker absorbs everything.
__device__ __forceinline__ int add_exponents(int a, int b) {
  return (a >= kNaNExponent / 2 || b >= kNaNExponent / 2) ? kNaNExponent : a + b;
}

// 2^x as the bare MUFU instruction (exp2f adds subnormal handling around it), for the softmax
// exponentials of the lean interior paths. Each caller states why flushing results below 2^-126 to
// 0 cannot change what it keeps.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

using cuda::decode_e4m3x2;
using cuda::pack_e4m3x2;

// Sum / max over the 4 lanes (t = 0..3) that share an accumulator row.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}
__device__ __forceinline__ float quad_nan_max(float x) {
  x = nan_max(x, __shfl_xor_sync(0xffffffff, x, 1));
  return nan_max(x, __shfl_xor_sync(0xffffffff, x, 2));
}

// Packs the 16 values of one 32-column step, x[b][e] = accumulator element 4 (4 kk + b) + e already
// transformed, into the A registers: {row g, kappa 4t..}, {row g+8, kappa 4t..}, {row g, kappa
// 16+4t..}, {row g+8, kappa 16+4t..}.
__device__ __forceinline__ void pack_a_step(const float (&x)[4][4], uint32_t (&a)[4]) {
  a[0] = pack_e4m3x2(x[0][0], x[0][1]) | (pack_e4m3x2(x[1][0], x[1][1]) << 16);
  a[1] = pack_e4m3x2(x[0][2], x[0][3]) | (pack_e4m3x2(x[1][2], x[1][3]) << 16);
  a[2] = pack_e4m3x2(x[2][0], x[2][1]) | (pack_e4m3x2(x[3][0], x[3][1]) << 16);
  a[3] = pack_e4m3x2(x[2][2], x[2][3]) | (pack_e4m3x2(x[3][2], x[3][3]) << 16);
}

// Packs a whole m64nN accumulator (kCols columns, values already transformed) into the register A
// operand of the next product, one k32 step per 32 columns.
template <int kCols>
__device__ __forceinline__ void pack_a_operand(const float (&x)[kCols / 2], uint32_t (&a)[kCols / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < kCols / 32; ++kk) pack_a_step(*reinterpret_cast<const float(*)[4][4]>(x + 16 * kk), a[kk]);
}

// The row scales of the backward's dS operands (sigma_i in dQ, tau_j in dK): the ceil UE8M0 scale
// of each accumulator row's max |.| (a per-lane max, reduced here over the row's quad), as 2^s
// (applied after the product) and 2^-s (applied before rounding to E4M3), both NaN for a NaN max
// (formats::ceil_scale_powers: without branches).
struct RowScales {
  float pow[2], inv[2];
};
__device__ __forceinline__ RowScales ceil_row_scales(const float (&lane_amax)[2]) {
  RowScales rs;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const formats::ScalePowers powers = formats::ceil_scale_powers(quad_nan_max(lane_amax[r]));
    rs.pow[r] = powers.pow;
    rs.inv[r] = powers.inv;
  }
  return rs;
}

// pack_a_operand of x with row r divided by its scale (times inv[r], exact: a power of two).
template <int kCols>
__device__ __forceinline__ void pack_a_operand_scaled(const float (&x)[kCols / 2], const float (&inv)[2],
                                                      uint32_t (&a)[kCols / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < kCols / 32; ++kk) {
    float scaled[4][4];
#pragma unroll
    for (int b = 0; b < 4; ++b)
#pragma unroll
      for (int el = 0; el < 4; ++el) scaled[b][el] = x[(kk * 4 + b) * 4 + el] * inv[el >> 1];
    pack_a_step(scaled, a[kk]);
  }
}

}  // namespace flamia::cuda::sm90
