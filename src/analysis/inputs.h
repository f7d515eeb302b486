// Deterministic random attention inputs over packed documents, shared by the numerics table,
// the probe and the tests. Values are standard normal draws rounded to BF16, as a user's BF16
// tensors would be; the generator is written out here (not std::normal_distribution) so the
// same seed gives the same inputs on every platform.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/documents.h"
#include "reference/tensor.h"

namespace flamia::analysis {

struct AttentionInputs {
  Documents docs;
  reference::PackedTensor q, k, v, dout;
  // The key documents (flash_attn's cu_seqlens_k) when they differ from the query documents; k and
  // v then hold their tokens.
  std::optional<Documents> k_docs;
  const Documents& key_docs() const { return k_docs ? *k_docs : docs; }
};

struct InputShape {
  std::vector<int> lengths;
  int q_heads = 4, kv_heads = 4, head_dim = 128;
  int value_dim = 0;  // V's and dO's (and O's) features; 0: head_dim
  std::vector<int> key_lengths{};  // each document's keys; empty: lengths (self-attention)
  int dv() const { return value_dim > 0 ? value_dim : head_dim; }
};

AttentionInputs random_inputs(const InputShape& shape, uint64_t seed);

// Fills one token's rows of q, k, v and dout (all heads) with fresh draws from `seed`.
void redraw_token(AttentionInputs& in, int token, uint64_t seed);

// A small deterministic normal generator (splitmix64 + Box-Muller).
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : state_(seed) {}
  double next();

 private:
  uint64_t next_u64();
  double uniform();  // in (0, 1)
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace flamia::analysis
