// Hopper warpgroup MMA (wgmma) for E4M3 operands: shared-memory descriptors and the few shapes the
// attention kernels use. FP8 wgmma reads both operands K-major (the contraction axis contiguous).
//
// Shared-memory layout of a tile of R rows x K bytes (K = 64 or 128), as TMA writes it (tma.cuh,
// tensor_map.h): rows one after the other, the 16-byte chunks of row r XOR-permuted by r % 8 over
// a K-byte span (kSwizzle64B / kSwizzle128B; the descriptor's layout type tells wgmma to undo it).
// An 8-row group is 8 K bytes (the stride byte offset); a tile is aligned to it (base offset 0).
// One k32 step is the next 32 bytes of the row: +32 bytes, the swizzle applies to the address.
#pragma once

#include <cstdint>

namespace flamia::cuda::sm90 {

// Row-group strides (SBO) of the two tile forms the kernels use: rows form (rows = tokens, K = the
// D features of a head) and transposed form (rows = features, K = kTokens tokens).
template <int D>
inline constexpr int kRowsFormStride = 8 * D;
template <int kTokens>
inline constexpr int kTransposedFormStride = 8 * kTokens;

enum class SmemLayout { kSwizzle64B, kSwizzle128B };
// The layout of a tile with K-byte rows (64 or 128).
template <int kRowBytes>
inline constexpr SmemLayout kSwizzleFor = kRowBytes == 128 ? SmemLayout::kSwizzle128B : SmemLayout::kSwizzle64B;
// Bytes to the next k32 step of a row.
inline constexpr int kStepAdvance = 32;

// A K-major tile's descriptor, as two words. The low word holds the start address >> 4 (bits 0-13;
// shared addresses stay below 2^18, so adding a k-step's kStepAdvance >> 4 never carries out of it)
// and the leading byte offset (bits 16-29), unused by the swizzled K-major layouts (a step never
// leaves a row's span). The high word holds the row-group stride (SBO, bits 32-45), the base offset
// 0 and the layout type (bits 62-63: 1 128-byte swizzle, 2 64-byte swizzle): constants.
__device__ __forceinline__ uint32_t descriptor_low(uint32_t addr) {
  constexpr uint32_t kUnusedLeadingOffset = 128 >> 4;
  return ((addr & 0x3FFFF) >> 4) | (kUnusedLeadingOffset << 16);
}
template <SmemLayout L, int kRowGroupStride>
inline constexpr uint32_t kDescriptorHigh =
    uint32_t((kRowGroupStride & 0x3FFFF) >> 4) | (uint32_t(L == SmemLayout::kSwizzle128B ? 1 : 2) << 30);
// The descriptor of k-step ks of the tile whose low word is tile_low: one add per step.
template <SmemLayout L, int kRowGroupStride>
__device__ __forceinline__ uint64_t step_descriptor(uint32_t tile_low, int ks) {
  return (uint64_t(kDescriptorHigh<L, kRowGroupStride>) << 32) | (tile_low + uint32_t(ks * (kStepAdvance >> 4)));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending of this warpgroup's committed groups are still running (groups
// complete in the order they were committed).
template <int kPending>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory"); }
// wgmma writes its accumulators asynchronously, but the compiler sees them written when the
// instruction is issued. After wgmma_wait, this pins every accumulator register so that no
// read of it can be scheduled before the wait.
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D (64 x 128, FP32) {=, +=} A (64 x 32, smem) . B (128 x 32, smem)^T, E4M3 inputs.
__device__ __forceinline__ void wgmma_m64n128k32_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

// D (64 x 128, FP32) += A (64 x 32, registers) . B (128 x 32, smem)^T, E4M3 inputs.
__device__ __forceinline__ void wgmma_m64n128k32_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// D (64 x 64, FP32) += A (64 x 32, registers) . B (64 x 32, smem)^T, E4M3 inputs.
__device__ __forceinline__ void wgmma_m64n64k32_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// D (64 x 64, FP32) {=, +=} A (64 x 32, smem) . B (64 x 32, smem)^T, E4M3 inputs.
__device__ __forceinline__ void wgmma_m64n64k32_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

// D (64 x N) += A (64 x 32, registers) . B (N x 32, smem)^T for N = D_HEAD in {64, 128}: the
// products whose output columns are the head's features.
template <int N>
__device__ __forceinline__ void wgmma_m64nNk32_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(N == 64 || N == 128, "head dims 64 and 128");
  if constexpr (N == 128) wgmma_m64n128k32_rs(d, a, desc_b);
  else wgmma_m64n64k32_rs(d, a, desc_b);
}

// The two products of the attention kernels over whole shared-memory tiles (issued, not waited for):
//  - rows_product:     acc = A . B^T, A (64 rows) and B (N rows) rows-form tiles of D-byte rows, over
//                      D/32 k-steps (S = Q.K^T, E = dO.V^T and their transposes);
//  - register_product: acc += A . B^T, A in registers (kTokens/32 k-steps packed from an
//                      accumulator), B a transposed-form tile of kTokens tokens (P.V, U.K, P^T.dO,
//                      U^T.Q).
// The shared address of a tile, opaque to the compiler: descriptors are rebuilt from it at each
// product (a few uniform-datapath instructions) instead of being hoisted out of the caller's tile
// loop and held in registers across it (which spilled the backward's accumulators).
__device__ __forceinline__ uint32_t tile_address(const void* tile) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  asm volatile("" : "+r"(addr));
  return addr;
}

