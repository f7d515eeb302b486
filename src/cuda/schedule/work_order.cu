// The work order's table (core/schedule.h), built by one CTA per call: a counting sort of every
// document's tiles by cost, largest first. Its four phases, each over the tile slots or the costs:
//   1. every entry idle, every cost counter 0;
//   2. counter[c] = the tiles of cost c (each slot's tile found by bisection over cu_seqlens);
//   3. counter[c] = the tiles that cost more than c: the first rank of cost c (a suffix sum);
//   4. each tile takes rank atomicAdd(counter[its cost], 1).
// No tile costs 0, so counter[0] ends as the number of tiles (phase 3's sum over every cost).
// A few microseconds (tiles and costs are counted in thousands); the attention kernels then find
// an item with one table load instead of a document search.
#include <cuda_runtime.h>

#include "cuda/block_scan.cuh"
#include "cuda/schedule/work_order.cuh"

namespace flamia::cuda {
namespace {

constexpr int kThreads = 1024;

// a[i] = the sum of a[j] for j > i, over a[0 .. n), by the whole block, in chunks of kThreads from
// the top (thread t of a chunk holds index top - 1 - t, so a scan in thread order is a descending
// one over the indices).
__device__ void exclusive_suffix_sum(int* a, int n) {
  __shared__ int warp_totals[kThreads / 32];
  __shared__ int chunk_total;
  const int t = int(threadIdx.x);
  const auto plus = [](int x, int y) { return x + y; };
  int carry = 0;  // the sum of the chunks above this one
  for (int top = n; top > 0; top -= kThreads) {
    const int i = top - 1 - t;
    const int x = i >= 0 ? a[i] : 0;
    const int inclusive = block_inclusive_scan<kThreads>(x, 0, plus, warp_totals) + carry;
    if (i >= 0) a[i] = inclusive - x;
    __syncthreads();  // every thread has read warp_totals; the last one now passes the total on
    if (t == kThreads - 1) chunk_total = inclusive;
    __syncthreads();
    carry = chunk_total;
  }
}

struct BuildArgs {
  const int32_t* cu_seqlens;
  int num_docs, total_tokens;
  bool causal;
  order::OrderedTile* table;
  int* counters;
  int64_t entries;
  int costs;
};

__global__ void __launch_bounds__(kThreads) build_work_order_kernel(const BuildArgs a) {
  const int t = int(threadIdx.x);
  for (int64_t e = t; e < a.entries; e += kThreads) a.table[e] = {-1, 0};
  for (int c = t; c < a.costs; c += kThreads) a.counters[c] = 0;
  __syncthreads();
  // f(tile, cost) for each tile of a document, one tile slot per thread at a time.
  auto each_tile = [&](auto f) {
    for (int64_t slot = t; slot < a.entries; slot += kThreads) {
      DocumentTile tile;
      if (document_tile(a.cu_seqlens, a.num_docs, a.total_tokens, order::kWorkTile, slot, tile))
        f(tile, order::tile_cost(tile.tile, tile.tiles, a.causal));
    }
  };
  each_tile([&](const DocumentTile&, int cost) { atomicAdd(a.counters + cost, 1); });
  __syncthreads();
  exclusive_suffix_sum(a.counters, a.costs);
  __syncthreads();
  each_tile([&](const DocumentTile& tile, int cost) {
    a.table[atomicAdd(a.counters + cost, 1)] = {tile.doc, tile.tile};
  });
}

}  // namespace

cudaError_t launch_build_work_order(const int32_t* cu_seqlens, int num_docs, int total_tokens, bool causal,
                                    order::OrderedTile* table, int* cost_counters, cudaStream_t stream) {
  const BuildArgs args{cu_seqlens,
                       num_docs,
                       total_tokens,
                       causal,
                       table,
                       cost_counters,
                       order::table_entries(total_tokens, num_docs),
                       int(order::cost_counters(total_tokens))};
  build_work_order_kernel<<<1, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flamia::cuda
