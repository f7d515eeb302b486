#include "analysis/inputs.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "formats/minifloat.h"

namespace flamia::analysis {

uint64_t NormalRng::next_u64() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double NormalRng::uniform() { return (double(next_u64() >> 11) + 0.5) * 0x1.0p-53; }

double NormalRng::next() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double r = std::sqrt(-2.0 * std::log(uniform())), t = 2.0 * std::numbers::pi * uniform();
  spare_ = r * std::sin(t);
  has_spare_ = true;
  return r * std::cos(t);
}

namespace {
void fill_rows(reference::PackedTensor& x, int t0, int t1, NormalRng& rng) {
  for (int t = t0; t < t1; ++t)
    for (int h = 0; h < x.heads; ++h)
      for (int f = 0; f < x.dim; ++f) x.at(t, h, f) = formats::round_to_bf16(rng.next());
}

// The kind's transform of standard normal inputs (InputKind), each value rounded to BF16 again.
void shape_inputs(AttentionInputs& in, InputKind kind) {
  auto scale_features = [](reference::PackedTensor& x, double factor, bool outliers_only) {
    for (int t = 0; t < x.tokens; ++t)
      for (int h = 0; h < x.heads; ++h) {
        double* row = x.row(t, h);
        if (!outliers_only) {
          for (int f = 0; f < x.dim; ++f) row[f] = formats::round_to_bf16(row[f] * factor);
          continue;
        }
        for (int f : kOutlierFeatures)
          if (f < x.dim) row[f] = formats::round_to_bf16(row[f] * factor);
      }
  };
  switch (kind) {
    case InputKind::kNormal:
      return;
    case InputKind::kSharp:
      scale_features(in.q, kSharpQk, false);
      scale_features(in.k, kSharpQk, false);
      return;
    case InputKind::kOutliers:
      scale_features(in.q, kOutlierQk, true);
      scale_features(in.k, kOutlierQk, true);
      scale_features(in.v, kOutlierV, true);
      return;
    case InputKind::kSink: {
      const int features = std::min(kSinkFeatures, in.q.dim);
      for (int t = 0; t < in.q.tokens; ++t)
        for (int h = 0; h < in.q.heads; ++h)
          for (int f = 0; f < features; ++f) in.q.at(t, h, f) = formats::round_to_bf16(in.q.at(t, h, f) + kSinkQueryLean);
      const Documents& keys = in.key_docs();
      for (int d = 0; d < keys.count(); ++d) {
        if (keys.length(d) == 0) continue;
        for (int h = 0; h < in.k.heads; ++h)
          for (int f = 0; f < features; ++f) in.k.at(keys.begin(d), h, f) = kSinkKey;
      }
      return;
    }
  }
}
}  // namespace

AttentionInputs random_inputs(const InputShape& s, uint64_t seed, InputKind kind) {
  Documents docs = Documents::from_lengths(s.lengths);
  std::optional<Documents> k_docs;
  if (!s.key_lengths.empty()) k_docs = Documents::from_lengths(s.key_lengths);
  const int T = docs.total_tokens(), Tk = k_docs ? k_docs->total_tokens() : T;
  AttentionInputs in{std::move(docs), reference::PackedTensor(T, s.q_heads, s.head_dim),
                     reference::PackedTensor(Tk, s.kv_heads, s.head_dim), reference::PackedTensor(Tk, s.kv_heads, s.dv()),
                     reference::PackedTensor(T, s.q_heads, s.dv()), std::move(k_docs)};
  NormalRng rng(seed);
  for (auto* x : {&in.q, &in.k, &in.v, &in.dout}) fill_rows(*x, 0, x->tokens, rng);
  shape_inputs(in, kind);
  return in;
}

void redraw_token(AttentionInputs& in, int token, uint64_t seed) {
  NormalRng rng(seed);
  for (auto* x : {&in.q, &in.k, &in.v, &in.dout}) fill_rows(*x, token, token + 1, rng);
}

}  // namespace flamia::analysis
