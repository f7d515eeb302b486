// The attention kernels' work order on the device (its format: core/schedule.h): the table
// builder's launch, and each kernel's lookup of its item's tile.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/schedule.h"
#include "cuda/schedule/document_span.cuh"

namespace flamia::cuda {

// Fills table[0 .. order::table_entries(T, num_docs)) with every document's tiles, costliest first
// (idle entries after them), using cost_counters[0 .. order::cost_counters(T)) as scratch; after
// it, cost_counters[0] holds the number of tiles (the kernels' work_order_tiles). One CTA; reads
// cu_seqlens on the device, so the call stays capturable in a CUDA graph.
cudaError_t launch_build_work_order(const int32_t* cu_seqlens, int num_docs, int total_tokens, bool causal,
                                    order::OrderedTile* table, int* cost_counters, cudaStream_t stream);

// Table entry `entry` as a tile of its document (span, the document's tiles, and the entry's tile:
// counted from the document start for the query tile kernels, the forward and dQ, from its end for
// dK dV's key tiles: the same cost, causal); false for an idle entry. Every lane that asks loads
// the same entry (the table is read-only while the kernels run).
enum class TileFrom { kStart, kEnd };
template <TileFrom kFrom>
__device__ __forceinline__ bool ordered_tile(const order::OrderedTile* table, const int32_t* cu_seqlens,
                                             int total_tokens, int64_t entry, DocumentTile& out) {
  const int2 raw = __ldg(reinterpret_cast<const int2*>(table) + entry);
  const order::OrderedTile e{raw.x, raw.y};
  if (e.doc < 0) return false;
  out.span = document_span(cu_seqlens, e.doc, total_tokens);
  out.doc = e.doc;
  out.tiles = int(slots::ceil_div(out.span.len, order::kWorkTile));
  out.tile = kFrom == TileFrom::kStart ? order::query_tile(e) : order::key_tile(e, out.tiles);
  return true;
}

}  // namespace flamia::cuda
