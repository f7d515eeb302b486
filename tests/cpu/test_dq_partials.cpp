// dQ by boosted FP16 partials: the per-row factors (core/dq_partials.h) and the emulation of the
// fp16_partials backward (reference::mxfp8_backward with NumericsOptions::uses_fp16_partials).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "analysis/inputs.h"
#include "analysis/metrics.h"
#include "core/dq_partials.h"
#include "core/tiling.h"
#include "formats/minifloat.h"
#include "formats/scales.h"
#include "reference/attention_fp64.h"
#include "reference/mxfp8_route.h"

namespace flamia::reference {
namespace {

using analysis::compare;
using dq_partials::RowFactors;
using dq_partials::RowInputs;
using dq_partials::row_factors;

constexpr double kUBound = formats::kE4M3Max * (1.0 + 0x1p-20);  // float inputs of the bound: 2^-20 slack
constexpr double kAccBound = 0x1p15;

bool same_bits(const PackedTensor& a, const PackedTensor& b) {
  return a.data.size() == b.data.size() && std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(double)) == 0;
}

// ---------------------------------------------------------------------------------------------
// row_factors

TEST(DqRowFactors, ZeroDoutRowGetsTheSmallestScaleAndNoBoost) {
  for (int dim : {64, 128}) {
    const RowFactors f = row_factors({0.f, -127, 0.f, 0.5f, 3, -2, false}, dim);
    EXPECT_EQ(f.sigma, formats::encode_ue8m0(formats::kMinScaleExponent));
    EXPECT_EQ(f.beta, 0);
    // A real dO scale on an all-zero code row (D_i = 0 too) is the same: U is 0.
    const RowFactors g = row_factors({0.f, 5, 0.f, 1.f, 10, 10, false}, dim);
    EXPECT_EQ(g.sigma, 0x00);
    EXPECT_EQ(g.beta, 0);
  }
}

TEST(DqRowFactors, NonFiniteInputsGiveTheNaNScale) {
  const RowInputs ok{100.f, 0, 1.f, 0.5f, 0, 0, false};
  EXPECT_NE(row_factors(ok, 128).sigma, formats::kUe8m0NaN);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  RowInputs in = ok;
  in.nan_scale = true;
  EXPECT_EQ(row_factors(in, 128).sigma, formats::kUe8m0NaN);
  in = ok, in.delta = nan;
  EXPECT_EQ(row_factors(in, 128).sigma, formats::kUe8m0NaN);
  in = ok, in.p_max = nan;
  EXPECT_EQ(row_factors(in, 128).sigma, formats::kUe8m0NaN);
  in = ok, in.code_norm = nan;
  EXPECT_EQ(row_factors(in, 128).sigma, formats::kUe8m0NaN);
  in = ok, in.delta = inf;  // an infinite D_i: the bound r is infinite
  EXPECT_EQ(row_factors(in, 128).sigma, formats::kUe8m0NaN);
}

TEST(DqRowFactors, ExtremeInputsClampWithoutOverflow) {
  const float huge = std::numeric_limits<float>::max(), denorm = std::numeric_limits<float>::denorm_min();
  // Largest scales and values: the U scale saturates at the largest UE8M0 code, the boost at -kMaxBoost.
  RowFactors f = row_factors({float(448 * std::sqrt(128.0)), 127, huge, 1.f, 127, 127, false}, 128);
  EXPECT_EQ(f.sigma, formats::encode_ue8m0(formats::kMaxScaleExponent));
  EXPECT_EQ(f.beta, -dq_partials::kMaxBoost);
  // Smallest: the U scale clamps to the smallest code, the boost to +kMaxBoost.
  f = row_factors({0x1p-9f, -127, denorm, 1e-30f, -127, -127, false}, 128);
  EXPECT_EQ(f.sigma, 0x00);
  EXPECT_EQ(f.beta, dq_partials::kMaxBoost);
  // Only D_i, and so small that the bound underflows: U and dQ are 0 (BF16 flushes far above it).
  f = row_factors({0.f, 0, denorm, 1.f, 0, 0, false}, 64);
  EXPECT_EQ(f.sigma, 0x00);
  EXPECT_EQ(f.beta, 0);
  // Moderate inputs sit well inside both clamps: the boost is exact arithmetic on the exponents.
  f = row_factors({1024.f, 0, 0.f, 1.f, 0, 0, false}, 128);  // r = 2^10 2^13, exactly a power of two
  EXPECT_EQ(f.beta, dq_partials::kAccumulatorLog2 - (dq_partials::kPartialCodeLog2 + 0 + 23));
  EXPECT_EQ(formats::ue8m0_exponent(f.sigma), 23 - 8);  // 2^23 / 2^15 = 256 <= 448 < 512
}

// Random rows of codes and scales, U formed exactly as the backward forms it: the factors bound
// the folded U by 448 2^sigma and keep every boosted partial and FP16 sum below 2^15.
TEST(DqRowFactors, BoundsHoldOnRandomRows) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> exponent(-60, 40), keys_of(1, 400), spread(0, 12);
  const auto codes_row = [&](int dim, double amp) {  // E4M3 values, up to 448 in magnitude
    std::vector<double> r(dim);
    for (double& x : r) x = formats::round_e4m3(std::clamp(normal(rng) * amp, -448.0, 448.0));
    return r;
  };
  double worst_ratio = 0.0, worst_acc = 0.0;
  for (int trial = 0; trial < 600; ++trial) {
    const int dim = trial % 2 ? 128 : 64, n = keys_of(rng);
    const double amp = std::ldexp(1.0, spread(rng) - 4);  // codes from tiny to saturating
    const std::vector<double> cg = codes_row(dim, amp);
    const int eg = exponent(rng);
    std::vector<std::vector<double>> cv(n), ck(n);
    std::vector<int> ev(n), ek(n);
    for (int j = 0; j < n; ++j) {
      cv[j] = codes_row(dim, amp), ck[j] = codes_row(dim, amp);
      ev[j] = exponent(rng) / 4, ek[j] = exponent(rng) / 4;
    }
    // Softmax of random logits, sharp or flat; p_max = 1 / l with l relative to the max.
    const double temperature = std::ldexp(1.0, spread(rng) - 6);
    std::vector<double> s(n), p(n);
    double m = -INFINITY, l = 0.0;
    for (int j = 0; j < n; ++j) m = std::max(m, s[j] = normal(rng) / temperature);
    for (int j = 0; j < n; ++j) l += p[j] = std::exp(s[j] - m);
    for (double& x : p) x /= l;
    // O as the forward would give it (up to rounding), D_i = G^ . O, E_ij = G^ . V_j.
    std::vector<double> o(dim, 0.0), e(n);
    for (int j = 0; j < n; ++j)
      for (int f = 0; f < dim; ++f) o[f] += p[j] * cv[j][f] * std::ldexp(1.0, ev[j]);
    double Di = 0.0, code_sq = 0.0;
    for (int f = 0; f < dim; ++f) Di += cg[f] * formats::round_to_bf16(o[f]), code_sq += cg[f] * cg[f];
    Di *= std::ldexp(1.0, eg);
    for (int j = 0; j < n; ++j) {
      double dot = 0.0;
      for (int f = 0; f < dim; ++f) dot += cg[f] * cv[j][f];
      e[j] = dot * std::ldexp(1.0, eg + ev[j]);
    }
    const RowInputs in{float(std::sqrt(code_sq)), eg, float(Di), float(1.0 / l),
                       *std::max_element(ek.begin(), ek.end()), *std::max_element(ev.begin(), ev.end()), false};
    const RowFactors fct = row_factors(in, dim);
    ASSERT_NE(fct.sigma, formats::kUe8m0NaN);
    const double sigma = formats::decode_ue8m0(fct.sigma);
    std::vector<double> acc(dim, 0.0), partial(dim);
    for (int j0 = 0; j0 < n; j0 += tiling::kBwdKeyTile) {
      std::fill(partial.begin(), partial.end(), 0.0);
      for (int j = j0; j < std::min(n, j0 + tiling::kBwdKeyTile); ++j) {
        const double w = p[j] * (e[j] - Di) * std::ldexp(1.0, ek[j]);
        worst_ratio = std::max(worst_ratio, std::fabs(w) / sigma);
        ASSERT_LE(std::fabs(w) / sigma, kUBound) << "trial " << trial << " key " << j;
        const double wt = formats::decode_scaled_e4m3(formats::encode_scaled_e4m3(w, fct.sigma), fct.sigma);
        for (int f = 0; f < dim; ++f) partial[f] += wt * ck[j][f];
      }
      for (int f = 0; f < dim; ++f) {
        const double p16 = formats::round_to_fp16(std::ldexp(partial[f], fct.beta));
        acc[f] = formats::round_to_fp16(acc[f] + p16);
        worst_acc = std::max({worst_acc, std::fabs(p16), std::fabs(acc[f])});
        ASSERT_LT(std::fabs(p16), kAccBound) << "trial " << trial;
        ASSERT_LT(std::fabs(acc[f]), kAccBound) << "trial " << trial;
      }
    }
  }
  // The bounds are not vacuous: U reaches 448 2^sigma within a factor ~2^5 (seen: 17), the sums
  // 2^15 within ~2^10 (seen: 56; the row norms overestimate |E - D| and |dQ|).
  EXPECT_GT(worst_ratio, 448.0 / 64);
  EXPECT_GT(worst_acc, 0x1p15 / 2048);
}

