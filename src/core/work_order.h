// The order in which the attention kernels take their work items: each head's tiles of 128 tokens
// over all its documents, the costliest first, heads in turn.
//
// An item is (tile, head). The forward and dQ work per query tile and see, causal, the key tiles
// from the document start to the diagonal; dK dV work per key tile and see the query tiles from the
// diagonal to the document end. So tile t of a document of n tiles costs
//   causal:     t + 1 tiles (forward, dQ: query tile t; dK dV: key tile n - 1 - t, mirrored);
//   non-causal: n tiles (every tile of the document sees all of it).
// The device builds a table (cuda/schedule/work_order.cuh) of every document's tiles sorted by that
// cost, largest first, then idle entries (the table has one entry per tile slot of
// core/document_slots.h, at least the number of tiles), and the number of tiles R; item i of a
// kernel is entry i % R with head i / R, so no item is idle. Longest first over all documents keeps
// a head's last, short items at the tail of the schedule (a long document found late in cu_seqlens
// would otherwise leave the other SMs idle while it runs); heads in turn keep the items in flight on
// one head's K and V, which then stay in L2. Items of equal cost take no fixed order among
// themselves (the builder ranks them with atomics): the schedule, never the results, may differ
// between runs, as which SM takes which item already does.
// Who uses it (measured on the H200 against the document-major slot order; docs/KERNELS.md): the
// forward (-1.8% on 16x4096, -3% on 8x8192 and longtail) and dQ (-2.0%, -2.8%, -4%; +1.3% on
// tiny-unaligned), and dK dV's persistent schedule (short documents; -5.5% on 8192+224x256). dK
// dV's grid schedule keeps the slot order: with this one the equal-length rows were 2.5-4% slower
// (each of its items reads its document's Q and dO from its key tile on; a head's items in flight
// then span all documents).
#pragma once

#include <cstdint>

#include "core/document_slots.h"
#include "core/tiling.h"
#include "formats/host_device.h"

namespace flamia::order {

// Tokens per item tile: the forward's and dQ's query rows, dK dV's keys (the kernels assert it).
inline constexpr int kWorkTile = tiling::kFrontierTile;

// One table entry: tile `tile` of document `doc`, counted from the document start for the query
// tile kernels (query_tile) and from its end for dK dV (key_tile); doc < 0: idle. 8-byte aligned:
// the kernels load an entry with one 8-byte load.
struct alignas(8) OrderedTile {
  int32_t doc, tile;
};

FLAMIA_HD int query_tile(const OrderedTile& e) { return e.tile; }
FLAMIA_HD int key_tile(const OrderedTile& e, int document_tiles) { return document_tiles - 1 - e.tile; }

// The cost of entry tile `tile` of a document of `tiles` tiles, in tiles (what the table sorts by).
FLAMIA_HD int tile_cost(int tile, int tiles, bool causal) { return causal ? tile + 1 : tiles; }

// The table's entries: one per tile slot of kWorkTile (core/document_slots.h).
FLAMIA_HD int64_t table_entries(int64_t total_tokens, int64_t num_docs) {
  return slots::slot_count(total_tokens, num_docs, kWorkTile);
}
// The builder's scratch: one counter per cost 0 .. ceil(T / kWorkTile).
FLAMIA_HD int64_t cost_counters(int64_t total_tokens) { return slots::ceil_div(total_tokens, kWorkTile) + 1; }

}  // namespace flamia::order
