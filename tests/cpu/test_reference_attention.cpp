// The exact FP64 reference attention: against a dense masked implementation, against finite
// differences, and for the isolation properties (documents, causal prefixes) the routes rely on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/documents.h"
#include "reference/attention_fp64.h"

namespace flamia::reference {
namespace {

PackedTensor random_tensor(int t, int h, int d, uint64_t seed, double stddev = 1.0) {
  PackedTensor x(t, h, d);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  for (double& e : x.data) e = normal(rng);
  return x;
}

// Dense implementation: the full masked [T, T] score matrix per query head, built from token
// indices and document_of() rather than from the document-local loops of the implementation.
ForwardOutputs naive_forward(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                             const Documents& docs, const AttentionShape& shape) {
  const int T = q.tokens, Hq = q.heads, D = q.dim, Dv = v.dim, group = q.heads / k.heads;
  const double scale = shape.scale_for(D);
  ForwardOutputs out{PackedTensor(T, Hq, Dv), HeadTokenTensor(Hq, T)};
  std::vector<double> s(size_t(T) * T);
  for (int h = 0; h < Hq; ++h) {
    const int kvh = h / group;
    for (int i = 0; i < T; ++i)
      for (int j = 0; j < T; ++j) {
        // flash_attn's window_size, on token positions (the same offsets as inside the document).
        const bool in_window = (shape.window_left < 0 || j >= i - shape.window_left) &&
                               (shape.window_right < 0 || j <= i + shape.window_right);
        const bool visible = docs.document_of(i) == docs.document_of(j) && (!shape.causal || j <= i) && in_window;
        double dot = 0.0;
        for (int f = 0; f < D; ++f) dot += q.at(i, h, f) * k.at(j, kvh, f);
        const double score = shape.softcap > 0 ? shape.softcap * std::tanh(scale * dot / shape.softcap) : scale * dot;
        s[size_t(i) * T + j] = visible ? score : -std::numeric_limits<double>::infinity();
      }
    for (int i = 0; i < T; ++i) {
      const double* row = &s[size_t(i) * T];
      const double m = *std::max_element(row, row + T);
      double l = 0.0;
      for (int j = 0; j < T; ++j) l += std::exp(row[j] - m);
      for (int j = 0; j < T; ++j) {
        const double p = std::exp(row[j] - m) / l;
        for (int f = 0; f < Dv; ++f) out.o.at(i, h, f) += p * v.at(j, kvh, f);
      }
      out.lse.at(h, i) = m + std::log(l);
    }
  }
  return out;
}

struct Problem {
  std::vector<int> lengths;
  int hq, hkv, dim;
  bool causal;
};

std::string name_of(const Problem& p) {
  return "Hq=" + std::to_string(p.hq) + " Hkv=" + std::to_string(p.hkv) + " D=" + std::to_string(p.dim) +
         (p.causal ? " causal" : " non-causal");
}

TEST(ReferenceAttention, ForwardMatchesDenseMaskedSoftmax) {
  const std::vector<int> lengths = {5, 1, 13, 0, 9};
  std::vector<Problem> problems;
  for (bool causal : {true, false})
    for (int dim : {8, 3})
      for (auto [hq, hkv] : {std::pair{4, 2}, std::pair{4, 1}, std::pair{4, 4}, std::pair{6, 3}})
        problems.push_back({lengths, hq, hkv, dim, causal});
  problems.push_back({{0, 37, 2, 0, 17}, 2, 1, 5, true});  // longer documents, odd D
  problems.push_back({{0, 37, 2, 0, 17}, 2, 1, 5, false});

  uint64_t seed = 1;
  for (const Problem& pb : problems) {
    SCOPED_TRACE(name_of(pb));
    const Documents docs = Documents::from_lengths(pb.lengths);
    const int T = docs.total_tokens();
    const PackedTensor q = random_tensor(T, pb.hq, pb.dim, seed++), k = random_tensor(T, pb.hkv, pb.dim, seed++),
                       v = random_tensor(T, pb.hkv, pb.dim, seed++);
    const AttentionShape shape{pb.causal, 0.0};
    const ForwardOutputs got = reference_forward(q, k, v, docs, shape), want = naive_forward(q, k, v, docs, shape);
    ASSERT_EQ(got.o.tokens, T);
    ASSERT_EQ(got.o.heads, pb.hq);
    ASSERT_EQ(got.o.dim, pb.dim);
    ASSERT_EQ(got.lse.heads, pb.hq);
    ASSERT_EQ(got.lse.tokens, T);
    for (size_t i = 0; i < want.o.size(); ++i) ASSERT_NEAR(got.o.data[i], want.o.data[i], 1e-13) << "o[" << i << "]";
    for (size_t i = 0; i < want.lse.data.size(); ++i)
      ASSERT_NEAR(got.lse.data[i], want.lse.data[i], 1e-13) << "lse[" << i << "]";
  }
}

// Sliding windows (causal and not, one side or both) and soft-capped scores.
std::vector<AttentionShape> windowed_and_capped_shapes() {
  return {{.causal = true, .window_left = 3},
          {.causal = true, .window_left = 0},
          {.causal = false, .window_left = 2, .window_right = 4},
          {.causal = false, .window_left = -1, .window_right = 1},
          {.causal = true, .softcap = 1.5},
          {.causal = false, .softcap = 0.8},
          {.causal = true, .window_left = 5, .softcap = 2.0}};
}
std::string name_of(const AttentionShape& s) {
  return std::string(s.causal ? "causal" : "non-causal") + " window (" + std::to_string(s.window_left) + ", " +
         std::to_string(s.window_right) + ") softcap " + std::to_string(s.softcap);
}

TEST(ReferenceAttention, WindowsAndSoftcapMatchDenseMaskedSoftmax) {
  const int lengths[] = {5, 1, 13, 0, 9};
  const Documents docs = Documents::from_lengths(lengths);
  const int T = docs.total_tokens();
  uint64_t seed = 61;
  for (const AttentionShape& shape : windowed_and_capped_shapes()) {
    SCOPED_TRACE(name_of(shape));
    // Large logits, so that the cap binds (scores of tens against a cap of 1-2).
    const PackedTensor q = random_tensor(T, 4, 8, seed++, 3.0), k = random_tensor(T, 2, 8, seed++, 3.0),
                       v = random_tensor(T, 2, 8, seed++);
    const ForwardOutputs got = reference_forward(q, k, v, docs, shape), want = naive_forward(q, k, v, docs, shape);
    for (size_t i = 0; i < want.o.size(); ++i) ASSERT_NEAR(got.o.data[i], want.o.data[i], 1e-13) << "o[" << i << "]";
    for (size_t i = 0; i < want.lse.data.size(); ++i)
      ASSERT_NEAR(got.lse.data[i], want.lse.data[i], 1e-13) << "lse[" << i << "]";
  }
}

double loss(const PackedTensor& o, const PackedTensor& w);

// V with its own head dim (MLA-style dqk = 12, dv = 5): O takes v's.
TEST(ReferenceAttention, ValueHeadDimOfItsOwnMatchesDenseSoftmaxAndCentralDifferences) {
  const int lengths[] = {5, 0, 9};
  const Documents docs = Documents::from_lengths(lengths);
  const int T = docs.total_tokens();
  for (const AttentionShape& shape : {AttentionShape{.causal = true}, AttentionShape{.causal = false, .window_left = 2}}) {
    SCOPED_TRACE(name_of(shape));
    PackedTensor q = random_tensor(T, 4, 12, 71), k = random_tensor(T, 2, 12, 72), v = random_tensor(T, 2, 5, 73);
    const PackedTensor w = random_tensor(T, 4, 5, 74);
    const ForwardOutputs got = reference_forward(q, k, v, docs, shape), want = naive_forward(q, k, v, docs, shape);
    ASSERT_EQ(got.o.dim, 5);
    for (size_t i = 0; i < want.o.size(); ++i) ASSERT_NEAR(got.o.data[i], want.o.data[i], 1e-13) << "o[" << i << "]";
    const Gradients grads = reference_backward(q, k, v, got.o, got.lse, w, docs, shape);
    ASSERT_EQ(grads.dq.dim, 12);
    ASSERT_EQ(grads.dk.dim, 12);
    ASSERT_EQ(grads.dv.dim, 5);
    const double h = 1e-6;
    for (auto [x, dx] : {std::pair{&q, &grads.dq}, std::pair{&k, &grads.dk}, std::pair{&v, &grads.dv}}) {
      for (size_t i = 0; i < x->size(); i += 7) {  // every seventh entry: the dims' layout is what is tested
        const double x0 = x->data[i];
        x->data[i] = x0 + h;
        const double lp = loss(reference_forward(q, k, v, docs, shape).o, w);
        x->data[i] = x0 - h;
        const double lm = loss(reference_forward(q, k, v, docs, shape).o, w);
        x->data[i] = x0;
        const double numeric = (lp - lm) / (2 * h), analytic = dx->data[i];
        ASSERT_LE(std::fabs(numeric - analytic) / std::max(std::fabs(analytic), 1e-2), 1e-6) << i;
      }
    }
  }
}

// Rows [t0, t1) of x, as a tensor of their own.
PackedTensor rows_of(const PackedTensor& x, int t0, int t1) {
  PackedTensor out(t1 - t0, x.heads, x.dim);
  std::copy(x.row(t0, 0), x.row(t0, 0) + out.size(), out.data.begin());
  return out;
}
// The rows of several tensors packed one after the other.
PackedTensor packed(const std::vector<PackedTensor>& parts) {
  int tokens = 0;
  for (const auto& p : parts) tokens += p.tokens;
  PackedTensor out(tokens, parts[0].heads, parts[0].dim);
  size_t at = 0;
  for (const auto& p : parts) at = size_t(std::copy(p.data.begin(), p.data.end(), out.data.begin() + at) - out.data.begin());
  return out;
}

// Context parallelism's building block: a document's queries split into chunks, each chunk a
// document of its own whose keys are the document's up to the chunk's end (cu_seqlens_q !=
// cu_seqlens_k, the causal mask aligned bottom-right), give the whole call's O, LSE and dQ rows,
// and the chunks' dK and dV add up to the whole call's; with a window too.
TEST(ReferenceAttention, QueryChunksAttendingTheirKeyPrefixGiveTheWholeCall) {
  const int L = 37, ends[] = {10, 23, 37};
  const int whole_len[] = {L};
  const Documents whole = Documents::from_lengths(whole_len);
  const PackedTensor q = random_tensor(L, 4, 6, 81), k = random_tensor(L, 2, 6, 82), v = random_tensor(L, 2, 6, 83),
                     g = random_tensor(L, 4, 6, 84);
  for (const AttentionShape& shape : {AttentionShape{.causal = true}, AttentionShape{.causal = true, .window_left = 7}}) {
    SCOPED_TRACE(name_of(shape));
    const ForwardOutputs f = reference_forward(q, k, v, whole, shape);
    const Gradients gw = reference_backward(q, k, v, f.o, f.lse, g, whole, shape);
    std::vector<int> q_lens, k_lens;
    std::vector<PackedTensor> qs, ks, vs, gs;
    for (int c = 0, begin = 0; c < 3; begin = ends[c++]) {
      q_lens.push_back(ends[c] - begin), k_lens.push_back(ends[c]);
      qs.push_back(rows_of(q, begin, ends[c])), gs.push_back(rows_of(g, begin, ends[c]));
      ks.push_back(rows_of(k, 0, ends[c])), vs.push_back(rows_of(v, 0, ends[c]));
    }
    const Documents q_docs = Documents::from_lengths(q_lens), k_docs = Documents::from_lengths(k_lens);
    const PackedTensor qc = packed(qs), kc = packed(ks), vc = packed(vs), gc = packed(gs);
    const ForwardOutputs fc = reference_forward(qc, kc, vc, q_docs, k_docs, shape);
    const Gradients gc_grads = reference_backward(qc, kc, vc, fc.o, fc.lse, gc, q_docs, k_docs, shape);
    ASSERT_EQ(fc.o.tokens, L);
    ASSERT_EQ(gc_grads.dk.tokens, kc.tokens);
    for (size_t i = 0; i < f.o.size(); ++i) ASSERT_NEAR(fc.o.data[i], f.o.data[i], 1e-13) << "o[" << i << "]";
    for (size_t i = 0; i < f.lse.data.size(); ++i) ASSERT_NEAR(fc.lse.data[i], f.lse.data[i], 1e-13) << "lse[" << i << "]";
    for (size_t i = 0; i < gw.dq.size(); ++i) ASSERT_NEAR(gc_grads.dq.data[i], gw.dq.data[i], 1e-12) << "dq[" << i << "]";
    for (int j = 0; j < L; ++j)
      for (int h = 0; h < 2; ++h)
        for (int f0 = 0; f0 < 6; ++f0) {
          double dk = 0.0, dv = 0.0;  // key j's copies, one per chunk that holds it
          for (int c = 0; c < 3; ++c)
            if (j < k_lens[c]) {
              dk += gc_grads.dk.at(k_docs.begin(c) + j, h, f0);
              dv += gc_grads.dv.at(k_docs.begin(c) + j, h, f0);
            }
          ASSERT_NEAR(dk, gw.dk.at(j, h, f0), 1e-12) << "dk key " << j;
          ASSERT_NEAR(dv, gw.dv.at(j, h, f0), 1e-12) << "dv key " << j;
        }
  }
}

// Keys split into two documents of their own for the same queries (non-causal): the two calls'
// outputs merged by their LSE give the call over all the keys (ring attention's merge).
TEST(ReferenceAttention, KeySplitsMergedByTheirLseGiveTheWholeCall) {
  const int Lq = 9, La = 8, Lb = 12;
  const PackedTensor q = random_tensor(Lq, 2, 5, 91), k = random_tensor(La + Lb, 1, 5, 92),
                     v = random_tensor(La + Lb, 1, 5, 93);
  const AttentionShape shape{.causal = false};
  const int lq[] = {Lq}, la[] = {La}, lb[] = {Lb}, lab[] = {La + Lb};
  const Documents qd = Documents::from_lengths(lq), ad = Documents::from_lengths(la), bd = Documents::from_lengths(lb),
                  abd = Documents::from_lengths(lab);
  const ForwardOutputs all = reference_forward(q, k, v, qd, abd, shape);
  const ForwardOutputs a = reference_forward(q, rows_of(k, 0, La), rows_of(v, 0, La), qd, ad, shape);
  const ForwardOutputs b = reference_forward(q, rows_of(k, La, La + Lb), rows_of(v, La, La + Lb), qd, bd, shape);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < Lq; ++i) {
      const double la_i = a.lse.at(h, i), lb_i = b.lse.at(h, i);
      const double m = std::max(la_i, lb_i), lse = m + std::log(std::exp(la_i - m) + std::exp(lb_i - m));
      ASSERT_NEAR(lse, all.lse.at(h, i), 1e-13);
      for (int f = 0; f < 5; ++f) {
        const double o = std::exp(la_i - lse) * a.o.at(i, h, f) + std::exp(lb_i - lse) * b.o.at(i, h, f);
        ASSERT_NEAR(o, all.o.at(i, h, f), 1e-13);
      }
    }
}

// Fewer keys than queries, causal (bottom-right): the first rows see no key (O = 0, LSE = -inf,
// their dQ 0); the others match the dense softmax and the gradients central differences.
TEST(ReferenceAttention, FewerKeysThanQueriesLeaveTheFirstRowsEmpty) {
  const int lq[] = {6, 4}, lk[] = {3, 4};
  const Documents qd = Documents::from_lengths(lq), kd = Documents::from_lengths(lk);
  PackedTensor q = random_tensor(10, 2, 4, 101), k = random_tensor(7, 1, 4, 102), v = random_tensor(7, 1, 4, 103);
  const PackedTensor w = random_tensor(10, 2, 4, 104);
  const AttentionShape shape{.causal = true};
  const ForwardOutputs f = reference_forward(q, k, v, qd, kd, shape);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 10; ++i) {
      const bool empty = i < 3;  // document 0: queries 0..2 sit before key 0 (3 - 6 = -3 positions)
      EXPECT_EQ(std::isinf(f.lse.at(h, i)) && f.lse.at(h, i) < 0, empty) << i;
      for (int x = 0; x < 4; ++x) {
        if (empty) EXPECT_EQ(f.o.at(i, h, x), 0.0);
        EXPECT_TRUE(std::isfinite(f.o.at(i, h, x)));
      }
    }
  // Query 5 of document 0 sits at key 2: it sees all three keys, as the full softmax over them.
  {
    double s[3], m = -1e300, l = 0.0;
    for (int j = 0; j < 3; ++j) {
      s[j] = 0.0;
      for (int x = 0; x < 4; ++x) s[j] += q.at(5, 0, x) * k.at(j, 0, x) / 2.0;
      m = std::max(m, s[j]);
    }
    for (int j = 0; j < 3; ++j) l += std::exp(s[j] - m);
    EXPECT_NEAR(f.lse.at(0, 5), m + std::log(l), 1e-13);
  }
  const Gradients grads = reference_backward(q, k, v, f.o, f.lse, w, qd, kd, shape);
  const double h = 1e-6;
  for (auto [x, dx] : {std::pair{&q, &grads.dq}, std::pair{&k, &grads.dk}, std::pair{&v, &grads.dv}}) {
    for (size_t i = 0; i < x->size(); ++i) {
      const double x0 = x->data[i];
      x->data[i] = x0 + h;
      const double lp = loss(reference_forward(q, k, v, qd, kd, shape).o, w);
      x->data[i] = x0 - h;
      const double lm = loss(reference_forward(q, k, v, qd, kd, shape).o, w);
      x->data[i] = x0;
      const double numeric = (lp - lm) / (2 * h), analytic = dx->data[i];
      ASSERT_TRUE(std::isfinite(analytic)) << i;
      ASSERT_LE(std::fabs(numeric - analytic) / std::max(std::fabs(analytic), 1e-2), 1e-6) << i;
    }
  }
}