// ---------------------------------------------------------------------------------------------
// The emulated backward

TrainingOutputs emulate(const analysis::AttentionInputs& in, NumericsOptions opt, DqReduction reduction,
                        bool causal = true) {
  opt.dq_reduction = reduction;
  return mxfp8_training(in.q, in.k, in.v, in.dout, in.docs, {.causal = causal}, opt);
}

Gradients exact_gradients(const analysis::AttentionInputs& in, bool causal = true) {
  const AttentionShape shape{.causal = causal};
  const auto exact = reference_forward(in.q, in.k, in.v, in.docs, shape);
  return reference_backward(in.q, in.k, in.v, exact.o, exact.lse, in.dout, in.docs, shape);
}

bool all_finite(const PackedTensor& t) {
  return std::all_of(t.data.begin(), t.data.end(), [](double x) { return std::isfinite(x); });
}

// Both reductions on the same inputs: fp16_partials meets the bars (docs/DESIGN.md §4) against FP64
// (or, where the route itself cannot, is as close to FP64 as the deterministic dQ), stays close to
// the deterministic dQ, leaves dK and dV bitwise alone, and its U and FP16 sums stay inside the
// bounds of core/dq_partials.h, well above FP16's subnormals.
void expect_partials_track(const analysis::AttentionInputs& in, const Gradients& exact, bool route_meets_bars = true) {
  const TrainingOutputs det = emulate(in, {}, DqReduction::kDeterministic);
  const TrainingOutputs fp16 = emulate(in, {}, DqReduction::kFp16Partials);
  ASSERT_TRUE(all_finite(fp16.grads.dq)) << "no NaN or Inf that the inputs did not have";
  const double cos_ref = compare(fp16.grads.dq.data, exact.dq.data).cosine;
  const double cos_det = compare(fp16.grads.dq.data, det.grads.dq.data).cosine;
  ::testing::Test::RecordProperty("cos_dq_fp16_vs_fp64", std::to_string(cos_ref));
  ::testing::Test::RecordProperty("cos_dq_fp16_vs_deterministic", std::to_string(cos_det));
  const double det_ref = compare(det.grads.dq.data, exact.dq.data).cosine;
  if (route_meets_bars) {
    EXPECT_GE(cos_ref, 0.997) << "fp16_partials dQ vs FP64 (deterministic: " << det_ref << ")";
    EXPECT_GE(compare(fp16.grads.dk.data, exact.dk.data).cosine, 0.997);
    EXPECT_GE(compare(fp16.grads.dv.data, exact.dv.data).cosine, 0.997);
  } else {
    EXPECT_NEAR(cos_ref, det_ref, 1e-3) << "no further from FP64 than the deterministic dQ";
  }
  EXPECT_GE(cos_det, 0.9999);
  EXPECT_TRUE(same_bits(fp16.grads.dk, det.grads.dk));
  EXPECT_TRUE(same_bits(fp16.grads.dv, det.grads.dv));
  EXPECT_FALSE(same_bits(fp16.grads.dq, det.grads.dq)) << "the fp16_partials reduction ran";
  EXPECT_EQ(fp16.stats.saturated_u, 0);
  EXPECT_LE(fp16.stats.dq_u_ratio_max, kUBound);
  EXPECT_GE(fp16.stats.dq_u_ratio_max, 1.0) << "sigma is not far above what U needs";
  EXPECT_LT(fp16.stats.dq_acc_max, kAccBound);
  EXPECT_GE(fp16.stats.dq_acc_max, 16.0) << "the boost lifts the sums far above FP16's subnormals (< 2^-14)";
  EXPECT_EQ(det.stats.dq_acc_max, 0.0);
}

