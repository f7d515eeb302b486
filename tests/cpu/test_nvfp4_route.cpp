// The mixed NVFP4/FP8 route of the CPU emulation (docs/NUMERICS.md, "The mixed NVFP4/FP8 route"):
// its scale rules, the score it computes, which codes each product reads, its accuracy and its
// isolation.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "analysis/inputs.h"
#include "analysis/numerics.h"
#include "analysis/probe.h"
#include "formats/minifloat.h"
#include "formats/scales.h"
#include "reference/mxfp8_route.h"

namespace flamia::reference {
namespace {

NumericsOptions mixed(bool hadamard = false, Isolation isolation = Isolation::kDocument) {
  NumericsOptions o;
  o.route = Route::kNvfp4Mixed;
  o.hadamard = hadamard;
  o.isolation = isolation;
  return o;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

TEST(Nvfp4Scales, FollowTheDocumentedRules) {
  using namespace formats;
  // s2 = FP32(amax / 2688); an all-zero token takes 1, a non-finite one NaN.
  EXPECT_EQ(nvfp4_token_scale(2688.0), 1.0f);
  EXPECT_EQ(nvfp4_token_scale(0.0), 1.0f);
  EXPECT_TRUE(std::isnan(nvfp4_token_scale(INFINITY)));
  EXPECT_EQ(nvfp4_token_scale(1.0), float(1.0 / 2688.0));
  // The block holding the token's amax gets the scale 448; a block 100x smaller E4M3(4.48) = 4.5.
  const float s2 = nvfp4_token_scale(3.0);
  EXPECT_EQ(decode(kE4M3, nvfp4_block_scale(3.0, s2)), 448.0);
  EXPECT_EQ(decode(kE4M3, nvfp4_block_scale(0.03, s2)), 4.5);
  // Codes round to nearest even on E2M1's lattice {0, 0.5, 1, 1.5, 2, 3, 4, 6} and saturate at 6.
  const uint8_t b = encode(kE4M3, 1.0);
  EXPECT_EQ(nvfp4_value(nvfp4_code(2.5, b, 1.0f), b, 1.0f), 2.0);   // tie to even
  EXPECT_EQ(nvfp4_value(nvfp4_code(-5.1, b, 1.0f), b, 1.0f), -6.0);
  EXPECT_EQ(nvfp4_value(nvfp4_code(9.0, b, 1.0f), b, 1.0f), 6.0);   // saturates
  EXPECT_EQ(nvfp4_value(nvfp4_code(0.2, b, 1.0f), b, 1.0f), 0.0);
  // A zero block scale stores signed zeros.
  EXPECT_EQ(nvfp4_code(-1.0, 0, 1.0f), kE2M1.sign_bit());
}

// S = sum over blocks of (bq bk) * (codes . codes), times s2q s2k: the route's LSE is the log-sum-exp
// of the decoded NVFP4 operands' dot products, not of the E4M3 ones.
TEST(Nvfp4MixedRoute, ScoresComeFromTheDecodedNvfp4Operands) {
  const auto in = analysis::random_inputs({{40, 23}, 2, 1, 64}, 4);
  const AttentionShape shape{.causal = true};
  const auto qin = quantize_inputs(in.q, in.k, in.v, in.docs, mixed());
  const auto fwd = mxfp8_forward(qin, in.docs, shape, mixed());
  const auto qin8 = quantize_inputs(in.q, in.k, in.v, in.docs, NumericsOptions{});
  const auto fwd8 = mxfp8_forward(qin8, in.docs, shape, NumericsOptions{});
  const double scale = shape.scale_for(64);
  double largest_route_difference = 0.0;
  for (int d = 0; d < in.docs.count(); ++d)
    for (int h = 0; h < 2; ++h)
      for (int p = 0; p < in.docs.length(d); ++p) {
        const int i = in.docs.begin(d) + p;
        double m = -INFINITY, l = 0.0;
        std::vector<double> s(p + 1);
        for (int j = 0; j <= p; ++j) {
          double dot = 0.0;
          for (int f = 0; f < 64; ++f) dot += qin.q_score.value(i, h, f) * qin.k_score.value(in.docs.begin(d) + j, 0, f);
          m = std::max(m, s[j] = dot * scale);
        }
        for (double x : s) l += std::exp(x - m);
        EXPECT_NEAR(fwd.lse.at(h, i), m + std::log(l), 1e-6 * (1 + std::fabs(m)));
        largest_route_difference = std::max(largest_route_difference, std::fabs(fwd.lse.at(h, i) - fwd8.lse.at(h, i)));
      }
  EXPECT_GT(largest_route_difference, 1e-3);  // E2M1 is far coarser than E4M3
}

// Which codes each product reads: S the NVFP4 codes, dQ = U.K K's E4M3 codes, dK = U^T.Q Q's
// E4M3 codes. Zeroing one E4M3 operand's codes zeroes exactly its gradient product.
TEST(Nvfp4MixedRoute, GradientProductsReadTheE4m3CodesAndNothingElseDoes) {
  const auto in = analysis::random_inputs({{150, 90}, 4, 2, 64}, 6);
  const AttentionShape shape{.causal = true};
  const NumericsOptions opt = mixed();
  const auto qin = quantize_inputs(in.q, in.k, in.v, in.docs, opt);
  const auto fwd = mxfp8_forward(qin, in.docs, shape, opt);
  const auto grads = mxfp8_backward(qin, fwd, in.dout, in.docs, shape, opt);
  for (const bool zero_k : {true, false}) {
    SCOPED_TRACE(zero_k ? "E4M3 K zeroed" : "E4M3 Q zeroed");
    QuantizedInputs z = qin;
    auto& codes = zero_k ? z.k.codes : z.q.codes;
    std::fill(codes.begin(), codes.end(), uint8_t(0));
    const auto fz = mxfp8_forward(z, in.docs, shape, opt);
    const auto gz = mxfp8_backward(z, fz, in.dout, in.docs, shape, opt);
    EXPECT_TRUE(same_bits(fz.o.data, fwd.o.data));
    EXPECT_TRUE(same_bits(fz.lse.data, fwd.lse.data));
    EXPECT_TRUE(same_bits(gz.dv.data, grads.dv.data));
    const auto& zeroed = zero_k ? gz.dq : gz.dk;
    const auto& kept = zero_k ? gz.dk : gz.dq;
    const auto& kept_before = zero_k ? grads.dk : grads.dq;
    for (double x : zeroed.data) ASSERT_EQ(x, 0.0);
    EXPECT_TRUE(same_bits(kept.data, kept_before.data));
  }
}

TEST(Nvfp4MixedRoute, KeepsTheDeterministicDqReductionAndRejectsMismatchedInputs) {
  EXPECT_TRUE(NumericsOptions{}.uses_fp16_partials(true));
  EXPECT_FALSE(mixed().uses_fp16_partials(true));
  const auto in = analysis::random_inputs({{40}, 2, 2, 64}, 1);
  const AttentionShape shape{.causal = true};
  const auto qin8 = quantize_inputs(in.q, in.k, in.v, in.docs, NumericsOptions{});
  EXPECT_THROW(mxfp8_forward(qin8, in.docs, shape, mixed()), std::invalid_argument);
  EXPECT_THROW(check_options({shape, mixed()}, 24), std::invalid_argument);
  EXPECT_EQ(parse_option<Route>("nvfp4_mixed"), Route::kNvfp4Mixed);
  EXPECT_EQ(to_string(Route::kNvfp4Mixed), "nvfp4_mixed");
  EXPECT_FALSE(parse_option<Route>("nvfp4").has_value());
}

// Accuracy against FP64 on 2 x 512 tokens: below MXFP8 (4-bit scores) but within a few thousandths
// of it, with and without the Hadamard rotation, and gradients rotated back.
TEST(Nvfp4MixedRoute, AccuracyLiesJustBelowMxfp8WithAndWithoutHadamard) {
  const auto in = analysis::random_inputs({{512, 512}, 2, 2, 128}, 0);
  const auto rows = analysis::run_numerics(in, {.causal = true}, analysis::route_comparison_configs());
  std::map<std::string, double> cos;
  for (const auto& r : rows)
    if (r.backward == "deterministic") cos[r.route + (r.hadamard ? "+h " : " ") + r.tensor] = r.cmp.cosine;
  for (const char* h : {" ", "+h "}) {
    for (const char* t : {"o", "dq", "dk", "dv"}) {
      SCOPED_TRACE(std::string(h) + t);
      const double m8 = cos["mxfp8" + std::string(h) + t], m4 = cos["nvfp4_mixed" + std::string(h) + t];
      EXPECT_GE(m8, 0.997);
      EXPECT_LT(m4, m8);  // the score operands lose 2 mantissa bits
      EXPECT_GE(m4, t == std::string("o") ? 0.99 : 0.985);
    }
  }
}

// Isolation with the probe's controls: prefix mode bitwise stable, other documents never seen,
// document mode's leak visible (through V's, K's E4M3 and dO's block32 groups); with per-token
// scales for every loaded operand (token geometry) document mode has no suffix path: the NVFP4
// score operands are token-local.
class Nvfp4Probe : public ::testing::TestWithParam<std::tuple<ScaleGeometry, bool>> {};

TEST_P(Nvfp4Probe, PrefixModeIsBitwiseStableAndDocumentModeLeaksOnlyThroughBlock32) {
  analysis::ProbeOptions o;
  std::tie(o.scale_geometry, o.hadamard) = GetParam();
  o.route = Route::kNvfp4Mixed;
  o.head_dim = 64;
  const auto cases = analysis::run_probe(o);
  ASSERT_EQ(cases.size(), 12u);
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.mode)) + "/" + c.control + "/" + c.tensor);
    if (c.mode == Isolation::kPrefix || c.control == "other_document") EXPECT_TRUE(c.bitwise_equal);
    if (c.mode == Isolation::kDocument && c.control == "suffix" && c.tensor != "lse")
      EXPECT_EQ(c.bitwise_equal, o.scale_geometry == ScaleGeometry::kToken);
    // The score operands are per token, so LSE (a function of S alone) never moves.
    if (c.tensor == "lse") EXPECT_TRUE(c.bitwise_equal);
  }
  std::string why;
  EXPECT_EQ(analysis::probe_passes(cases, &why), o.scale_geometry == ScaleGeometry::kBlock32) << why;
}

INSTANTIATE_TEST_SUITE_P(GeometryHadamard, Nvfp4Probe,
                         ::testing::Combine(::testing::Values(ScaleGeometry::kBlock32, ScaleGeometry::kToken),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_hadamard" : "_plain");
                         });

}  // namespace
}  // namespace flamia::reference
