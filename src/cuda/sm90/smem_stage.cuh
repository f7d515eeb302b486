// Staging E4M3 code tiles from global memory into the no-swizzle core-matrix layout of wgmma.cuh.
//
// copy_tile_async: a tile whose global rows already are the shared-memory rows (16-byte chunks
// copied as they are, cp.async, no registers): Q and K rows of [T, H, D] codes, or rows of a
// transposed code layout (core/operand_layout.h) whose keys are already permuted.
//
// stage_code_tile (synchronous, through registers): a tile of kRows consecutive tokens of one head
// (a [T, H, D] code tensor, row pitch H * D bytes), written in one or both of the two forms the
// products need:
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