TEST(ReferenceAttention, ForwardHonoursExplicitScaleAndLargeLogits) {
  const int lengths[] = {3, 11, 6};
  const Documents docs = Documents::from_lengths(lengths);
  const int T = docs.total_tokens();
  const PackedTensor q = random_tensor(T, 4, 16, 11, 30.0), k = random_tensor(T, 2, 16, 12, 30.0),
                     v = random_tensor(T, 2, 16, 13);
  for (bool causal : {true, false}) {
    const AttentionShape shape{causal, 0.7};  // logits of several thousand: exp overflows without the max
    const ForwardOutputs got = reference_forward(q, k, v, docs, shape), want = naive_forward(q, k, v, docs, shape);
    for (size_t i = 0; i < want.o.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got.o.data[i]));
      ASSERT_NEAR(got.o.data[i], want.o.data[i], 1e-12);
    }
    double largest = 0.0;
    for (size_t i = 0; i < want.lse.data.size(); ++i) {
      largest = std::max(largest, std::fabs(want.lse.data[i]));
      ASSERT_NEAR(got.lse.data[i], want.lse.data[i], 1e-12 * std::max(1.0, std::fabs(want.lse.data[i])));
    }
    EXPECT_GT(largest, 1000.0);  // exp(1000) overflows double
  }
}

