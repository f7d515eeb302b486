// The backward's row term D_i = 2^eg_i * sum_f cg_if * O_if (docs/NUMERICS.md: dO's codes cg_i and
// exponent eg_i, the saved BF16 forward output O), summed in one fixed order by every kernel that
// forms it, so that D_i is the same float wherever it comes from: a row (token, query head) lies on
// D / 8 consecutive lanes, each lane adds its 8 products in feature order (an 8-byte word pair of
// codes, a 16-byte load of O), then a butterfly adds the row's lanes. The dO quantizer forms D_i
// beside the codes (deterministic dQ); the backward prep pass forms it with the FP16 partials'
// row factors.
#pragma once

#include <cstdint>

#include "cuda/fp8_convert.cuh"

namespace flamia::cuda::gradient_row_dot {

inline constexpr int kFeaturesPerLane = 8;  // 8 codes (two words) and 8 BF16 values of O (16 bytes)

// Adds the lane's products cg_f * O_f for its features f0 .. f0 + 7 to sum, in that order (codes.x
// holds f0 .. f0 + 3, low byte first; o the 8 BF16 values, low half first), and with kSquares the
// squares cg_f^2 to squares.
template <bool kSquares>
__device__ __forceinline__ void add_lane_products(uint2 codes, uint4 o, float& sum, float& squares) {
  const uint32_t o_words[4] = {o.x, o.y, o.z, o.w}, code_words[2] = {codes.x, codes.y};
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // features f0 + 2k, f0 + 2k + 1
    const float2 g = decode_e4m3x2(uint16_t(code_words[k / 2] >> (16 * (k % 2))));
    sum = fmaf(g.x, __uint_as_float(o_words[k] << 16), sum);
    sum = fmaf(g.y, __uint_as_float(o_words[k] & 0xFFFF0000u), sum);
    if constexpr (kSquares) {
      squares = fmaf(g.x, g.x, squares);
      squares = fmaf(g.y, g.y, squares);
    }
  }
}

// The sum of x over the row's `lanes` lanes (a power of two up to 32; rows are aligned to it within
// the warp) by a butterfly, in every lane of the row. Every lane of the warp must call it. (The loop
// has a fixed trip count, so that a run-time `lanes` costs a predicate per step, not a loop.)
__device__ __forceinline__ float row_sum(float x, int lanes) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1)
    if (m < lanes) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// D_i from the row's sum and dO's scale code for the row.
__device__ __forceinline__ float row_delta(float row_products, uint8_t g_scale) {
  return row_products * pow2_of_scale(g_scale);
}

}  // namespace flamia::cuda::gradient_row_dot
