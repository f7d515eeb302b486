// Staging E4M3 code tiles from global memory into the no-swizzle core-matrix layout of wgmma.cuh.
// A tile is kRows consecutive tokens of one head (a [T, H, D] code tensor, row pitch H * D bytes),
// written in one or both of the two forms the products need:
//  - as rows:       tile rows = tokens, K = the D features (operands that contract over features);
//  - transposed:    tile rows = the D features, K = the tokens, in permuted_position order (operands
//                   that contract over tokens and meet an accumulator-born register A operand).
// Tokens at or past `valid` are staged as zeros. Plain 16-byte loads, every thread of the CTA
// takes part; the caller fences (fence_smem_for_async_proxy) and synchronizes before the MMAs.
#pragma once

#include <cstdint>

#include "cuda/sm90/fp8_math.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flamia::cuda::sm90 {

// Row-group strides (SBO) of the two forms.
template <int D>
inline constexpr int kRowsFormStride = 8 * D;
template <int kRows>
inline constexpr int kTransposedFormStride = 8 * kRows;

// kThreads: the CTA's thread count (blockDim.x must equal it). Each thread issues all of its loads
// before its first store, so they are in flight together: with one load per loop iteration the
// staging latency of a tile is the sum of its loads' latencies (~10% of the forward kernel's time).
template <int D, int kRows, int kThreads>
__device__ __forceinline__ void stage_code_tile(const uint8_t* first_row, int64_t row_pitch, int valid, uint8_t* rows_form,
                                                uint8_t* transposed_form) {
  constexpr int kChunks = D / 16;
  static_assert(kRows * kChunks % kThreads == 0, "the tile's 16-byte chunks divide evenly over the CTA");
  constexpr int kPerThread = kRows * kChunks / kThreads;
  // A warp takes 32 tokens of one 16-feature chunk: its transposed byte stores spread over the
  // banks of one 32-token step instead of piling onto one bank per feature group.
  uint4 v[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int c = int(threadIdx.x) + k * kThreads, row = c % kRows, chunk = c / kRows;
    v[k] = row < valid ? *reinterpret_cast<const uint4*>(first_row + row * row_pitch + chunk * 16) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int c = int(threadIdx.x) + k * kThreads, row = c % kRows, chunk = c / kRows;
    if (rows_form) *reinterpret_cast<uint4*>(rows_form + core_matrix_offset(row, chunk * 16, kRowsFormStride<D>)) = v[k];
    if (transposed_form) {
      const int kappa = permuted_position(row);
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&v[k]);
#pragma unroll
      for (int j = 0; j < 16; ++j)
        transposed_form[core_matrix_offset(chunk * 16 + j, kappa, kTransposedFormStride<kRows>)] = bytes[j];
    }
  }
}

}  // namespace flamia::cuda::sm90
