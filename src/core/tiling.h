// Tile and group sizes that define the numerics. The CPU emulation reproduces the kernels'
// rounding decisions, and those depend on where tiles start and end, so these numbers are part
// of the numerics contract, not tuning knobs private to a kernel. Every tile and group is
// counted from the start of its document, never from the start of the packed buffer.
#pragma once

namespace flamia::tiling {

// Tokens per scale group of a loaded operand under ScaleGeometry::kBlock32.
inline constexpr int kScaleBlock = 32;

// Forward: query rows per work item and keys per step of the online softmax. Key tiles are
// visited from the diagonal tile down to the first one, as the kernel does, and P is rounded
// against the running row max after each tile.
inline constexpr int kFwdQueryTile = 128;
inline constexpr int kFwdKeyTile = 128;

// Backward: keys owned by one work item (dK, dV accumulate over its query tiles) and queries
// per step. U's per-row scale (dQ) spans one key tile; its per-column scale (dK) one query tile.
inline constexpr int kBwdKeyTile = 128;
inline constexpr int kBwdQueryTile = 64;

// Side of the square U scale groups of UScaleGeometry::kSquare32.
inline constexpr int kUSquare = 32;

// Prefix isolation's interior pairs: a (query, key) pair of one document whose key lies at least
// kFrontierTiles 128-token tiles before the query's tile. Every 32-token group of such a key ends
// before the query's tile starts, so a block32 scale of K or V there depends on nothing after the
// query: prefix isolation reads K's and V's block32 codes on interior pairs and their per-token
// codes on the rest (the frontier: the query's tile and the kFrontierTiles - 1 before it). Every
// kernel tile nests in these tiles, so a kernel's key tile is wholly interior or wholly at the
// frontier for each of its query tiles.
// Why two tiles: K and V are encoded twice for the interior pairs, a cost per token; with a
// frontier of one tile short documents (tiny-unaligned, 236 tokens on average) paid it on 72% of
// their tokens for 63% of their pairs (prefix / default 1.13 there on the H200), with two on
// 34% for 21%, while long ones keep > 90% of their pairs interior.
inline constexpr int kFrontierTile = 128;
inline constexpr int kFrontierTiles = 2;
constexpr bool interior_pair(int query, int key) {
  return key / kFrontierTile + kFrontierTiles <= query / kFrontierTile;
}
static_assert(kFwdQueryTile == kFrontierTile && kFwdKeyTile == kFrontierTile && kBwdKeyTile == kFrontierTile &&
                  kFrontierTile % kBwdQueryTile == 0,
              "every kernel tile is a frontier tile of interior_pair or nests in one");

static_assert(kFwdKeyTile % kScaleBlock == 0 && kBwdKeyTile % kScaleBlock == 0 &&
                  kBwdQueryTile % kScaleBlock == 0 && kFwdQueryTile % kScaleBlock == 0,
              "tiles must be unions of whole scale groups, so a group never straddles a tile edge");

}  // namespace flamia::tiling
