#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "analysis/inputs.h"
#include "analysis/metrics.h"
#include "analysis/numerics.h"
#include "analysis/probe.h"
#include "core/tiling.h"
#include "reference/attention_fp64.h"
#include "reference/mxfp8_route.h"

namespace flamia::reference {
namespace {

using analysis::compare;

TrainingOutputs emulate(const analysis::AttentionInputs& in, const NumericsOptions& opt, bool causal = true) {
  return mxfp8_training(in.q, in.k, in.v, in.dout, in.docs, {.causal = causal}, opt);
}

// docs/DESIGN.md §4's cosine bars on one row of run_numerics: O >= 0.998, gradients >= 0.997.
void expect_bars(const analysis::NumericsRow& r) {
  if (r.tensor == "o") EXPECT_GE(r.cmp.cosine, 0.998);
  if (r.tensor == "dq" || r.tensor == "dk" || r.tensor == "dv") EXPECT_GE(r.cmp.cosine, 0.997);
}

// docs/DESIGN.md §4 bars on the configuration: 2 documents x 1024 tokens, causal, Hq = 4, D = 128,
// with both dQ reductions.
TEST(Mxfp8Route, MeetsTheAccuracyBarsOnTwoDocumentsOf1024) {
  const auto in = analysis::random_inputs({{1024, 1024}, 4, 4, 128}, 0);
  const auto rows = analysis::run_numerics(in, {.causal = true}, {NumericsOptions{}});
  ASSERT_EQ(rows.size(), 10u);
  for (const auto& r : rows) {
    SCOPED_TRACE(r.tensor + " " + r.backward);
    expect_bars(r);
    if (r.tensor == "lse") EXPECT_LT(r.cmp.max_abs, 0.2);
    // The fp16_partials row scale of U comes from a bound, not the key tile's max, so more of U's
    // smallest entries (which carry little of dQ) round to 0 (seen: 1.5%, against 0.007%).
    EXPECT_LT(r.stats.u_zero_fraction(), r.backward == "fp16_partials" ? 0.03 : 0.01);
    EXPECT_LT(r.stats.row_residual_rms(), 0.01);
    EXPECT_EQ(r.stats.saturated_p + r.stats.saturated_u, 0);  // boost 2^8 and ceil U scales never clip
  }
}

// A training loss that ignores a document's last label gives that token an all-zero dO row, and
// real dO values are small (here ~2^-20). With per-token scales (prefix mode) the zero row is its
// own scale group; it must not pull the dV fold reference gamma (the document's largest dO
// exponent) up to an arbitrary exponent and round every other row's dV operand to zero. A query
// head whose dO is zero in a whole document (head 3 in document 1; GQA 4/2) must not either.
TEST(Mxfp8Route, AllZeroDoutRowsDoNotDisableTheDvFold) {
  auto in = analysis::random_inputs({{300, 212}, 4, 2, 64}, 3);
  for (double& x : in.dout.data) x = std::ldexp(x, -20);
  for (int doc = 0; doc < in.docs.count(); ++doc)
    for (int h = 0; h < in.dout.heads; ++h)
      for (int f = 0; f < in.dout.dim; ++f) in.dout.at(in.docs.begin(doc) + in.docs.length(doc) - 1, h, f) = 0.0;
  for (int t = in.docs.begin(1); t < in.docs.begin(1) + in.docs.length(1); ++t)
    for (int f = 0; f < in.dout.dim; ++f) in.dout.at(t, 3, f) = 0.0;
  const AttentionShape shape{.causal = true};
  const auto exact = reference_forward(in.q, in.k, in.v, in.docs, shape);
  const auto exact_grads = reference_backward(in.q, in.k, in.v, exact.o, exact.lse, in.dout, in.docs, shape);
  for (Isolation mode : {Isolation::kDocument, Isolation::kPrefix}) {
    NumericsOptions opt;
    opt.isolation = mode;
    const TrainingOutputs c = emulate(in, opt);
    SCOPED_TRACE(std::string(to_string(mode)));
    EXPECT_GE(compare(c.grads.dv.data, exact_grads.dv.data).cosine, 0.997);
    EXPECT_GE(compare(c.grads.dq.data, exact_grads.dq.data).cosine, 0.997);
    EXPECT_GE(compare(c.grads.dk.data, exact_grads.dk.data).cosine, 0.997);
  }
}

// Awkward packed shapes (lengths 1, 31, 32, 33, 127, 129, unaligned starts), GQA and MQA, causal
// and not, every option combination of both routes: each stays close to FP64 everywhere.
class Mxfp8RouteShapes : public ::testing::TestWithParam<std::tuple<int, bool, int>> {};

TEST_P(Mxfp8RouteShapes, TracksTheFp64Reference) {
  const auto [kv_heads, causal, config] = GetParam();
  const auto in = analysis::random_inputs({{1, 31, 32, 33, 127, 129, 3}, 4, kv_heads, 64}, 17);
  const AttentionShape shape{.causal = causal};
  const auto exact = reference_forward(in.q, in.k, in.v, in.docs, shape);
  const auto exact_grads = reference_backward(in.q, in.k, in.v, exact.o, exact.lse, in.dout, in.docs, shape);
  NumericsOptions opt = analysis::default_numerics_configs()[config];
  if (!causal && opt.isolation == Isolation::kPrefix) {  // no causal mask: every query reads its future
    EXPECT_THROW(emulate(in, opt, causal), std::invalid_argument);
    return;
  }
  const TrainingOutputs c = emulate(in, opt, causal);
  // The mixed route's 4-bit scores (E2M1: one mantissa bit, logits ~2^-3 relative error) cost
  // about 0.004 of cosine everywhere (seen on these shapes: O 0.9949, dQ 0.9927, dV 0.9948).
  const bool fp4 = opt.route == Route::kNvfp4Mixed;
  EXPECT_GT(compare(c.fwd.o.data, exact.o.data).cosine, fp4 ? 0.992 : 0.998);
  // natural-log units; E4M3 logits carry ~2^-5 relative error
  EXPECT_LT(compare(c.fwd.lse.data, exact.lse.data).max_abs, fp4 ? 0.6 : 0.2);
  EXPECT_GT(compare(c.grads.dq.data, exact_grads.dq.data).cosine, fp4 ? 0.99 : 0.995);
  EXPECT_GT(compare(c.grads.dk.data, exact_grads.dk.data).cosine, fp4 ? 0.99 : 0.995);
  EXPECT_GT(compare(c.grads.dv.data, exact_grads.dv.data).cosine, fp4 ? 0.992 : 0.997);
}

INSTANTIATE_TEST_SUITE_P(GqaMqaMhaCausalConfigs, Mxfp8RouteShapes,
                         ::testing::Combine(::testing::Values(4, 2, 1), ::testing::Bool(),
                                            ::testing::Range(0, int(analysis::default_numerics_configs().size()))));

TEST(Mxfp8Route, HadamardRotationKeepsAccuracyAndRotatesGradientsBack) {
  const auto in = analysis::random_inputs({{200, 70}, 2, 2, 128}, 4);
  const AttentionShape shape{.causal = true};
  const auto exact = reference_forward(in.q, in.k, in.v, in.docs, shape);
  const auto exact_grads = reference_backward(in.q, in.k, in.v, exact.o, exact.lse, in.dout, in.docs, shape);
  NumericsOptions opt;
  opt.hadamard = true;
  const TrainingOutputs c = emulate(in, opt);
  EXPECT_GT(compare(c.fwd.o.data, exact.o.data).cosine, 0.998);
  EXPECT_GT(compare(c.grads.dq.data, exact_grads.dq.data).cosine, 0.996);
  EXPECT_GT(compare(c.grads.dk.data, exact_grads.dk.data).cosine, 0.996);
}

TEST(Mxfp8Route, NonFiniteInputReachesExactlyTheRowsThatSeeIt) {
  auto in = analysis::random_inputs({{40, 40}, 2, 2, 32}, 8);
  in.v.at(10, 0, 3) = NAN;  // document 0, kv head 0, position 10
  for (ScaleGeometry geometry : {ScaleGeometry::kBlock32, ScaleGeometry::kToken}) {
    NumericsOptions opt;
    opt.scale_geometry = geometry;
    const TrainingOutputs c = emulate(in, opt);
    // The NaN poisons its scale group: all of V[0, 32) under block32, only V[10] per token. A causal
    // row reads it when the group holds a key <= the row; other heads and documents stay finite.
    const int first_poisoned_row = geometry == ScaleGeometry::kBlock32 ? 0 : 10;
    for (int t = 0; t < 80; ++t) {
      const bool poisoned = t >= first_poisoned_row && t < 40;
      for (int f = 0; f < 32; ++f) {
        ASSERT_EQ(std::isnan(c.fwd.o.at(t, 0, f)), poisoned) << to_string(geometry) << " row " << t;
        ASSERT_FALSE(std::isnan(c.fwd.o.at(t, 1, f))) << "head 1 reads kv head 1";
        ASSERT_EQ(std::isnan(c.grads.dq.at(t, 0, f)), poisoned) << "dQ reads V through E = dO.V^T and D = dO.O";
        ASSERT_FALSE(std::isnan(c.grads.dv.at(t, 0, f))) << "dV = P^T dO does not read V";
      }
    }
  }
}

TEST(Mxfp8Route, PrefixModeRejectsOptionsThatCannotBePrefixSafe) {
  const auto in = analysis::random_inputs({{8}, 1, 1, 64}, 1);
  NumericsOptions prefix;
  prefix.isolation = Isolation::kPrefix;
  const auto qin = quantize_inputs(in.q, in.k, in.v, in.docs, prefix);
  EXPECT_THROW(mxfp8_forward(qin, in.docs, {.causal = false}, prefix), std::invalid_argument);
  prefix.u_scale = UScaleGeometry::kSquare32;
  EXPECT_THROW(mxfp8_forward(qin, in.docs, {.causal = true}, prefix), std::invalid_argument);
  NumericsOptions big_boost;
  big_boost.p_boost_log2 = 9;
  EXPECT_THROW(mxfp8_forward(qin, in.docs, {.causal = true}, big_boost), std::invalid_argument);
}

TEST(Mxfp8Route, PrefixModeUsesPerTokenScales) {
  NumericsOptions opt;
  opt.isolation = Isolation::kPrefix;
  EXPECT_EQ(opt.effective_geometry(), ScaleGeometry::kToken);
  EXPECT_TRUE(opt.interior_codes());
  opt.scale_geometry = ScaleGeometry::kToken;
  EXPECT_FALSE(opt.interior_codes());
  opt.isolation = Isolation::kDocument;
  EXPECT_EQ(opt.effective_geometry(), ScaleGeometry::kToken);
  opt.scale_geometry = ScaleGeometry::kBlock32;
  EXPECT_EQ(opt.effective_geometry(), ScaleGeometry::kBlock32);
  EXPECT_FALSE(opt.interior_codes());
}

// Prefix isolation with block32 geometry reads K's and V's block32 codes on interior pairs (the key
// kFrontierTiles 128-token tiles or more before the query's) and their per-token codes on the
// others. Against prefix isolation with token geometry (per-token codes on every pair): the rows
// of a document's first kFrontierTiles tiles see no interior pair and agree bitwise, in O, LSE and
// dQ; the later rows read other codes and differ; and K and V's second encoding is the block32
// one of document mode.
TEST(Mxfp8Route, PrefixModeReadsBlock32CodesOnInteriorPairsOnly) {
  auto in = analysis::random_inputs({{420, 90}, 2, 1, 64}, 5);
  // Tokens of unequal size, so that a group's scale pushes its small tokens' codes toward the
  // subnormals (on equal-sized tokens the two encodings mostly decode to the same values).
  for (int t = 0; t < in.k.tokens; ++t)
    for (int f = 0; f < in.k.dim; ++f) {
      in.k.at(t, 0, f) = std::ldexp(in.k.at(t, 0, f), -3 * (t % 5));
      in.v.at(t, 0, f) = std::ldexp(in.v.at(t, 0, f), -3 * ((t + 2) % 5));
    }
  NumericsOptions interior, token, document;
  interior.isolation = token.isolation = Isolation::kPrefix;
  token.scale_geometry = ScaleGeometry::kToken;
  const auto qin = quantize_inputs(in.q, in.k, in.v, in.docs, interior);
  ASSERT_TRUE(qin.has_interior_codes());
  EXPECT_FALSE(quantize_inputs(in.q, in.k, in.v, in.docs, token).has_interior_codes());
  const auto block = quantize_inputs(in.q, in.k, in.v, in.docs, document);
  EXPECT_EQ(qin.k_interior.codes, block.k.codes);
  EXPECT_EQ(qin.k_interior.scales, block.k.scales);
  EXPECT_EQ(qin.v_interior.codes, block.v.codes);
  EXPECT_EQ(qin.v_interior.scales, block.v.scales);
  EXPECT_NE(qin.k.scales, block.k.scales);  // the frontier's codes are per token

  const TrainingOutputs a = emulate(in, interior), b = emulate(in, token);
  int later_rows_differ = 0;
  for (int doc = 0; doc < in.docs.count(); ++doc)
    for (int p = 0; p < in.docs.length(doc); ++p) {
      const int t = in.docs.begin(doc) + p;
      bool same = true;
      for (int h = 0; h < in.q.heads; ++h) {
        same = same && a.fwd.lse.at(h, t) == b.fwd.lse.at(h, t);
        for (int f = 0; f < in.q.dim; ++f)
          same = same && a.fwd.o.at(t, h, f) == b.fwd.o.at(t, h, f) && a.grads.dq.at(t, h, f) == b.grads.dq.at(t, h, f);
      }
      if (p < tiling::kFrontierTile * tiling::kFrontierTiles) {
        EXPECT_TRUE(same) << "document " << doc << " row " << p << " has no interior pair";
      } else {
        later_rows_differ += !same;
      }
    }
  EXPECT_GT(later_rows_differ, (420 - tiling::kFrontierTile * tiling::kFrontierTiles) / 2);
}

// The isolation contract (docs/DESIGN.md §3) on the CPU emulation, with the probe's controls.
class IsolationProbe : public ::testing::TestWithParam<std::tuple<ScaleGeometry, ScaleRule, int>> {};

TEST_P(IsolationProbe, PrefixModeIsBitwiseStableAndTheLeakIsVisibleInDocumentMode) {
  analysis::ProbeOptions o;
  std::tie(o.scale_geometry, o.scale_rule, o.kv_heads) = GetParam();
  o.head_dim = 64;
  const auto cases = analysis::run_probe(o);
  ASSERT_EQ(cases.size(), 12u);
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.mode)) + "/" + c.control + "/" + c.tensor);
    EXPECT_GT(c.compared, 0);
    if (c.mode == Isolation::kPrefix || c.control == "other_document") {
      EXPECT_TRUE(c.bitwise_equal);
      EXPECT_EQ(c.max_abs_change, 0.0);
    }
    // Token geometry has no straddling group, so document mode is prefix-safe there too; with
    // block32 the suffix control must show the leak in O and dQ.
    if (c.mode == Isolation::kDocument && c.control == "suffix" && c.tensor != "lse") {
      EXPECT_EQ(c.bitwise_equal, o.scale_geometry == ScaleGeometry::kToken);
    }
  }
  std::string why;
  EXPECT_EQ(analysis::probe_passes(cases, &why), o.scale_geometry == ScaleGeometry::kBlock32) << why;
}

