// An inclusive scan of one value per thread across a block, in thread order: a shuffle scan within
// each warp, then one warp scans the warp totals. The one-CTA passes that walk a sequence in chunks
// of the block (the V fold reference's running max, the work order's cost counts) use it, each
// carrying its own total from chunk to chunk.
#pragma once

namespace flamia::cuda {

// op: associative (max, +), with identity as its neutral value. warp_totals: kThreads / 32 shared
// slots. Every thread of the block calls; the block is synchronized twice inside, and the caller
// must synchronize again before the next call reuses warp_totals.
template <int kThreads, class T, class Op>
__device__ __forceinline__ T block_inclusive_scan(T v, T identity, Op op, T* warp_totals) {
  static_assert(kThreads % 32 == 0 && kThreads / 32 <= 32, "one warp scans the warp totals");
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {  // within the warp
    const T up = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v = op(v, up);
  }
  if (lane == 31) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {  // the warp totals, turned exclusive in place
    T t = lane < kThreads / 32 ? warp_totals[lane] : identity;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const T up = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t = op(t, up);
    }
    const T before = __shfl_up_sync(0xffffffffu, t, 1);
    if (lane < kThreads / 32) warp_totals[lane] = lane == 0 ? identity : before;
  }
  __syncthreads();
  return op(v, warp_totals[warp]);
}

}  // namespace flamia::cuda
