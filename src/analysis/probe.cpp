#include "analysis/probe.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "reference/mxfp8_route.h"

namespace flamia::analysis {

ProbeCall emulated_probe_call_for(const reference::AttentionShape& shape) {
  if (!shape.causal) throw std::invalid_argument("the isolation probe runs causal calls");
  return [shape](const AttentionInputs& in, const NumericsOptions& opt) {
    auto call = reference::mxfp8_training(in.q, in.k, in.v, in.dout, in.docs, shape, opt);
    return ProbeOutputs{std::move(call.fwd.o), std::move(call.fwd.lse), std::move(call.grads.dq)};
  };
}

ProbeOutputs emulated_probe_call(const AttentionInputs& in, const NumericsOptions& opt) {
  return emulated_probe_call_for({.causal = true})(in, opt);
}

namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

struct Diff {
  double max_abs = 0.0;
  int64_t compared = 0, changed = 0;
  void add(double a, double b) {
    ++compared;
    if (same_bits(a, b)) return;
    ++changed;
    max_abs = std::fmax(max_abs, std::isnan(a - b) ? INFINITY : std::fabs(a - b));
  }
};

// Compares `rows` tokens starting at token a0 of call a with those starting at b0 of call b.
Diff diff_rows(const reference::PackedTensor& a, int a0, const reference::PackedTensor& b, int b0, int rows) {
  Diff d;
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < a.heads; ++h)
      for (int f = 0; f < a.dim; ++f) d.add(a.at(a0 + r, h, f), b.at(b0 + r, h, f));
  return d;
}
Diff diff_lse(const reference::HeadTokenTensor& a, int a0, const reference::HeadTokenTensor& b, int b0, int rows) {
  Diff d;
  for (int h = 0; h < a.heads; ++h)
    for (int r = 0; r < rows; ++r) d.add(a.at(h, a0 + r), b.at(h, b0 + r));
  return d;
}

void add_cases(std::vector<ProbeCase>& out, Isolation mode, const char* control, const ProbeOutputs& a, int a0,
               const ProbeOutputs& b, int b0, int rows) {
  std::vector<std::pair<const char*, Diff>> diffs = {
      {"o", diff_rows(a.o, a0, b.o, b0, rows)},
      {"lse", diff_lse(a.lse, a0, b.lse, b0, rows)},
  };
  if (a.dq && b.dq) diffs.emplace_back("dq", diff_rows(*a.dq, a0, *b.dq, b0, rows));
  for (const auto& [tensor, d] : diffs)
    out.push_back({mode, control, tensor, d.max_abs, d.changed == 0, d.compared, d.changed});
}

}  // namespace

void check_probe_options(const ProbeOptions& o) {
  if (o.lengths.size() != 3) throw std::invalid_argument("the probe packs exactly three documents [A, B, C]");
  int64_t total = o.other_document_growth;
  for (int n : o.lengths) {
    if (n < 1) throw std::invalid_argument("probe document lengths must be >= 1");
    total += n;
  }
  if (total > kMaxTokens) {
    throw std::invalid_argument("too many tokens: the probe's calls pack up to " + std::to_string(total) +
                                " tokens (lengths plus " + std::to_string(o.other_document_growth) +
                                " for the moved document), more than the " + std::to_string(kMaxTokens) +
                                " that int32 cu_seqlens can index");
  }
  // Compared without adding to position, which may be INT_MAX.
  if (o.position < 0 || o.position >= o.lengths[1] - 1)
    throw std::invalid_argument("--position must lie in [0, len(B) - 2] so that B has a suffix after it; got " +
                                std::to_string(o.position) + " with len(B) = " + std::to_string(o.lengths[1]));
  if (o.q_heads < 1 || o.kv_heads < 1 || o.q_heads % o.kv_heads != 0)
    throw std::invalid_argument("--heads must be a positive multiple of --kv-heads");
  if (o.head_dim < 1) throw std::invalid_argument("--dim must be >= 1");
  // The route's own rules (head_dim for NVFP4 and the rotation) are the core's, as in every call.
  AttentionOptions route;
  route.shape.causal = true;
  route.numerics.route = o.route;
  route.numerics.hadamard = o.hadamard;
  if (const std::optional<std::string> e = options_error(route, o.head_dim)) throw std::invalid_argument(*e);
  if (o.suffix_boost_log2 < 1 || o.suffix_boost_log2 > 60) throw std::invalid_argument("suffix boost must lie in [1, 60]");
}

