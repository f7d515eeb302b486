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

static_assert(kFwdKeyTile % kScaleBlock == 0 && kBwdKeyTile % kScaleBlock == 0 &&
                  kBwdQueryTile % kScaleBlock == 0 && kFwdQueryTile % kScaleBlock == 0,
              "tiles must be unions of whole scale groups, so a group never straddles a tile edge");

}  // namespace flamia::tiling
