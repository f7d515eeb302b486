// Scheduling's host-side facts: how the tiles of packed documents are numbered (tile slots) and
// the format and size of the attention kernels' work order. The device half of scheduling (finding
// a slot's document, building and reading the work order, the grids and the persistent item loop)
// is src/cuda/schedule/; these facts live in core because code without CUDA shares them: the
// transposed operand layout (core/operand_layout.h), the C API's workspace sizes and the CPU tests.
#pragma once

#include <cstdint>

#include "core/tiling.h"
#include "formats/host_device.h"

// Tile slots: numbering the tiles of packed documents without knowing the document lengths on the
// host.
//
// Document d (tokens [begin_d, begin_d + len_d) of the packed buffer) is cut into tiles of `unit`
// tokens counted from its start. Its tiles take the slots [S_d, S_d + ceil(len_d / unit)) with
//   S_d = ceil(begin_d / unit) + d,
// a number every kernel can compute from cu_seqlens alone. Slots never overlap: S_{d+1} - S_d =
// ceil((begin_d + len_d) / unit) - ceil(begin_d / unit) + 1 >= ceil(len_d / unit), and the
// ceil(total_tokens / unit) + num_docs slots cover every document. A slot between two documents'
// ranges holds no tile (at most two per document), so a grid of slots wastes almost nothing where
// a grid of (max tiles per document) x (documents) would be mostly idle on skewed lengths.
// The same numbering, in tokens, places documents in the transposed code layout
// (core/operand_layout.h).
namespace flamia::slots {

FLAMIA_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// S_d: the first slot of document `doc`, which begins at packed token doc_begin (>= 0).
FLAMIA_HD constexpr int64_t first_slot(int64_t doc_begin, int64_t doc, int64_t unit) {
  return ceil_div(doc_begin, unit) + doc;
}
// Slots that cover every document of a packed buffer of total_tokens tokens.
FLAMIA_HD constexpr int64_t slot_count(int64_t total_tokens, int64_t num_docs, int64_t unit) {
  return ceil_div(total_tokens, unit) + num_docs;
}

}  // namespace flamia::slots

// The work order: the order in which the persistent attention kernels take their work items, each
// head's tiles of 128 tokens over all its documents, the costliest first, heads in turn.
//
// An item is (tile, head). The forward and dQ work per query tile and see, causal, the key tiles
// from the document start to the diagonal; dK dV work per key tile and see the query tiles from the
// diagonal to the document end. So tile t of a document of n tiles costs
//   causal:     t + 1 tiles (forward, dQ: query tile t; dK dV: key tile n - 1 - t, mirrored);
//   non-causal: n tiles (every tile of the document sees all of it).
// The device builds a table (cuda/schedule/work_order.cuh) of every document's tiles sorted by that
// cost, largest first, then idle entries (the table has one entry per tile slot, at least the
// number of tiles), and the number of tiles R; item i of a kernel is entry i % R with head i / R,
// so no item is idle. Longest first over all documents keeps a head's last, short items at the
// tail of the schedule, where a long document found late in cu_seqlens would otherwise leave the
// other SMs idle while it runs; heads in turn keep the items in flight on one head's K and V,
// which then stay in L2. Items of equal cost take no fixed order among themselves (the builder
// ranks them with atomics): the schedule, never the results, may differ between runs.
// The forward, dQ and dK dV's persistent schedule take their items in this order; dK dV's grid
// schedule keeps the slot order (docs/KERNELS.md, "Work order").
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

// The table's entries: one per tile slot of kWorkTile.
FLAMIA_HD int64_t table_entries(int64_t total_tokens, int64_t num_docs) {
  return slots::slot_count(total_tokens, num_docs, kWorkTile);
}
// The builder's scratch: one counter per cost 0 .. ceil(T / kWorkTile).
FLAMIA_HD int64_t cost_counters(int64_t total_tokens) { return slots::ceil_div(total_tokens, kWorkTile) + 1; }

}  // namespace flamia::order