// A key far larger than the rest at each document's start (as trained models' first tokens often
// are): the bound's running max of K's scales then sits above most keys' scales for every later row,
// so U~ keeps fewer of their small entries; dQ must still track the deterministic one. (The route
// itself misses the bars here, in both reductions: the outlier's block32 group scale leaves its 31
// neighbours few bits; dQ cosine vs FP64 0.896.)
TEST(Fp16Partials, OutlierFirstKeysStillTrackTheDeterministicDq) {
  auto in = analysis::random_inputs({{700, 500}, 4, 2, 128}, 57);
  for (int d = 0; d < in.docs.count(); ++d)
    for (int h = 0; h < in.k.heads; ++h)
      for (int f = 0; f < in.k.dim; ++f) in.k.at(in.docs.begin(d), h, f) *= 32.0;
  expect_partials_track(in, exact_gradients(in), /*route_meets_bars=*/false);
}

class Fp16PartialsShapes : public ::testing::TestWithParam<int> {};

// Unaligned documents (1, 31, 33, 129, 700 tokens: partial key tiles, rows of one key) and GQA 4/2.
TEST_P(Fp16PartialsShapes, MeetsTheBarsAndTracksTheDeterministicDq) {
  const auto in = analysis::random_inputs({{1, 31, 33, 129, 700}, 4, 2, GetParam()}, 31);
  expect_partials_track(in, exact_gradients(in));
}
INSTANTIATE_TEST_SUITE_P(HeadDims, Fp16PartialsShapes, ::testing::Values(128, 64));

