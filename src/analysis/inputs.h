// Deterministic random attention inputs over packed documents, shared by the numerics table,
// the probe and the tests. Values are standard normal draws rounded to BF16, as a user's BF16
// tensors would be; the generator is written out here (not std::normal_distribution) so the
// same seed gives the same inputs on every platform.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/documents.h"
#include "core/options.h"
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

// What the random inputs look like (flamia numerics --inputs): besides standard normal draws, the
// peaked attention a numerics decision must also hold on. Every transform is document-local, so
// packing leaves it unchanged.
enum class InputKind : uint8_t {
  kNormal,    // every value a standard normal draw (rounded to BF16, as all kinds are)
  kSharp,     // q and k x kSharpQk: scores 2.56 times as large, rows that concentrate on few keys
  kOutliers,  // two outlier features per head (kOutlierFeatures): q's and k's x 4, v's x 20
  kSink,      // an attention sink: each query leans along the first kSinkFeatures features (+1), and its
              // document's first key points along them (4 on each): every row puts mass on that key
};
inline constexpr double kSharpQk = 1.6;
inline constexpr int kOutlierFeatures[] = {0, 1};
inline constexpr double kOutlierQk = 4.0, kOutlierV = 20.0;
inline constexpr int kSinkFeatures = 16;
inline constexpr double kSinkQueryLean = 1.0, kSinkKey = 4.0;

struct InputShape {
  std::vector<int> lengths;
  int q_heads = 4, kv_heads = 4, head_dim = 128;
  int value_dim = 0;  // V's and dO's (and O's) features; 0: head_dim
  std::vector<int> key_lengths{};  // each document's keys; empty: lengths (self-attention)
  int dv() const { return value_dim > 0 ? value_dim : head_dim; }
};

AttentionInputs random_inputs(const InputShape& shape, uint64_t seed, InputKind kind = InputKind::kNormal);

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

namespace flamia {
template <>
struct EnumNames<analysis::InputKind> {
  static constexpr EnumName<analysis::InputKind> table[] = {{analysis::InputKind::kNormal, "normal", ""},
                                                            {analysis::InputKind::kSharp, "sharp", ""},
                                                            {analysis::InputKind::kOutliers, "outliers", ""},
                                                            {analysis::InputKind::kSink, "sink", ""}};
};
}  // namespace flamia
