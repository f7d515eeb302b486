// The forward of short documents, quantized inside its kernel (src/cuda/sm90/forward_short.cu):
// which documents it takes, the order it streams their BF16 chunks in, and how its work list is
// sorted. Host and device code share these, and the CPU tests check them.
//
// Why a kernel of its own: the forward's separate quantization pass reads Q, K and V as BF16 and
// writes their codes at the memory bound (~0.33 ms for 65,536 tokens x 16 heads on the H200), which
// on packed short documents costs more than FP8 saves (docs/KERNELS.md). A document of at most
// kMaxTokens tokens fits in shared memory whole, as codes: one work item per (document, KV head)
// loads its K and V once as BF16, quantizes them into shared memory with the quantizer's arithmetic
// (bitwise its codes), then quantizes and attends each Q tile of the group's query heads. A call
// then reads Q, K and V once and writes O, where the separate pass also wrote and re-read the codes.
#pragma once

#include "core/document_slots.h"
#include "core/tiling.h"
#include "formats/host_device.h"

namespace flamia::short_docs {

// The longest document the short-document forward takes: four key tiles of shared memory.
inline constexpr int kMaxTokens = 512;
// Tokens per streamed chunk: one block32 scale group of one head (the quantizer's step).
inline constexpr int kChunkTokens = tiling::kScaleBlock;
inline constexpr int kTileTokens = tiling::kFwdKeyTile;  // = kFwdQueryTile
inline constexpr int kChunksPerTile = kTileTokens / kChunkTokens;
inline constexpr int kMaxTiles = kMaxTokens / kTileTokens;
static_assert(tiling::kFwdKeyTile == tiling::kFwdQueryTile, "query and key tiles coincide");
static_assert(kMaxTokens % kTileTokens == 0 && kTileTokens % kChunkTokens == 0, "whole tiles of whole chunks");

FLAMIA_HD constexpr bool is_short(int len, int limit = kMaxTokens) { return len >= 1 && len <= limit; }

// The work list is sorted by cost, longest first, in buckets of whole chunks: bucket b holds the
// documents of b chunks (1 .. kMaxTokens / kChunkTokens); counting sort with one counter per bucket.
inline constexpr int kCostBuckets = kMaxTokens / kChunkTokens + 1;  // bucket 0 unused (no empty documents)
FLAMIA_HD constexpr int cost_bucket(int len) { return int(slots::ceil_div(len, kChunkTokens)); }

// The chunks one item streams, in the order its consumers take them (each chunk: kChunkTokens tokens
// x head_dim BF16 of one head). An item is a document of `len` tokens and one KV head with `group`
// query heads. Its tiles of kTileTokens tokens each: K and V chunk c (c = 0 .. chunks - 1), then
// the Q chunks of each query head. Causal, tile j's Q tiles need K and V up to tile j only, so the
// stream interleaves: tile j's K and V chunks (K c, V c, K c+1, V c+1, ..), then tile j's Q
// chunks of query head 0, 1, .. of the group; not causal, every K and V chunk comes first, then
// each tile's Q chunks, head by head. `use` numbers are relative to the item's first chunk.
struct ChunkPlan {
  int len, group;
  bool causal;

  FLAMIA_HD constexpr int chunks() const { return int(slots::ceil_div(len, kChunkTokens)); }
  FLAMIA_HD constexpr int tiles() const { return int(slots::ceil_div(len, kTileTokens)); }
  // Chunks of tile j: kChunksPerTile, fewer in the last tile.
  FLAMIA_HD constexpr int tile_chunks(int j) const {
    const int left = chunks() - j * kChunksPerTile;
    return left < kChunksPerTile ? left : kChunksPerTile;
  }
  FLAMIA_HD constexpr int total() const { return (2 + group) * chunks(); }
  // The key tiles that Q tile j attends to, all quantized before its first Q chunk (the kernel takes
  // key tiles 0 .. key_tiles_for(j) - 1, then Q tile j of each query head, in use order).
  FLAMIA_HD constexpr int key_tiles_for(int j) const { return causal ? j + 1 : tiles(); }

  // The first use of tile j's K and V chunks (causal) and of tile j's Q chunks of query head g.
  FLAMIA_HD constexpr int kv_base(int j) const { return causal ? (2 + group) * kChunksPerTile * j : 2 * j * kChunksPerTile; }
  FLAMIA_HD constexpr int k_use(int c) const { return kv_base(c / kChunksPerTile) + 2 * (c % kChunksPerTile); }
  FLAMIA_HD constexpr int v_use(int c) const { return k_use(c) + 1; }
  FLAMIA_HD constexpr int q_use(int g, int c) const {
    const int j = c / kChunksPerTile, n = tile_chunks(j);
    const int tile_base = causal ? kv_base(j) + 2 * n : 2 * chunks() + group * kChunksPerTile * j;
    return tile_base + g * n + c % kChunksPerTile;
  }

  // The chunk of use `use` (0 .. total() - 1), the inverse of the three above: what the producer
  // loads in use order.
  enum Operand { kQuery, kKey, kValue };
  struct Chunk {
    Operand operand;
    int head;   // the query head of the group (kQuery; else 0)
    int chunk;  // c: tokens [c kChunkTokens, (c + 1) kChunkTokens) of the document
  };
  FLAMIA_HD constexpr Chunk at(int use) const {
    int j = 0, r = use;  // r: the use within tile j's Q chunks (or, causal, its K and V chunks first)
    if (causal) {
      j = use / ((2 + group) * kChunksPerTile);
      r = use - kv_base(j);
      const int n = tile_chunks(j);
      if (r < 2 * n) return {r % 2 == 0 ? kKey : kValue, 0, j * kChunksPerTile + r / 2};
      r -= 2 * n;
    } else {
      if (use < 2 * chunks()) return {use % 2 == 0 ? kKey : kValue, 0, use / 2};
      r = use - 2 * chunks();
      j = r / (group * kChunksPerTile);
      r -= group * kChunksPerTile * j;
    }
    const int n = tile_chunks(j);
    return {kQuery, r / n, j * kChunksPerTile + r % n};
  }
};

// Walks an item's chunks in use order, a chunk a step: step() gives at(0), at(1), .. without a
// division by a run-time count (the kernel's loads take one chunk a step, on the quantizers' path).
struct ChunkCursor {
  int tile = 0;   // the tile whose chunks come next
  int keys = 1;   // 1: the tile's K and V chunks (not causal: every tile's), 0: its Q chunks
  int head = 0;   // the query head of the group (Q chunks)
  int index = 0;  // K and V: 2 c + (V ? 1 : 0), c counted from the tile (causal) or document start; Q: c in the tile

  FLAMIA_HD constexpr ChunkPlan::Chunk step(const ChunkPlan& plan) {
    if (keys) {
      const ChunkPlan::Chunk out{index % 2 == 0 ? ChunkPlan::kKey : ChunkPlan::kValue, 0,
                                 (plan.causal ? tile * kChunksPerTile : 0) + index / 2};
      if (++index == 2 * (plan.causal ? plan.tile_chunks(tile) : plan.chunks())) keys = 0, index = 0;
      return out;
    }
    const ChunkPlan::Chunk out{ChunkPlan::kQuery, head, tile * kChunksPerTile + index};
    if (++index == plan.tile_chunks(tile)) {
      index = 0;
      if (++head == plan.group) head = 0, ++tile, keys = plan.causal ? 1 : 0;
    }
    return out;
  }
};

}  // namespace flamia::short_docs
