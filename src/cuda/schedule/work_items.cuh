// The item loop of the persistent kernels (launch.cuh's launch_persistent): work items 0 .. items-1,
// a CTA's first blockIdx.x, each next claimed from a counter (gridDim.x + atomicAdd), handed from
// the producer warp to the consumer warpgroups through a ring of buffers (item n in buffer
// n % kBuffers, with whatever the item brings along, e.g. its resident tiles). The ring is the
// kernel's: any Ring of kBuffers stages with stage(n), wait_empty / arrive_full (producer) and
// wait_full / arrive_empty (consumers), as sm90/tma.cuh's StageRing.
#pragma once

#include <cstdint>

#include "cuda/schedule/document_span.cuh"
#include "cuda/schedule/work_order.cuh"

namespace flamia::cuda {

__device__ __forceinline__ int first_work_item() { return int(blockIdx.x); }
__device__ __forceinline__ int next_work_item(int* counter) { return int(gridDim.x) + atomicAdd(counter, 1); }

// Items travel through buffers: item n in buffer n % kBuffers, announced in infos[n % kBuffers]
// (any struct with a `work` member of the kernel's Work, which has a `tiles` count: the item's
// streamed tiles, 0 for "no more items"), with whatever else the item brings along. An item's
// streamed tiles are the uses first_use .. first_use + tiles - 1 of the kernel's tile ring, which
// runs on across items: first_use counts the tiles of the CTA's items before it.

// Producer side, one whole warp: per item n, find it (find(item, work): false for an idle item,
// which is skipped), wait until buffer n % kBuffers is empty, store it into infos (lane 0),
// publish(work, n) (lane 0 announces the bytes and issues the loads of the buffer; every lane
// stores what it must), arrive on the buffer's "full" (all lanes), then stream(work, n, first_use)
// its streamed tiles; the next item's claim is in flight meanwhile. After the last item, the next
// buffer's item has 0 tiles.
template <class Work, class Ring, int kBuffers, class Info, class Find, class Publish, class Stream>
__device__ __forceinline__ void produce_work_items(int* counter, int items, Ring& ring, Info (&infos)[kBuffers],
                                                   Find find, Publish publish, Stream stream) {
  static_assert(Ring::kStageCount == kBuffers, "one item buffer per stage of the ring");
  const int lane = int(threadIdx.x) % 32;
  auto claim_next = [&] { return __shfl_sync(0xffffffffu, lane == 0 ? next_work_item(counter) : 0, 0); };
  int item = first_work_item(), first_use = 0;
  for (int n = 0;; ++n) {
    Work w;
    while (item < items && !find(item, w)) item = claim_next();
    ring.wait_empty(n);
    if (item >= items) {
      if (lane == 0) infos[ring.stage(n)].work.tiles = 0;
      ring.arrive_full(n);
      return;
    }
    if (lane == 0) infos[ring.stage(n)].work = w;
    publish(w, n);
    ring.arrive_full(n);
    const int claimed = lane == 0 ? next_work_item(counter) : 0;
    stream(w, n, first_use);
    first_use += w.tiles;
    item = __shfl_sync(0xffffffffu, claimed, 0);
  }
}

// Each published item in turn, from one warp: wait for buffer n % kBuffers, take its item from infos
// (0 tiles ends the loop), run(work, n, first_use), and with kRelease release the buffer (one
// arrival per warp).
template <class Work, bool kRelease, class Ring, int kBuffers, class Info, class Run>
__device__ __forceinline__ void for_each_published_item(Ring& ring, const Info (&infos)[kBuffers], Run run) {
  static_assert(Ring::kStageCount == kBuffers, "one item buffer per stage of the ring");
  int first_use = 0;
  for (int n = 0;; ++n) {
    ring.wait_full(n);
    const Work w = infos[ring.stage(n)].work;
    if (w.tiles == 0) return;
    run(w, n, first_use);
    first_use += w.tiles;
    if (kRelease && threadIdx.x % 32 == 0) ring.arrive_empty(n);
  }
}

// Consumer side, per warp: each published item, run(work, n, first_use), then its buffer released.
template <class Work, class Ring, int kBuffers, class Info, class Run>
__device__ __forceinline__ void consume_work_items(Ring& ring, const Info (&infos)[kBuffers], Run run) {
  for_each_published_item<Work, true>(ring, infos, run);
}

// The producer side split over two warps, so that finding and publishing the next item (dependent
// global loads: the document search, per-row constants) overlaps streaming this item's tiles:
// publish_work_items is produce_work_items with nothing to stream (one warp), stream_work_items
// streams each item once its buffer is full (another warp; it does not release the buffer).
template <class Work, class Ring, int kBuffers, class Info, class Find, class Publish>
__device__ __forceinline__ void publish_work_items(int* counter, int items, Ring& ring, Info (&infos)[kBuffers],
                                                   Find find, Publish publish) {
  produce_work_items<Work>(counter, items, ring, infos, find, publish, [](const Work&, int, int) {});
}
template <class Work, class Ring, int kBuffers, class Info, class Stream>
__device__ __forceinline__ void stream_work_items(Ring& ring, const Info (&infos)[kBuffers], Stream stream) {
  for_each_published_item<Work, false>(ring, infos, stream);
}

// A (work order entry, query head) item of the tiles x heads numbering (core/schedule.h; head-major:
// consecutive items share a head's K and V), as the forward and dQ use it: tiles of
// order::kWorkTile queries, each head's costliest first. Found by a whole warp.
struct QueryTileItem {
  DocumentSpan span;
  int doc, q0, head, kvh;
  // The key tiles of key_tile keys that the item's rows see: up to the last row (causal) or the
  // document's end.
  __device__ int key_tiles(bool causal, int rows, int key_tile) const {
    return ((causal ? min(q0 + rows, span.len) : span.len) - 1) / key_tile + 1;
  }
};
// p: the kernel's KernelProblem (cuda/sm90/kernel_problem.h); tiles: the work order's tiles
// (*p.work_order_tiles), the items per head.
template <class Problem>
__device__ __forceinline__ bool find_query_tile_item(const Problem& p, int item, int tiles, QueryTileItem& out) {
  DocumentTile tile;
  if (!ordered_tile<TileFrom::kStart>(p.work_order, p.cu_seqlens, p.total_tokens, item % tiles, tile)) return false;
  out.span = tile.span;
  out.doc = tile.doc;
  out.q0 = tile.tile * order::kWorkTile;
  out.head = item / tiles;
  out.kvh = out.head / (p.q_heads / p.kv_heads);
  return true;
}

}  // namespace flamia::cuda