TEST(ReferenceAttention, EmptyDocumentsAndEmptyBatch) {
  const int none[] = {0, 0};
  const Documents docs = Documents::from_lengths(none);
  const PackedTensor q(0, 2, 4), k(0, 1, 4), v(0, 1, 4);
  const ForwardOutputs fwd = reference_forward(q, k, v, docs, {});
  EXPECT_EQ(fwd.o.size(), 0u);
  const Gradients grads = reference_backward(q, k, v, fwd.o, fwd.lse, PackedTensor(0, 2, 4), docs, {});
  EXPECT_EQ(grads.dq.size(), 0u);
  EXPECT_EQ(grads.dk.size(), 0u);
  EXPECT_EQ(grads.dv.size(), 0u);
}

// L = sum(O * W), accumulated in long double so that its own rounding stays below the noise of O.
double loss(const PackedTensor& o, const PackedTensor& w) {
  long double l = 0.0;
  for (size_t i = 0; i < o.size(); ++i) l += (long double)o.data[i] * w.data[i];
  return double(l);
}

TEST(ReferenceAttention, GradientsMatchCentralDifferences) {
  const int lengths[] = {3, 0, 6, 1, 5};
  const Documents docs = Documents::from_lengths(lengths);
  const int T = docs.total_tokens(), Hq = 4, Hkv = 2, D = 4;
  const double h = 1e-6;
  std::vector<AttentionShape> shapes = {{.causal = true}, {.causal = false}};
  for (const AttentionShape& s : windowed_and_capped_shapes()) shapes.push_back(s);
  for (const AttentionShape& shape : shapes) {
    const bool causal = shape.causal;
    SCOPED_TRACE(name_of(shape));
    PackedTensor q = random_tensor(T, Hq, D, 21), k = random_tensor(T, Hkv, D, 22), v = random_tensor(T, Hkv, D, 23);
    const PackedTensor w = random_tensor(T, Hq, D, 24);
    const ForwardOutputs fwd = reference_forward(q, k, v, docs, shape);
    const Gradients grads = reference_backward(q, k, v, fwd.o, fwd.lse, w, docs, shape);

    const auto check = [&](PackedTensor& x, const PackedTensor& dx, const char* name) {
      double worst = 0.0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x.data[i];
        x.data[i] = x0 + h;
        const double lp = loss(reference_forward(q, k, v, docs, shape).o, w);
        x.data[i] = x0 - h;
        const double lm = loss(reference_forward(q, k, v, docs, shape).o, w);
        x.data[i] = x0;
        const double numeric = (lp - lm) / (2 * h), analytic = dx.data[i];
        const double err = std::fabs(numeric - analytic) / std::max(std::fabs(analytic), 1e-2);
        worst = std::max(worst, err);
        ASSERT_LE(err, 1e-6) << name << "[" << i << "]: numeric " << numeric << " analytic " << analytic;
      }
      std::ostringstream worst_text;
      worst_text << std::scientific << worst;
      if (!shape.windowed() && shape.softcap == 0)
        RecordProperty(std::string("worst_relative_error_d") + name + (causal ? "_causal" : "_noncausal"),
                       worst_text.str());
    };
    check(q, grads.dq, "q");
    check(k, grads.dk, "k");
    check(v, grads.dv, "v");
  }
}

