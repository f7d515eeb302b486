// Copying E4M3 code tiles from global memory into the no-swizzle core-matrix layout of wgmma.cuh
// with cp.async: tiles whose global rows already are the shared-memory rows, either
//  - rows form:       tile rows = tokens, K = the D features ([T, H, D] codes; operands that
//                     contract over features), or
//  - transposed form: tile rows = the D features, K = the tokens, permuted (the quantizer's
//                     transposed layout, core/operand_layout.h; operands that contract over tokens
//                     and meet an accumulator-born register A operand).
#pragma once

#include <cstdint>

#include "cuda/sm90/wgmma.cuh"

namespace flamia::cuda::sm90 {

// Copies a kRows x kRowBytes tile (row r at first_row + r * row_pitch, 16-byte aligned) into the
// core-matrix layout with row-group stride kRowBytes * 8, as 16-byte cp.async copies by the CTA's
// kThreads threads. A chunk (row r, bytes 16c..16c+15) is copied when r < valid_rows and
// 16c < valid_bytes, else zero-filled without reading global memory; so a chunk that starts inside
// the valid region is read whole. Eight consecutive threads fill one 128-byte core matrix (8 rows,
// 16 bytes each), so the shared-memory stores are conflict-free and a warp reads 64 contiguous
// bytes from each of 8 rows. The caller commits, waits (cp_async_wait_all), fences and syncs.
template <int kRows, int kRowBytes, int kThreads>
__device__ __forceinline__ void copy_tile_async(const uint8_t* first_row, int64_t row_pitch, int valid_rows,
                                                int valid_bytes, uint8_t* tile) {
  constexpr int kChunks = kRowBytes / 16;
  static_assert(kRowBytes % 16 == 0 && kThreads % (8 * kChunks) == 0 && kRows % (kThreads / kChunks) == 0,
                "each round of the CTA's threads copies whole 8-row groups");
  constexpr int kRowsPerRound = kThreads / kChunks;
  // This thread's first chunk; every round moves it kRowsPerRound rows down. The address arithmetic
  // is loop-invariant in a caller's loop, and the compiler would hoist it out and hold it in
  // registers across the whole loop (two per round and tile, spilled at D = 128): the empty asm
  // makes the pitch opaque, so it is recomputed here, where it costs a few integer instructions.
  asm volatile("" : "+l"(row_pitch));
  const int row0 = int(threadIdx.x) / (8 * kChunks) * 8 + int(threadIdx.x) % 8, chunk = int(threadIdx.x) / 8 % kChunks;
  const uint8_t* src = first_row + row0 * row_pitch + chunk * 16;
  const int64_t src_step = kRowsPerRound * row_pitch;
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(tile)) + core_matrix_offset(row0, chunk * 16, 8 * kRowBytes);
  const bool chunk_valid = chunk * 16 < valid_bytes;
#pragma unroll
  for (int k = 0; k < kRows / kRowsPerRound; ++k, src += src_step) {
    const bool valid = chunk_valid && row0 + k * kRowsPerRound < valid_rows;
    const uint32_t dst_k = dst + k * (kRowsPerRound / 8) * (8 * kRowBytes);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_k), "l"(valid ? src : first_row),
                 "r"(valid ? 16 : 0)
                 : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits for this thread's copies; other threads' copies are visible after a barrier.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

}  // namespace flamia::cuda::sm90