std::string probe_param_name(const ::testing::TestParamInfo<IsolationProbe::ParamType>& info) {
  const auto& [geometry, rule, kv_heads] = info.param;
  return std::string(to_string(geometry)) + "_" + std::string(to_string(rule)) + "_kv" + std::to_string(kv_heads);
}

INSTANTIATE_TEST_SUITE_P(GeometryRuleHeads, IsolationProbe,
                         ::testing::Combine(::testing::Values(ScaleGeometry::kBlock32, ScaleGeometry::kToken),
                                            ::testing::Values(ScaleRule::kCeil, ScaleRule::kFloor), ::testing::Values(4, 1)),
                         probe_param_name);

// With a sliding window and soft-capped scores the contract holds as it does without: prefix mode
// bitwise stable, the leak visible in document mode (the window, 96 keys back, still holds the
// keys of the probed row's 32-token group).
TEST(IsolationProbe, HoldsUnderASlidingWindowAndSoftcap) {
  for (const AttentionShape& shape : {AttentionShape{.causal = true, .window_left = 96},
                                      AttentionShape{.causal = true, .softcap = 5.0},
                                      AttentionShape{.causal = true, .window_left = 40, .softcap = 5.0}}) {
    SCOPED_TRACE("window " + std::to_string(shape.window_left) + ", softcap " + std::to_string(shape.softcap));
    analysis::ProbeOptions o;
    o.head_dim = 64;
    const auto cases = analysis::run_probe(o, {}, analysis::emulated_probe_call_for(shape));
    std::string why;
    EXPECT_TRUE(analysis::probe_passes(cases, &why)) << why;
  }
}