// Bitwise comparison of rows [t0, t1) of two tensors.
void expect_rows_identical(const PackedTensor& a, const PackedTensor& b, int t0, int t1, const char* name) {
  for (int t = t0; t < t1; ++t)
    for (int hh = 0; hh < a.heads; ++hh)
      for (int f = 0; f < a.dim; ++f)
        ASSERT_EQ(a.at(t, hh, f), b.at(t, hh, f)) << name << " token " << t << " head " << hh << " feature " << f;
}
void expect_rows_identical(const HeadTokenTensor& a, const HeadTokenTensor& b, int t0, int t1, const char* name) {
  for (int hh = 0; hh < a.heads; ++hh)
    for (int t = t0; t < t1; ++t) ASSERT_EQ(a.at(hh, t), b.at(hh, t)) << name << " head " << hh << " token " << t;
}

void perturb_rows(PackedTensor& x, int t0, int t1, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  for (int t = t0; t < t1; ++t)
    for (int hh = 0; hh < x.heads; ++hh)
      for (int f = 0; f < x.dim; ++f) x.at(t, hh, f) += normal(rng);
}

TEST(ReferenceAttention, DocumentsAreIsolatedBitwise) {
  const int lengths[] = {7, 0, 12, 5};
  const Documents docs = Documents::from_lengths(lengths);
  const int T = docs.total_tokens(), Hq = 4, Hkv = 2, D = 5, b = docs.begin(2), e = docs.end(2);
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const AttentionShape shape{causal, 0.0};
    const PackedTensor q = random_tensor(T, Hq, D, 31), k = random_tensor(T, Hkv, D, 32),
                       v = random_tensor(T, Hkv, D, 33), g = random_tensor(T, Hq, D, 34);
    const ForwardOutputs f0 = reference_forward(q, k, v, docs, shape);
    const Gradients g0 = reference_backward(q, k, v, f0.o, f0.lse, g, docs, shape);

    // Change everything outside document 2: documents 0 and 3 (the empty one holds no token).
    PackedTensor q1 = q, k1 = k, v1 = v, g1 = g;
    for (auto* x : {&q1, &k1, &v1, &g1}) {
      perturb_rows(*x, docs.begin(0), docs.end(0), 35);
      perturb_rows(*x, docs.begin(3), docs.end(3), 36);
    }
    const ForwardOutputs f1 = reference_forward(q1, k1, v1, docs, shape);
    const Gradients g1s = reference_backward(q1, k1, v1, f1.o, f1.lse, g1, docs, shape);
    expect_rows_identical(f0.o, f1.o, b, e, "o");
    expect_rows_identical(f0.lse, f1.lse, b, e, "lse");
    expect_rows_identical(g0.dq, g1s.dq, b, e, "dq");
    expect_rows_identical(g0.dk, g1s.dk, b, e, "dk");
    expect_rows_identical(g0.dv, g1s.dv, b, e, "dv");
    EXPECT_NE(f0.o.at(0, 0, 0), f1.o.at(0, 0, 0));  // the perturbed documents did change
    EXPECT_NE(g0.dk.at(T - 1, 0, 0), g1s.dk.at(T - 1, 0, 0));
  }
}

