// The device side of dQ by boosted FP16 partials (core/dq_partials.h) in the dK dV kernel: U~ from
// the dK dV step's accumulator layout into the dQ product's shared tile, and the FP16 partial out
// to dQ's accumulator by a TMA reduce-add.
//
// The dK dV step holds U^T: a consumer thread (g, t) of warp w has keys 16w + g and 16w + g + 8 (its
// rows) at queries 8n + 2t, 8n + 2t + 1 of each n8 block n. dQ = U~ . K contracts over keys, and
// FP8 wgmma reads both operands K-major, so U~ goes to shared memory with the queries as rows and
// the keys contiguous, in the key permutation of K^T's layout (core/operand_layout.h: a 16-key
// half holds keys 0, 1, 8, 9, 2, 3, 10, 11, ...). One byte exchange with the partner lane (g ^ 1)
// makes each 16-bit half of a lane's word two such adjacent keys of one query; a transposing
// stmatrix then writes every query row's 16 keys of the warp as one 16-byte chunk.
#pragma once

#include <cuda.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/sm90/tma.cuh"

namespace flamia::cuda::sm90::dq_partials {

inline constexpr int kRowBytes = 128;  // a U~ row (128 keys) and an FP16 partial row (64 features)

// Shared-memory writes by this thread become visible to the async proxy (wgmma, TMA).
__device__ __forceinline__ void fence_shared_for_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The byte address of 16-byte chunk `chunk` of row `row` in a tile of 128-byte rows with the
// 128-byte swizzle (wgmma.cuh, tensor_map.h: chunk c of row r sits at chunk c ^ (r % 8)).
__device__ __forceinline__ uint32_t swizzled_chunk(uint32_t tile, int row, int chunk) {
  return tile + uint32_t(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Writes a warp's U~ codes into the step's U~ tile (kQueries rows of 128 keys): words[n] holds the
// lane's four codes of n8 query block n, bytes {key g, query 2t}, {g, 2t + 1}, {g + 8, 2t},
// {g + 8, 2t + 1}; key_chunk = the warp's 16 keys / 16 (its place among the tile's 128 keys).
template <int kQueries>
__device__ __forceinline__ void store_u_transposed(uint32_t tile, const uint32_t (&words)[kQueries / 8], int key_chunk,
                                                   int lane) {
  static_assert(kQueries % 32 == 0, "stmatrix x4 writes four n8 query blocks");
  const int g = lane / 4;
  uint32_t pairs[kQueries / 8];
#pragma unroll
  for (int n = 0; n < kQueries / 8; ++n) {
    // Lane g (even) takes keys g, g + 1 = its row-0 bytes and the partner's; lane g + 1 keys g + 8,
    // g + 9 = the partner's row-1 bytes and its own. Each 16-bit half: (key a, query q), (a + 1, q).
    const uint32_t partner = __shfl_xor_sync(0xffffffffu, words[n], 4);
    pairs[n] = __byte_perm(words[n], partner, (g & 1) ? 0x3726 : 0x5140);
  }
  // Matrix i of stmatrix k is n8 block 4k + i: its row j (query 8(4k + i) + j) comes from lane 8i + j.
  const int i = lane / 8, j = lane % 8;
#pragma unroll
  for (int k = 0; k < kQueries / 32; ++k)
    stmatrix_x4_trans(swizzled_chunk(tile, 8 * (4 * k + i) + j, key_chunk), pairs[4 * k], pairs[4 * k + 1],
                      pairs[4 * k + 2], pairs[4 * k + 3]);
}

// Writes a warp's rows of an m64n64 FP32 accumulator as FP16 into a tile of 64 rows x 64 features
// (128-byte rows, 128-byte swizzle, as TMA reads it): row r (0: 16w + g, 1: + 8) times factor[r].
__device__ __forceinline__ void store_partial_fp16(uint32_t tile, const float (&acc)[32], const float (&factor)[2],
                                                   int warp_in_group, int lane) {
  uint32_t h[8][2];  // [n8 block][row]
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const __half2 v = __floats2half2_rn(acc[4 * n + 2 * r] * factor[r], acc[4 * n + 2 * r + 1] * factor[r]);
      h[n][r] = *reinterpret_cast<const uint32_t*>(&v);
    }
  // stmatrix k writes blocks 2k, 2k + 1, rows 0 and 1: matrix i = (block 2k + i / 2, row i % 2), its
  // row j (tile row 16w + 8 (i % 2) + j, chunk = the block) from lane 8i + j.
  const int i = lane / 8, j = lane % 8;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    stmatrix_x4(swizzled_chunk(tile, 16 * warp_in_group + 8 * (i & 1) + j, 2 * k + (i >> 1)), h[2 * k][0], h[2 * k][1],
                h[2 * k + 1][0], h[2 * k + 1][1]);
}

// Adds the FP16 tile at smem (the tensor map's box) into the tensor at {c0, c1, c2} (innermost
// first); asynchronous, in this thread's bulk group.
__device__ __forceinline__ void tma_reduce_add(const CUtensorMap& map, uint32_t smem, int c0, int c1, int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(&map)),
      "r"(smem), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's bulk groups still read their shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Waits until all of this thread's bulk groups are complete (their writes done).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

}  // namespace flamia::cuda::sm90::dq_partials