// Windowed and soft-capped calls meet the accuracy bars against the FP64 reference under the same
// shape (both dQ reductions where causal), and a window's out-of-reach keys do not touch a row:
// with per-token scales (no group spans the window's edge) changing K and V before row i's window
// leaves O_i, LSE_i and dQ_i bitwise as they were.
TEST(Mxfp8Route, WindowsAndSoftcapMeetTheBarsAndKeysOutsideTheWindowDoNotReachARow) {
  const auto in = analysis::random_inputs({{700, 333}, 4, 2, 64}, 3);
  for (const AttentionShape& shape : {AttentionShape{.causal = true, .window_left = 128},
                                      AttentionShape{.causal = false, .window_left = 50, .window_right = 70},
                                      AttentionShape{.causal = true, .softcap = 8.0},
                                      AttentionShape{.causal = true, .window_left = 200, .softcap = 8.0}}) {
    SCOPED_TRACE("causal " + std::to_string(shape.causal) + " window (" + std::to_string(shape.window_left) + ", " +
                 std::to_string(shape.window_right) + ") softcap " + std::to_string(shape.softcap));
    const auto rows = analysis::run_numerics(in, shape, {NumericsOptions{}});
    ASSERT_EQ(rows.size(), shape.causal ? 10u : 5u);
    for (const auto& r : rows) {
      SCOPED_TRACE(r.tensor + " " + r.backward);
      expect_bars(r);
    }
  }
  const AttentionShape shape{.causal = true, .window_left = 100};
  NumericsOptions token;
  token.scale_geometry = ScaleGeometry::kToken;
  token.dq_reduction = DqReduction::kDeterministic;
  const TrainingOutputs base = mxfp8_training(in.q, in.k, in.v, in.dout, in.docs, shape, token);
  const int row = 400;  // document 0; its window starts at key 300
  analysis::AttentionInputs moved = in;
  for (int j = 0; j < row - shape.window_left; ++j)
    for (auto* x : {&moved.k, &moved.v})
      for (int h = 0; h < x->heads; ++h)
        for (int f = 0; f < x->dim; ++f) x->at(j, h, f) = -2.0 * x->at(j, h, f) + 0.5;
  const TrainingOutputs after = mxfp8_training(moved.q, moved.k, moved.v, moved.dout, moved.docs, shape, token);
  for (int h = 0; h < in.q.heads; ++h) {
    EXPECT_EQ(base.fwd.lse.at(h, row), after.fwd.lse.at(h, row));
    for (int f = 0; f < in.q.dim; ++f) {
      EXPECT_EQ(base.fwd.o.at(row, h, f), after.fwd.o.at(row, h, f));
      EXPECT_EQ(base.grads.dq.at(row, h, f), after.grads.dq.at(row, h, f));
    }
  }
  EXPECT_NE(base.fwd.o.at(250, 0, 0), after.fwd.o.at(250, 0, 0));  // a row whose window holds them moves
}

