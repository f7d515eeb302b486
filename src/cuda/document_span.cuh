// The token range of one document, read from cu_seqlens on the device and clamped into
// [0, total_tokens] (each end to at least its begin), so garbage offsets cannot make a kernel
// index out of bounds (they give meaningless results instead; the host copy is what the C API
// validates). And the work item of a CTA in a grid of document tile slots (core/document_slots.h).
#pragma once

#include <cstdint>

#include "core/document_slots.h"

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

// The tile held by grid slot `slot` (core/document_slots.h), or false for an idle slot. Finds the
// last document whose first slot is at or before `slot` by bisection over cu_seqlens (first slots
// increase with the document index; with malformed cu_seqlens the answer is meaningless but
// still a tile inside a clamped document).
__device__ __forceinline__ bool document_tile(const int32_t* cu_seqlens, int num_docs, int total_tokens, int unit,
                                              int64_t slot, DocumentTile& out) {
  auto first_slot = [&](int d) {
    return slots::first_slot(min(max(__ldg(cu_seqlens + d), 0), total_tokens), d, unit);
  };
  int lo = 0, hi = num_docs - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (first_slot(mid) <= slot) lo = mid;
    else hi = mid - 1;
  }
  out.span = document_span(cu_seqlens, lo, total_tokens);
  out.doc = lo;
  out.tiles = int(slots::ceil_div(out.span.len, unit));
  const int64_t tile = slot - first_slot(lo);
  out.tile = int(tile);
  return tile >= 0 && tile < out.tiles;
}

}  // namespace flamia::cuda
