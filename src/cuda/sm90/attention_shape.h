// What every Hopper attention kernel (forward, backward prep, dK dV, dQ) knows about the problem,
// from the C API's validated arguments (host-callable, no CUDA headers needed).
#pragma once

#include <cstdint>

namespace flamia::cuda::sm90 {

struct AttentionShape {
  const int32_t* cu_seqlens;  // [num_docs + 1] on the device
  int num_docs, total_tokens;
  int q_heads, kv_heads, head_dim;
  float softmax_scale;  // already resolved (never 0)
  int p_boost_log2;
  bool causal;
  // Every 32-token group of a document shares one scale per operand (block32 geometry): interior
  // tiles take one factor per group instead of per token.
  bool group_scales;
};

}  // namespace flamia::cuda::sm90
