// Element-wise helpers shared by the Hopper attention kernels (forward and backward): exact powers
// of two from UE8M0 scale codes, the NaN-propagating max, E4M3 packing (from cuda/fp8_convert.cuh,
// shared with the quantizer), and the key permutation
// that lets a wgmma accumulator become the register A operand of the next product without shuffles.
#pragma once

#include <cstdint>

#include "cuda/fp8_convert.cuh"
#include "formats/scales.h"

namespace flamia::cuda::sm90 {

__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }

inline constexpr int kNaNExponent = 1 << 20;  // stands for the UE8M0 NaN code in exponent arithmetic

// 2^e, exact, for any integer e: 0 below the float range, +inf above it, NaN for the NaN marker.
__device__ __forceinline__ float pow2i(int e) {
  return e >= kNaNExponent / 2 ? __int_as_float(0x7fc00000) : exp2i_float(e);
}
__device__ __forceinline__ int scale_exponent(uint8_t code) {
  return formats::ue8m0_is_nan(code) ? kNaNExponent : formats::ue8m0_exponent(code);
}
__device__ __forceinline__ float pow2_of_scale(uint8_t code) { return pow2i(scale_exponent(code)); }
// a + b for scale exponents, where the NaN marker absorbs everything.
__device__ __forceinline__ int add_exponents(int a, int b) {
  return (a >= kNaNExponent / 2 || b >= kNaNExponent / 2) ? kNaNExponent : a + b;
}

using cuda::decode_e4m3;
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

// A wgmma m64nN accumulator holds, for lane (g, t) of warp w, columns 8nb + 2t + {0,1} of rows
// 16w + g and 16w + g + 8, at x[4 nb + {0,1}] and x[4 nb + {2,3}]. The register A operand of the
// next product (m64k32, contraction over those columns) wants positions 4t..4t+3 and 16+4t..16+4t+3
// of each 32-column step. The contraction is a sum, so instead of shuffling we permute the columns
// of the step: A position kappa = 16h + 4t' + e holds column 16h + 8(e/2) + 2t' + e%2, and the B
// operand is staged in shared memory with the same permutation (kappa_of_key).
__host__ __device__ constexpr int permuted_key(int kappa) {
  const int half = kappa >> 4, w = kappa & 15, t = w >> 2, e = w & 3;
  return half * 16 + (e >> 1) * 8 + 2 * t + (e & 1);
}
// Inverse of permuted_key within a 32-column step: the A position that holds `key`.
__host__ __device__ constexpr int kappa_of_key(int key) {
  const int half = key >> 4, r = key & 15, e = ((r >> 3) << 1) | (r & 1), t = (r & 7) >> 1;
  return half * 16 + 4 * t + e;
}
// The position of column `c` (any column of the tile) in the permuted B-operand staging.
__host__ __device__ constexpr int permuted_position(int c) { return (c & ~31) + kappa_of_key(c & 31); }
static_assert(permuted_key(kappa_of_key(13)) == 13 && permuted_key(kappa_of_key(22)) == 22, "inverse permutation");

// Packs the 16 values of one 32-column step, x[b][e] = accumulator element 4 (4 kk + b) + e already
// transformed, into the A registers: {row g, kappa 4t..}, {row g+8, kappa 4t..}, {row g, kappa
// 16+4t..}, {row g+8, kappa 16+4t..}.
__device__ __forceinline__ void pack_a_step(const float (&x)[4][4], uint32_t (&a)[4]) {
  a[0] = pack_e4m3x2(x[0][0], x[0][1]) | (pack_e4m3x2(x[1][0], x[1][1]) << 16);
  a[1] = pack_e4m3x2(x[0][2], x[0][3]) | (pack_e4m3x2(x[1][2], x[1][3]) << 16);
  a[2] = pack_e4m3x2(x[2][0], x[2][1]) | (pack_e4m3x2(x[3][0], x[3][1]) << 16);
  a[3] = pack_e4m3x2(x[2][2], x[2][3]) | (pack_e4m3x2(x[3][2], x[3][3]) << 16);
}

}  // namespace flamia::cuda::sm90