TEST(ReferenceAttention, CausalRowsDependOnlyOnTheirPrefix) {
  const int lengths[] = {6, 19, 4};
  const Documents docs = Documents::from_lengths(lengths);
  const int T = docs.total_tokens(), Hq = 4, Hkv = 2, D = 6;
  const AttentionShape shape{true, 0.0};
  const PackedTensor q = random_tensor(T, Hq, D, 41), k = random_tensor(T, Hkv, D, 42),
                     v = random_tensor(T, Hkv, D, 43), g = random_tensor(T, Hq, D, 44);
  const ForwardOutputs f0 = reference_forward(q, k, v, docs, shape);
  const Gradients g0 = reference_backward(q, k, v, f0.o, f0.lse, g, docs, shape);
  for (int local : {0, 1, 3, 4, 10, 17}) {
    const int i = docs.begin(1) + local;  // global position of local row `local` of document 1
    SCOPED_TRACE("prefix through token " + std::to_string(i));
    PackedTensor q1 = q, k1 = k, v1 = v;
    for (auto* x : {&q1, &k1, &v1}) perturb_rows(*x, i + 1, T, 45 + local);
    const ForwardOutputs f1 = reference_forward(q1, k1, v1, docs, shape);
    const Gradients g1 = reference_backward(q1, k1, v1, f1.o, f1.lse, g, docs, shape);
    expect_rows_identical(f0.o, f1.o, 0, i + 1, "o");
    expect_rows_identical(f0.lse, f1.lse, 0, i + 1, "lse");
    expect_rows_identical(g0.dq, g1.dq, 0, i + 1, "dq");
    EXPECT_NE(f0.o.at(i + 1, 0, 0), f1.o.at(i + 1, 0, 0));  // the row after the prefix did change
  }
}

