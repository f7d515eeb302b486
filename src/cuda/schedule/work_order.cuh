// The attention kernels' work order on the device (its format: core/schedule.h): the table
// builder's launch, and each kernel's lookup of its item's tile.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/offsets_check.h"
#include "core/schedule.h"
#include "cuda/schedule/document_span.cuh"

namespace flamia::cuda {

// A call's output that the builder fills with NaN on a violation: rows [total_tokens, heads, dim] of
// 16-bit values with element strides stride_token, stride_head (16-byte aligned rows, dim a multiple
// of 8); nan_pair is two NaNs of the format (BF16, or FP16 where dq holds the FP16 partials'
// accumulator, which the finish pass turns into BF16 NaN).
inline constexpr uint32_t kBf16NanPair = 0x7FC07FC0u, kFp16NanPair = 0x7E007E00u;
inline constexpr int kOffsetsCheckRows = 3;  // the most outputs of one call: dq, dk and dv
struct NanRows {
  void* data = nullptr;
  int64_t stride_token = 0, stride_head = 0;
  int heads = 0, dim = 0;
  uint32_t nan_pair = kBf16NanPair;
};

// What the builder does besides ordering the tiles: it checks cu_seqlens first (core/offsets_check.h)
// and, on a violation, orders no tile and does what this asks (every field may be null or 0).
struct OffsetsCheck {
  // [num_docs + 1], written in every case: cu_seqlens when it is valid, else zeros (num_docs empty
  // documents), so that kernels reading it after the builder find no document in malformed offsets.
  int32_t* checked_cu_seqlens = nullptr;
  // The caller's status word: on a violation the first bad entry's record, unless it holds one
  // already (the first record stays), written with one 16-byte store (16-byte aligned).
  OffsetsRecord* status = nullptr;
  // Filled with NaN on a violation: the call's outputs (the forward's o, the backward's dq, dk and
  // dv; a null data pointer is skipped) and FP32 lse [lse_heads, total_tokens], contiguous.
  NanRows rows[kOffsetsCheckRows];
  float* lse = nullptr;
  int lse_heads = 0;
};

// Fills table[0 .. order::table_entries(T, num_docs)) with every document's tiles, costliest first
// (idle entries after them), using cost_counters[0 .. order::cost_counters(T)) as scratch; after
// it, cost_counters[0] holds the number of tiles (the kernels' work_order_tiles). Malformed
// cu_seqlens give no tile (every entry idle, cost_counters[0] == 0) and what `check` asks. One CTA;
// reads cu_seqlens on the device, so the call stays capturable in a CUDA graph.
cudaError_t launch_build_work_order(const int32_t* cu_seqlens, int num_docs, int total_tokens, bool causal,
                                    order::OrderedTile* table, int* cost_counters, cudaStream_t stream,
                                    const OffsetsCheck& check = {});

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