// Inputs whose dQ would overflow or underflow FP16 without the per-row boost.
class Fp16PartialsRange : public ::testing::TestWithParam<int> {};

TEST_P(Fp16PartialsRange, BoostKeepsTheSumsInRange) {
  auto in = analysis::random_inputs({{300, 200}, 4, 2, 64}, 41);
  const auto scale = [](PackedTensor& t, double by) {
    for (double& x : t.data) x = formats::round_to_bf16(x * by);  // still BF16 inputs
  };
  switch (GetParam()) {
    case 0: scale(in.q, 30), scale(in.k, 30); break;  // logits x900: one-hot rows, large dS
    case 1: scale(in.dout, 1e3); break;               // dQ ~ 1e3: FP16 sums of unboosted partials overflow
    case 2: scale(in.dout, 1e-6); break;              // dQ ~ 1e-6: unboosted partials are FP16 subnormals
  }
  // Logits with a spread of ~900 lose their order to E4M3's 2^-4 relative error: the route (either
  // reduction) cannot meet the bars there (seen: dQ cosine 0.03), only agree with itself.
  expect_partials_track(in, exact_gradients(in), GetParam() != 0);
}
INSTANTIATE_TEST_SUITE_P(QkTimes30DoutTimes1e3DoutTimes1e6, Fp16PartialsRange, ::testing::Values(0, 1, 2));