// V with a head dim of its own (DeepSeek-style 192/128, here 96/64): the bars against FP64, O, dO
// and dV with V's features, a mismatched dO refused.
TEST(Mxfp8Route, ValueHeadDimOfItsOwnMeetsTheBars) {
  const auto in = analysis::random_inputs({{300, 211}, 4, 2, 96, 64}, 5);
  ASSERT_EQ(in.v.dim, 64);
  ASSERT_EQ(in.dout.dim, 64);
  const auto rows = analysis::run_numerics(in, {.causal = true}, {NumericsOptions{}});
  ASSERT_EQ(rows.size(), 10u);
  for (const auto& r : rows) {
    SCOPED_TRACE(r.tensor + " " + r.backward);
    expect_bars(r);
  }
  const TrainingOutputs out = emulate(in, NumericsOptions{});
  EXPECT_EQ(out.fwd.o.dim, 64);
  EXPECT_EQ(out.grads.dq.dim, 96);
  EXPECT_EQ(out.grads.dk.dim, 96);
  EXPECT_EQ(out.grads.dv.dim, 64);
  const QuantizedInputs codes = quantize_inputs(in.q, in.k, in.v, in.docs, NumericsOptions{});
  const PackedTensor wrong_dout(in.q.tokens, in.q.heads, 96);
  try {
    mxfp8_backward(codes, out.fwd, wrong_dout, in.docs, {.causal = true}, NumericsOptions{});
    ADD_FAILURE() << "a dO with q's head dim instead of v's was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("dout must have the shape of q with v's head dim"), std::string::npos);
  }
}

