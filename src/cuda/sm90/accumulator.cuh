// Row-wise operations on a wgmma m64nN FP32 accumulator (N / 2 floats per thread). Lane (g, t) of
// warp w holds columns 8n + 2t + {0, 1} of row 16w + g at x[4n + {0, 1}] and of row 16w + g + 8 at
// x[4n + {2, 3}]; "row r" below is 0 for the first of those rows and 1 for the second.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace flamia::cuda::sm90 {

template <int N>
__device__ __forceinline__ void zero(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = 0.f;
}

// acc_row(r)[kFirst + i] += tile_row(r)[i] * factor[r]: the whole row, or (kFirst > 0 or a shorter
// tile) a part of its columns (kFirst: a multiple of 4 floats, i.e. of n8 blocks).
template <int kFirst = 0, int N, int M>
__device__ __forceinline__ void add_scaled_rows(float (&acc)[N], const float (&tile)[M], const float (&factor)[2]) {
  static_assert(kFirst % 4 == 0 && kFirst + M <= N && M % 4 == 0, "whole n8 blocks");
#pragma unroll
  for (int i = 0; i < M; ++i) acc[kFirst + i] += tile[i] * factor[(i >> 1) & 1];
}

// acc_row(r) *= factor[r]
template <int N>
__device__ __forceinline__ void scale_rows(float (&acc)[N], const float (&factor)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] *= factor[(i >> 1) & 1];
}

// A 4 x 4 transpose of 32-bit words across the lanes of a quad (lane t = 0..3 of its row): lane t's
// w[j] becomes lane j's w[t]. Two butterflies: the off-diagonal 2 x 2 blocks swap (lanes t, t ^ 2),
// then the corners of each block (lanes t, t ^ 1). Every lane of the warp must take part.
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int t) {
#pragma unroll
  for (int m = 2; m >= 1; m >>= 1) {
    const bool upper = t & m;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j & m) continue;  // the pair (j, j | m): the lower lane sends w[j | m], the upper w[j]
      const uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? w[j] : w[j | m], m);
      if (upper) w[j] = got;
      else w[j | m] = got;
    }
  }
}

// Writes row r of the accumulator, times `factor`, as BF16 to out[0 .. 4N/2) where `in_range`
// (uniform over a quad; every lane must call it, for the exchange). A quad's lanes hold 16 bytes of
// each n8 block between them; after quad_transpose each holds one whole block of four, so a store
// instruction writes 64 contiguous bytes of each of its 8 rows instead of 16: a quarter of the
// instructions and of the partial-sector writes (the per-row 4-byte stores took a forward's item
// ~2,600 cycles at 16x4096).
template <int N>
__device__ __forceinline__ void store_row_bf16(const float (&acc)[N], int r, float factor, __nv_bfloat16* out, int t,
                                               bool in_range) {
  constexpr int kBlocks = N / 4;  // n8 blocks of the row
  static_assert(kBlocks % 4 == 0, "the row's blocks go out four at a time");
#pragma unroll
  for (int k = 0; k < kBlocks / 4; ++k) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = 4 * k + j;
      const __nv_bfloat162 v2 = __floats2bfloat162_rn(acc[4 * n + 2 * r] * factor, acc[4 * n + 2 * r + 1] * factor);
      w[j] = *reinterpret_cast<const uint32_t*>(&v2);
    }
    quad_transpose(w, t);
    if (in_range) *reinterpret_cast<uint4*>(out + (4 * k + t) * 8) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

}  // namespace flamia::cuda::sm90