// A document of identical tokens (q, k and v the same on every token of it): every row's P is
// uniform and E_ij = D_i, so dQ is 0. The emulation gets it exactly: equal logits give p = 1
// exactly, so O = V exactly, D_i = E_ij and U = 0, which the row's bounds (far above it) must
// keep at 0, not NaN (0 times an infinite scale). Beside a random document the call meets the bars.
TEST(Fp16Partials, ConstantRowsStayFiniteAndSmall) {
  auto in = analysis::random_inputs({{257, 300}, 4, 2, 128}, 43);
  for (int t = 1; t < 257; ++t) {
    std::copy_n(in.q.row(0, 0), 4 * 128, in.q.row(t, 0));
    std::copy_n(in.k.row(0, 0), 2 * 128, in.k.row(t, 0));
    std::copy_n(in.v.row(0, 0), 2 * 128, in.v.row(t, 0));
  }
  const Gradients exact = exact_gradients(in);
  const TrainingOutputs fp16 = emulate(in, {}, DqReduction::kFp16Partials);
  const TrainingOutputs det = emulate(in, {}, DqReduction::kDeterministic);
  ASSERT_TRUE(all_finite(fp16.grads.dq));
  EXPECT_GE(compare(fp16.grads.dq.data, exact.dq.data).cosine, 0.997);
  EXPECT_TRUE(same_bits(fp16.grads.dk, det.grads.dk));
  EXPECT_LE(fp16.stats.dq_u_ratio_max, kUBound);
  EXPECT_LT(fp16.stats.dq_acc_max, kAccBound);
  const auto rms = [](const PackedTensor& x, int t0, int t1) {
    double s = 0.0;
    for (int t = t0; t < t1; ++t)
      for (int h = 0; h < x.heads; ++h)
        for (int f = 0; f < x.dim; ++f) s += x.at(t, h, f) * x.at(t, h, f);
    return std::sqrt(s / (double(t1 - t0) * x.heads * x.dim));
  };
  const double constant_doc = rms(fp16.grads.dq, 0, 257), random_doc = rms(fp16.grads.dq, 257, 557);
  EXPECT_GT(random_doc, 0.01);
  EXPECT_EQ(constant_doc, 0.0);
  EXPECT_EQ(rms(det.grads.dq, 0, 257), 0.0);
  EXPECT_LT(rms(exact.dq, 0, 257), 1e-12 * random_doc) << "the exact dQ of the constant document is ~0";
  EXPECT_GT(fp16.stats.dq_acc_max, 0.0) << "the random document's rows ran the FP16 sums";
}

// ---------------------------------------------------------------------------------------------
// Which calls take it, and what it needs