// Tokens t0 .. t1 - 1 of x, all heads.
PackedTensor token_rows(const PackedTensor& x, int t0, int t1) {
  PackedTensor out(t1 - t0, x.heads, x.dim);
  std::copy(x.row(t0, 0), x.row(t1, 0), out.data.begin());
  return out;
}
std::vector<double> head_rows(const HeadTokenTensor& x, int h, int t0, int t1) {
  std::vector<double> out;
  for (int t = t0; t < t1; ++t) out.push_back(x.at(h, t));
  return out;
}
void expect_gradient_bars(const Gradients& g, const Gradients& exact) {
  EXPECT_GE(compare(g.dq.data, exact.dq.data).cosine, 0.997);
  EXPECT_GE(compare(g.dk.data, exact.dk.data).cosine, 0.997);
  EXPECT_GE(compare(g.dv.data, exact.dv.data).cosine, 0.997);
}

// Documents with their own key lengths (cu_seqlens_k): a query chunk that starts on a 128-token tile
// and attends its document's key prefix gets bitwise the whole call's O, LSE and dQ rows (scale
// groups, tiles and fold references all count from the same starts), in both dQ reductions; with
// the chunk before it (its own prefix), the chunks' dK and dV add up to the whole call's.
TEST(Mxfp8Route, QueryChunksOverTheirKeyPrefixGiveTheWholeCallsRows) {
  const auto in = analysis::random_inputs({{768}, 4, 2, 64}, 11);
  const AttentionShape shape{.causal = true};
  const int cut = 256, T = 768;
  const int first[] = {cut}, rest[] = {T - cut}, all[] = {T};
  const Documents first_docs = Documents::from_lengths(first), rest_docs = Documents::from_lengths(rest),
                  all_docs = Documents::from_lengths(all);
  const auto exact = reference_forward(in.q, in.k, in.v, in.docs, shape);
  const auto exact_grads = reference_backward(in.q, in.k, in.v, exact.o, exact.lse, in.dout, in.docs, shape);
  NumericsOptions deterministic;
  deterministic.dq_reduction = DqReduction::kDeterministic;
  for (const NumericsOptions& opt : {NumericsOptions{}, deterministic}) {
    SCOPED_TRACE(to_string(opt.dq_reduction));
    const TrainingOutputs whole = mxfp8_training(in.q, in.k, in.v, in.dout, in.docs, shape, opt);
    const TrainingOutputs tail = mxfp8_training(token_rows(in.q, cut, T), in.k, in.v, token_rows(in.dout, cut, T),
                                                rest_docs, all_docs, shape, opt);
    EXPECT_EQ(tail.fwd.o.data, token_rows(whole.fwd.o, cut, T).data);
    EXPECT_EQ(tail.grads.dq.data, token_rows(whole.grads.dq, cut, T).data);
    for (int h = 0; h < in.q.heads; ++h) EXPECT_EQ(head_rows(tail.fwd.lse, h, 0, T - cut), head_rows(whole.fwd.lse, h, cut, T));
    ASSERT_EQ(tail.grads.dk.tokens, T);
    const TrainingOutputs head = mxfp8_training(token_rows(in.q, 0, cut), token_rows(in.k, 0, cut),
                                                token_rows(in.v, 0, cut), token_rows(in.dout, 0, cut), first_docs,
                                                first_docs, shape, opt);
    Gradients merged = tail.grads;
    for (int t = 0; t < cut; ++t)
      for (int g = 0; g < in.k.heads; ++g)
        for (int f = 0; f < in.k.dim; ++f) {
          merged.dk.at(t, g, f) += head.grads.dk.at(t, g, f);
          merged.dv.at(t, g, f) += head.grads.dv.at(t, g, f);
        }
    merged.dq = whole.grads.dq;
    expect_gradient_bars(merged, exact_grads);
    EXPECT_GE(compare(merged.dk.data, whole.grads.dk.data).cosine, 0.9995);
    EXPECT_GE(compare(merged.dv.data, whole.grads.dv.data).cosine, 0.9995);
  }
}

