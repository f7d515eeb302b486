// What every Hopper attention kernel (forward, backward prep, dK dV, dQ) knows about the problem,
// from the C API's validated arguments (host-callable, no CUDA headers needed).
#pragma once

#include <cstdint>

#include "core/schedule.h"

namespace flamia::cuda::sm90 {

struct KernelProblem {
  const int32_t* cu_seqlens;  // [num_docs + 1] on the device
  // The items' tiles, costliest first (core/schedule.h; built on the stream before the kernels),
  // and how many there are (the table's entries before the idle ones).
  const order::OrderedTile* work_order;
  const int* work_order_tiles;
  int num_docs, total_tokens;
  int q_heads, kv_heads, head_dim;
  float softmax_scale;  // already resolved (never 0)
  int p_boost_log2;
  bool causal;
  // Every 32-token group of a document shares one scale per operand (block32 geometry): interior
  // tiles take one factor per group instead of per token.
  bool group_scales;
  // Prefix isolation with block32 geometry: K and V have a second, block32 encoding (the kernels'
  // k_interior_* and v_interior_* fields), which interior tiles read (core/tiling.h's
  // interior_pair); the other tiles read their per-token codes. Without it the interior fields
  // point at the same codes as the others.
  bool interior_codes;
};

// Whether the attention kernels' two consumer warpgroups take turns at issuing their products
// (tma.cuh's ConsumerTurns; the launchers pick the kernel instance): where interior tiles take the
// grouped arithmetic, which is about as long as a step's products, and documents are long on
// average. On the H200 turns took 1-3% off the forward on long documents and up to
// 1-2% off dQ and dK dV's grid schedule; with per-key scales (prefix isolation, token geometry),
// whose arithmetic per step is longer, they made the forward 3-5% slower, and on short documents
// (each item a few steps) ~1.5%.
inline constexpr int kTurnsFromMeanDocument = 512;
// grouped: whether the kernel's interior tiles take the grouped arithmetic (the forward and dQ:
// group_scales || interior_codes, dK dV: group_scales).
inline bool consumers_take_turns(bool grouped, int64_t total_tokens, int64_t num_docs) {
  return grouped && total_tokens >= int64_t(kTurnsFromMeanDocument) * num_docs;
}

}  // namespace flamia::cuda::sm90