void expect_invalid(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one naming \"" << fragment << "\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(ReferenceAttention, BadShapesThrowNamingTheArgument) {
  const int lengths[] = {3, 5};
  const Documents docs = Documents::from_lengths(lengths);
  const int T = 8, Hq = 4, Hkv = 2, D = 4;
  const PackedTensor q = random_tensor(T, Hq, D, 51), k = random_tensor(T, Hkv, D, 52), v = random_tensor(T, Hkv, D, 53);
  const AttentionShape shape;
  const auto fwd = [&](const PackedTensor& qq, const PackedTensor& kk, const PackedTensor& vv, const Documents& dd) {
    return [&, dd] { reference_forward(qq, kk, vv, dd, shape); };
  };
  const PackedTensor k_short(T - 1, Hkv, D), v_short(T - 1, Hkv, D), k_dim(T, Hkv, D + 1);
  const PackedTensor v_heads(T, 1, D), k3(T, 3, D), v3(T, 3, D);
  PackedTensor q_torn = q;
  q_torn.data.pop_back();
  const int other[] = {3, 4};
  expect_invalid(fwd(q, k_short, v, docs), "reference_forward: k has 7 tokens");
  expect_invalid(fwd(q, k, v_short, docs), "v has 7 tokens");
  expect_invalid(fwd(q, k_dim, v, docs), "k has head dim 5");
  expect_invalid(fwd(q, k, v_heads, docs), "v has 1 heads but k has 2");
  expect_invalid(fwd(q, k3, v3, docs), "q heads (4) must be a multiple of k/v heads (3)");
  expect_invalid(fwd(q, k, v, Documents::from_lengths(other)), "docs (cu_seqlens) cover 7 tokens");
  expect_invalid(fwd(q_torn, k, v, docs), "q holds 127 values");
  const int k_lengths[] = {4, 5}, one_doc[] = {9};
  const Documents k_docs = Documents::from_lengths(k_lengths), k_one = Documents::from_lengths(one_doc);
  expect_invalid([&] { reference_forward(q, k, v, docs, k_docs, shape); }, "k has 8 tokens but cu_seqlens_k covers 9");
  const PackedTensor k9 = random_tensor(9, Hkv, D, 55), v9 = random_tensor(9, Hkv, D, 56);
  expect_invalid([&] { reference_forward(q, k9, v, docs, k_docs, shape); }, "v has 8 tokens but cu_seqlens_k covers 9");
  expect_invalid([&] { reference_forward(q, k9, v9, docs, k_one, shape); },
                 "cu_seqlens_q holds 2 documents but cu_seqlens_k 1");
  EXPECT_NO_THROW(reference_forward(q, k9, v9, docs, k_docs, shape));
  expect_invalid(fwd(PackedTensor(T, Hq, 0), PackedTensor(T, Hkv, 0), PackedTensor(T, Hkv, 0), docs), "q must have");

  const ForwardOutputs f = reference_forward(q, k, v, docs, shape);
  const PackedTensor g = random_tensor(T, Hq, D, 54);
  const auto bwd = [&](const PackedTensor& o, const HeadTokenTensor& lse, const PackedTensor& dout) {
    return [&] { reference_backward(q, k, v, o, lse, dout, docs, shape); };
  };
  expect_invalid(bwd(PackedTensor(T, Hq, D + 1), f.lse, g), "reference_backward: o must have the shape of q");
  expect_invalid(bwd(f.o, f.lse, PackedTensor(T, Hq - 1, D)), "dout must have the shape of q");
  expect_invalid(bwd(f.o, HeadTokenTensor(Hq, T - 1), g), "lse must be [Hq, T]");
  expect_invalid(bwd(f.o, HeadTokenTensor(Hkv, T), g), "lse must be [Hq, T]");
  expect_invalid([&] { reference_backward(q, k_short, v, f.o, f.lse, g, docs, shape); },
                 "reference_backward: k has 7 tokens");
}

}  // namespace
}  // namespace flamia::reference