// Fewer keys than queries in one document and more in the other, causal (bottom-right) and not:
// the bars against the FP64 reference with the same documents; a causal row before its document's
// first key gets O = 0, LSE = -inf and dQ = 0.
TEST(Mxfp8Route, DocumentsWithTheirOwnKeyLengthsMeetTheBars) {
  const int q_lengths[] = {300, 100}, k_lengths[] = {200, 180};
  const Documents q_docs = Documents::from_lengths(q_lengths), k_docs = Documents::from_lengths(k_lengths);
  const auto qs = analysis::random_inputs({{300, 100}, 4, 2, 64}, 21);
  const auto ks = analysis::random_inputs({{200, 180}, 4, 2, 64}, 22);
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const AttentionShape shape{.causal = causal};
    const auto exact = reference_forward(qs.q, ks.k, ks.v, q_docs, k_docs, shape);
    const auto exact_grads =
        reference_backward(qs.q, ks.k, ks.v, exact.o, exact.lse, qs.dout, q_docs, k_docs, shape);
    const TrainingOutputs out = mxfp8_training(qs.q, ks.k, ks.v, qs.dout, q_docs, k_docs, shape, NumericsOptions{});
    EXPECT_GE(compare(out.fwd.o.data, exact.o.data).cosine, 0.998);
    expect_gradient_bars(out.grads, exact_grads);
    ASSERT_EQ(out.grads.dk.tokens, 380);
    for (int p = 0; p < 300; ++p) {
      const bool empty = causal && p < 100;  // query p sits at key p - 100
      EXPECT_EQ(std::isinf(out.fwd.lse.at(0, p)) && out.fwd.lse.at(0, p) < 0, empty) << p;
      if (empty)
        for (int f = 0; f < 64; ++f) {
          EXPECT_EQ(out.fwd.o.at(p, 1, f), 0.0);
          EXPECT_EQ(out.grads.dq.at(p, 1, f), 0.0);
        }
    }
  }
}