TEST(Fp16Partials, PrefixIsolationNonCausalAndSquaresTakeTheDeterministicReduction) {
  const auto in = analysis::random_inputs({{70, 200}, 4, 2, 64}, 5);
  NumericsOptions prefix;
  prefix.isolation = Isolation::kPrefix;
  NumericsOptions squares;
  squares.u_scale = UScaleGeometry::kSquare32;
  struct Case {
    const char* name;
    NumericsOptions opt;
    bool causal;
  } cases[] = {{"prefix", prefix, true}, {"non-causal", {}, false}, {"square32", squares, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_FALSE(c.opt.uses_fp16_partials(c.causal));
    const TrainingOutputs fp16 = emulate(in, c.opt, DqReduction::kFp16Partials, c.causal);
    const TrainingOutputs det = emulate(in, c.opt, DqReduction::kDeterministic, c.causal);
    EXPECT_TRUE(same_bits(fp16.grads.dq, det.grads.dq));
    EXPECT_TRUE(same_bits(fp16.grads.dk, det.grads.dk));
    EXPECT_TRUE(same_bits(fp16.grads.dv, det.grads.dv));
    EXPECT_EQ(fp16.stats.u_zeroed, det.stats.u_zeroed);
  }
  EXPECT_TRUE(NumericsOptions{}.uses_fp16_partials(true)) << "the default: document isolation, causal";
}

TEST(Fp16Partials, OptionNamesRoundTrip) {
  for (DqReduction r : {DqReduction::kDeterministic, DqReduction::kFp16Partials})
    EXPECT_EQ(parse_option<DqReduction>(to_string(r)), r);
  EXPECT_EQ(to_string(DqReduction::kFp16Partials), "fp16_partials");
  EXPECT_EQ(to_string(DqReduction::kDeterministic), "deterministic");
  EXPECT_FALSE(parse_option<DqReduction>("fp16"));
}

TEST(Fp16Partials, ForwardSavesTheRowMaxProbability) {
  const auto in = analysis::random_inputs({{1, 150, 0, 20}, 2, 1, 64}, 9);
  const NumericsOptions opt;
  const AttentionShape shape{.causal = true};
  const auto qin = quantize_inputs(in.q, in.k, in.v, in.docs, opt);
  const ForwardOutputs fwd = mxfp8_forward(qin, in.docs, shape, opt);
  const ForwardOutputs exact = reference_forward(in.q, in.k, in.v, in.docs, shape);
  ASSERT_EQ(fwd.row_max_prob.heads, 2);
  ASSERT_EQ(fwd.row_max_prob.tokens, in.docs.total_tokens());
  for (int h = 0; h < 2; ++h)
    for (int doc = 0; doc < in.docs.count(); ++doc)
      for (int t = in.docs.begin(doc); t < in.docs.end(doc); ++t) {
        const double pmax = fwd.row_max_prob.at(h, t);
        ASSERT_EQ(pmax, double(float(pmax))) << "saved as FP32";
        if (t == in.docs.begin(doc)) EXPECT_EQ(pmax, 1.0) << "a row of one key";
        ASSERT_GT(pmax, 0.0);
        ASSERT_LE(pmax, 1.0);
        // exp(max_j s_ij - LSE_i) from the FP64 forward: the same up to the logits' quantization.
        double m = -INFINITY;
        const double sc = shape.scale_for(64);
        for (int j = in.docs.begin(doc); j <= t; ++j) {
          double s = 0.0;
          for (int f = 0; f < 64; ++f) s += in.q.at(t, h, f) * in.k.at(j, 0, f);
          m = std::max(m, s * sc);
        }
        EXPECT_NEAR(std::log(pmax), m - exact.lse.at(h, t), 0.2) << "head " << h << " token " << t;
      }
}

TEST(Fp16Partials, RefusesAForwardWithoutRowMaxProbability) {
  const auto in = analysis::random_inputs({{40}, 2, 2, 64}, 2);
  const NumericsOptions opt;
  const AttentionShape shape{.causal = true};
  const auto qin = quantize_inputs(in.q, in.k, in.v, in.docs, opt);
  ForwardOutputs fwd = mxfp8_forward(qin, in.docs, shape, opt);
  fwd.row_max_prob = {};
  try {
    mxfp8_backward(qin, fwd, in.dout, in.docs, shape, opt);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("row_max_prob"), std::string::npos) << e.what();
  }
  NumericsOptions det = opt;
  det.dq_reduction = DqReduction::kDeterministic;
  EXPECT_NO_THROW(mxfp8_backward(qin, fwd, in.dout, in.docs, shape, det));
  EXPECT_NO_THROW(mxfp8_backward(qin, fwd, in.dout, in.docs, {.causal = false}, opt)) << "non-causal: deterministic";
}

// A NaN scale makes sigma NaN: the rows that read it get a NaN dQ in every feature (not zeros),
// and the rows that do not stay finite.
TEST(Fp16Partials, NaNScalesGiveNaNRowsExactly) {
  auto in = analysis::random_inputs({{150, 60}, 2, 2, 64}, 12);
  in.dout.at(20, 1, 5) = NAN;  // dO row 20, head 1 (per-token scale of dO row: block32 group [0, 32))
  in.k.at(140, 0, 3) = NAN;    // K key 140 of kv head 0: block32 group [128, 150)
  // Where U_ij is 0 or finite, the NaN scale still decodes to NaN, and the NaN reaches the sums.
  EXPECT_TRUE(std::isnan(formats::decode_scaled_e4m3(formats::encode_scaled_e4m3(0.0, formats::kUe8m0NaN),
                                                     formats::kUe8m0NaN)));
  EXPECT_TRUE(std::isnan(formats::round_to_fp16(0.0 + formats::round_to_fp16(std::ldexp(double(NAN), 5)))));
  const TrainingOutputs c = emulate(in, {}, DqReduction::kFp16Partials);
  for (int t = 0; t < 210; ++t)
    for (int h = 0; h < 2; ++h) {
      // dO's block32 group [0, 32) of head 1 has a NaN scale: rows 0..31; K's group [128, 150) of
      // kv head 0 is read by rows >= 128 of document 0 (causal).
      const bool nan_row = (h == 1 && t < 32) || (h == 0 && t >= 128 && t < 150);
      for (int f = 0; f < 64; ++f)
        ASSERT_EQ(std::isnan(c.grads.dq.at(t, h, f)), nan_row) << "token " << t << " head " << h << " feature " << f;
    }
}

}  // namespace
}  // namespace flamia::reference