std::vector<ProbeCase> run_probe(const ProbeOptions& o, const Progress& progress, const ProbeCall& call) {
  check_probe_options(o);
  if (progress) progress("generating inputs");
  const InputShape shape{o.lengths, o.q_heads, o.kv_heads, o.head_dim};
  const AttentionInputs base = random_inputs(shape, o.seed);
  const int b_begin = base.docs.begin(1), i = o.position, b_len = o.lengths[1];

  // Suffix control: redraw B after i, and make token i+1 large so i's group rescales.
  AttentionInputs suffix = base;
  for (int p = i + 1; p < b_len; ++p) redraw_token(suffix, b_begin + p, o.seed ^ (0xA5A5ull + uint64_t(p)));
  for (auto* x : {&suffix.q, &suffix.k, &suffix.v, &suffix.dout})
    for (int h = 0; h < x->heads; ++h)
      for (int f = 0; f < x->dim; ++f) x->at(b_begin + i + 1, h, f) *= std::ldexp(1.0, o.suffix_boost_log2);

  // Other-document control: new A (longer, so B moves) and new C; B's own data is copied over.
  InputShape moved_shape = shape;
  moved_shape.lengths[0] += o.other_document_growth;
  AttentionInputs moved = random_inputs(moved_shape, o.seed + 1);
  const int moved_b = moved.docs.begin(1);
  for (auto [dst, src] : {std::pair{&moved.q, &base.q}, {&moved.k, &base.k}, {&moved.v, &base.v}, {&moved.dout, &base.dout}})
    for (int p = 0; p < b_len; ++p)
      for (int h = 0; h < src->heads; ++h)
        for (int f = 0; f < src->dim; ++f) dst->at(moved_b + p, h, f) = src->at(b_begin + p, h, f);

  std::vector<ProbeCase> cases;
  for (Isolation mode : {Isolation::kDocument, Isolation::kPrefix}) {
    NumericsOptions opt;
    opt.isolation = mode;
    opt.scale_geometry = o.scale_geometry;
    opt.scale_rule = o.scale_rule;
    opt.route = o.route;
    opt.hadamard = o.hadamard;
    const std::string m(to_string(mode));
    if (progress) progress(m + ": base call");
    const ProbeOutputs b = call(base, opt);
    if (progress) progress(m + ": suffix control");
    add_cases(cases, mode, "suffix", b, b_begin, call(suffix, opt), b_begin, i + 1);
    if (progress) progress(m + ": other-document control");
    add_cases(cases, mode, "other_document", b, b_begin, call(moved, opt), moved_b, b_len);
  }
  return cases;
}

bool probe_passes(const std::vector<ProbeCase>& cases, std::string* why) {
  std::string problems;
  bool document_o_moved = false, document_dq_moved = false, has_dq = false;
  for (const ProbeCase& c : cases) {
    const bool must_hold = c.control == "other_document" || c.mode == Isolation::kPrefix;
    if (must_hold && !c.bitwise_equal) {
      problems += std::string(to_string(c.mode)) + "/" + c.control + "/" + c.tensor + " changed (" +
                  std::to_string(c.changed) + " values); ";
    }
    has_dq |= c.tensor == "dq";
    if (c.mode == Isolation::kDocument && c.control == "suffix" && !c.bitwise_equal) {
      document_o_moved |= c.tensor == "o";
      document_dq_moved |= c.tensor == "dq";
    }
  }
  if (!document_o_moved || (has_dq && !document_dq_moved))
    problems += "probe is blind: the suffix control did not move document-mode O and dQ; ";
  if (why) *why = problems;
  return problems.empty();
}

}  // namespace flamia::analysis