TEST(Mxfp8Route, DocumentsWithTheirOwnKeyLengthsRefuseWhatTheyCannotServe) {
  const int q_lengths[] = {64, 64}, k_lengths[] = {32, 96}, one[] = {128};
  const Documents q_docs = Documents::from_lengths(q_lengths), k_docs = Documents::from_lengths(k_lengths),
                  one_doc = Documents::from_lengths(one);
  const auto in = analysis::random_inputs({{64, 64}, 2, 2, 64}, 31);
  auto expect_refused = [](auto call, const std::string& message) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected: " << message;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  NumericsOptions prefix;
  prefix.isolation = Isolation::kPrefix;
  expect_refused([&] { mxfp8_training(in.q, in.k, in.v, in.dout, q_docs, k_docs, {.causal = true}, prefix); },
                 "isolation=prefix needs the same documents for queries and keys");
  expect_refused([&] { mxfp8_training(in.q, in.k, in.v, in.dout, q_docs, one_doc, {}, NumericsOptions{}); },
                 "cu_seqlens_q holds 2 documents but cu_seqlens_k 1");
  const int short_k[] = {32, 64};
  const Documents short_docs = Documents::from_lengths(short_k);
  expect_refused([&] { mxfp8_training(in.q, in.k, in.v, in.dout, q_docs, short_docs, {}, NumericsOptions{}); },
                 "k and v have 128 and 128 tokens but cu_seqlens_k covers 96");
  // Equal documents given as two objects: served, bitwise the one-object call.
  const Documents copy = Documents::from_lengths(q_lengths);
  const TrainingOutputs a = mxfp8_training(in.q, in.k, in.v, in.dout, q_docs, copy, {}, prefix);
  const TrainingOutputs b = mxfp8_training(in.q, in.k, in.v, in.dout, q_docs, {}, prefix);
  EXPECT_EQ(a.fwd.o.data, b.fwd.o.data);
  EXPECT_EQ(a.grads.dk.data, b.grads.dk.data);
}

// The default probed row reads prefix isolation's interior codes (keys kFrontierTiles tiles back),
// so the probe covers both of K's and V's encodings.
TEST(IsolationProbe, DefaultPositionReachesTheInteriorCodes) {
  const analysis::ProbeOptions o;
  EXPECT_TRUE(tiling::interior_pair(o.position, 0));
  EXPECT_FALSE(tiling::interior_pair(o.position, o.position));
}

TEST(IsolationProbe, RejectsPositionsWithoutASuffix) {
  analysis::ProbeOptions o;
  o.position = o.lengths[1] - 1;
  EXPECT_THROW(analysis::check_probe_options(o), std::invalid_argument);
}

}  // namespace
}  // namespace flamia::reference