// Both tiles of a product share one shared-memory layout L.
template <int D, int N, SmemLayout L>
__device__ __forceinline__ void rows_product(float (&acc)[N / 2], const uint8_t* a, const uint8_t* b) {
  static_assert(N == 64 || N == 128, "S tiles of 64 or 128 columns");
  const uint32_t a_low = descriptor_low(tile_address(a)), b_low = descriptor_low(tile_address(b));
#pragma unroll
  for (int ks = 0; ks < D / 32; ++ks) {
    const uint64_t desc_a = step_descriptor<L, kRowsFormStride<D>>(a_low, ks);
    const uint64_t desc_b = step_descriptor<L, kRowsFormStride<D>>(b_low, ks);
    if constexpr (N == 128) wgmma_m64n128k32_ss(acc, desc_a, desc_b, ks > 0);
    else wgmma_m64n64k32_ss(acc, desc_a, desc_b, ks > 0);
  }
}
// The backward's two score products, S = A_s . B_s^T and E = A_e . B_e^T (rows_product), committed
// as one group in the consumer's turn (Turns: tma.cuh's ConsumerTurns) and waited for.
template <int D, int N, SmemLayout L, class Turns>
__device__ __forceinline__ void score_products(float (&s)[N / 2], const uint8_t* s_a, const uint8_t* s_b,
                                               float (&e)[N / 2], const uint8_t* e_a, const uint8_t* e_b,
                                               const Turns& turns) {
  turns.begin();
  wgmma_fence();
  rows_product<D, N, L>(s, s_a, s_b);
  rows_product<D, N, L>(e, e_a, e_b);
  wgmma_commit();
  turns.end();
  wgmma_wait<0>();
  fence_accumulators(s);
  fence_accumulators(e);
}
template <int N, int kTokens, SmemLayout L>
__device__ __forceinline__ void register_product(float (&acc)[N / 2], const uint32_t (&a)[kTokens / 32][4],
                                                 const uint8_t* bt) {
  const uint32_t bt_low = descriptor_low(tile_address(bt));
#pragma unroll
  for (int kk = 0; kk < kTokens / 32; ++kk)
    wgmma_m64nNk32_rs<N>(acc, a[kk], step_descriptor<L, kTransposedFormStride<kTokens>>(bt_low, kk));
}

}  // namespace flamia::cuda::sm90
