// The token range of one document, read from cu_seqlens on the device and clamped into
// [0, total_tokens] (each end to at least its begin), so garbage offsets cannot make a kernel
// index out of bounds (they give meaningless results instead; the host copy is what the C API
// validates). And the tile held by a slot of a grid of document tile slots (core/schedule.h), found
// by one thread or by a whole warp.
#pragma once

#include <cstdint>

#include "core/schedule.h"

namespace flamia::cuda {

struct DocumentSpan {
  int begin, end, len;
};

__device__ __forceinline__ DocumentSpan document_span(const int32_t* cu_seqlens, int doc, int total_tokens) {
  const int begin = min(max(cu_seqlens[doc], 0), total_tokens);
  const int end = min(max(cu_seqlens[doc + 1], begin), total_tokens);
  return {begin, end, end - begin};
}

// Tile `tile` (of `tiles`, each `unit` tokens from the document start) of document `doc`.
struct DocumentTile {
  DocumentSpan span;
  int doc, tile, tiles;
};

// The first slot of document d, from its clamped start (core/schedule.h).
__device__ __forceinline__ int64_t clamped_first_slot(const int32_t* cu_seqlens, int d, int total_tokens, int unit) {
  return slots::first_slot(min(max(__ldg(cu_seqlens + d), 0), total_tokens), d, unit);
}

// Slot `slot` as a tile of document `doc` (whose first slot is at or before it), or false when it
// lies past the document's tiles.
__device__ __forceinline__ bool tile_of_document(const int32_t* cu_seqlens, int doc, int total_tokens, int unit,
                                                 int64_t slot, DocumentTile& out) {
  out.span = document_span(cu_seqlens, doc, total_tokens);
  out.doc = doc;
  out.tiles = int(slots::ceil_div(out.span.len, unit));
  const int64_t tile = slot - slots::first_slot(out.span.begin, doc, unit);
  out.tile = int(tile);
  return tile >= 0 && tile < out.tiles;
}

// The tile held by grid slot `slot` (core/schedule.h), or false for an idle slot. Finds the
// last document whose first slot is at or before `slot` by bisection over cu_seqlens (first slots
// increase with the document index; with malformed cu_seqlens the answer is meaningless but
// still a tile inside a clamped document).
__device__ __forceinline__ bool document_tile(const int32_t* cu_seqlens, int num_docs, int total_tokens, int unit,
                                              int64_t slot, DocumentTile& out) {
  auto first_slot = [&](int d) { return clamped_first_slot(cu_seqlens, d, total_tokens, unit); };
  int lo = 0, hi = num_docs - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (first_slot(mid) <= slot) lo = mid;
    else hi = mid - 1;
  }
  return tile_of_document(cu_seqlens, lo, total_tokens, unit, slot, out);
}

// document_tile for one whole warp (every lane gets the same answer; all 32 lanes must call): a
// 32-way search, each step one load per lane, all in flight together, so ceil(log32(num_docs))
// dependent loads instead of log2(num_docs) (a persistent kernel's producer finds every work item
// this way while the consumers wait).
__device__ __forceinline__ bool document_tile_warp(const int32_t* cu_seqlens, int num_docs, int total_tokens, int unit,
                                                   int64_t slot, DocumentTile& out) {
  auto first_slot = [&](int d) { return clamped_first_slot(cu_seqlens, d, total_tokens, unit); };
  const int lane = int(threadIdx.x) % 32;
  int lo = 0, hi = num_docs - 1;  // the answer lies in [lo, hi]
  while (lo < hi) {
    // Lanes probe (lo, hi] at 32 points, increasing with the lane and covering every document when
    // the range is shorter than 32; first slots increase with the document, so the lanes whose
    // probe starts at or before `slot` are a prefix of the warp.
    const int probe = lo + 1 + int(int64_t(hi - lo) * lane / 32);
    const uint32_t at_or_before = __ballot_sync(0xffffffffu, first_slot(probe) <= slot);
    if (at_or_before == 0) break;  // the answer is lo
    const int last = 31 - __clz(at_or_before);
    const int after = __shfl_sync(0xffffffffu, probe, min(last + 1, 31));
    hi = last == 31 ? hi : after - 1;
    lo = __shfl_sync(0xffffffffu, probe, last);
  }
  return tile_of_document(cu_seqlens, lo, total_tokens, unit, slot, out);
}

}  // namespace flamia::cuda
