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

// acc_row(r) += tile_row(r) * factor[r]
template <int N>
__device__ __forceinline__ void add_scaled_rows(float (&acc)[N], const float (&tile)[N], const float (&factor)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] += tile[i] * factor[(i >> 1) & 1];
}

// acc_row(r) *= factor[r]
template <int N>
__device__ __forceinline__ void scale_rows(float (&acc)[N], const float (&factor)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] *= factor[(i >> 1) & 1];
}

// Writes row r of the accumulator, times `factor`, as BF16 to out[0 .. 4N/2) (this lane's columns).
template <int N>
__device__ __forceinline__ void store_row_bf16(const float (&acc)[N], int r, float factor, __nv_bfloat16* out, int t) {
#pragma unroll
  for (int n = 0; n < N / 4; ++n) {
    const __nv_bfloat162 v2 = __floats2bfloat162_rn(acc[4 * n + 2 * r] * factor, acc[4 * n + 2 * r + 1] * factor);
    *reinterpret_cast<__nv_bfloat162*>(out + n * 8 + 2 * t) = v2;
  }
}

}  // namespace flamia::cuda::sm90
