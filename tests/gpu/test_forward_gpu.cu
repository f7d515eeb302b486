// GPU forward vs the CPU emulation (the spec), the FP64 reference (the accuracy bars) and the
// isolation contract. Tolerances against the emulation: the GPU accumulates in FP32 (FP8 MMA) and
// uses exp2f, so p can land on the other side of an E4M3 rounding boundary now and then; that moves
// single P codes by one step (2^-4 relative) and O by far less.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "analysis/metrics.h"
#include "analysis/probe.h"
#include "forward_harness.h"
#include "graph_capture.h"
#include "reference/attention_fp64.h"
#include "reference/mxfp8_route.h"

namespace flamia::gpu_test {
namespace {

using analysis::compare;

constexpr double kMinCosineVsEmulation = 0.99999;
constexpr double kMaxRelL2VsEmulation = 5e-3;
constexpr double kMaxLseDiffVsEmulation = 2e-3;

// Unaligned starts everywhere, and empty documents (idle tile slots) in the middle and at the end.
const std::vector<int> kAwkwardLengths = {1, 31, 32, 0, 33, 127, 129, 1000, 4097, 0};
// The same below the mean document length from which the consumers take turns (kernel_problem.h's
// kTurnsFromMeanDocument), so that block32 runs the forward's short-document kernel instance (no
// turns, lean steps; kAwkwardLengths run it with per-token scales only).
const std::vector<int> kShortLengths = {1, 31, 32, 0, 33, 127, 129, 255, 300, 0};

struct Case {
  int q_heads, kv_heads, dim;
  bool causal;
  int config;  // index into analysis::default_numerics_configs() (rowcol U only: the forward ignores U)
  bool short_documents = false;  // kShortLengths instead of kAwkwardLengths
};

class ForwardVsEmulation : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardVsEmulation, MatchesTheEmulationAndMeetsTheBars) {
  FLAMIA_REQUIRE_GPU();
  const Case c = GetParam();
  const NumericsOptions opt = analysis::default_numerics_configs()[c.config];
  if (!c.causal && opt.isolation == Isolation::kPrefix) GTEST_SKIP() << "prefix isolation needs causal";
  const auto in = analysis::random_inputs({c.short_documents ? kShortLengths : kAwkwardLengths, c.q_heads, c.kv_heads,
                                           c.dim},
                                          1234 + c.config);
  const reference::AttentionShape shape{.causal = c.causal};

  ForwardCall call(in, opt, c.causal);
  const auto gpu = call.run();
  const auto qin = reference::quantize_inputs(in.q, in.k, in.v, in.docs, opt);
  const auto emu = reference::mxfp8_forward(qin, in.docs, shape, opt);
  const auto exact = reference::reference_forward(in.q, in.k, in.v, in.docs, shape);

  const auto o_emu = compare(gpu.o.data, emu.o.data), lse_emu = compare(gpu.lse.data, emu.lse.data);
  const auto o_ref = compare(gpu.o.data, exact.o.data);
  RecordProperty("cos_o_vs_emulation", std::to_string(o_emu.cosine));
  RecordProperty("cos_o_vs_fp64", std::to_string(o_ref.cosine));
  EXPECT_GE(o_emu.cosine, kMinCosineVsEmulation);
  EXPECT_LE(o_emu.rel_l2, kMaxRelL2VsEmulation);
  EXPECT_LE(lse_emu.max_abs, kMaxLseDiffVsEmulation);
  EXPECT_GE(o_ref.cosine, 0.998);  // docs/DESIGN.md §4 bar
  for (double x : gpu.o.data) ASSERT_TRUE(std::isfinite(x)) << "every output element is written and finite";
}

std::vector<Case> forward_cases() {
  std::vector<Case> cases;
  for (int config = 0; config < 4; ++config) cases.push_back({16, 4, 128, true, config});  // GQA 16/4
  cases.push_back({16, 1, 128, true, 0});   // MQA
  cases.push_back({4, 4, 64, true, 0});     // MHA, D = 64
  cases.push_back({4, 2, 64, true, 3});     // prefix, D = 64
  cases.push_back({8, 2, 128, false, 0});   // non-causal
  cases.push_back({8, 2, 64, false, 2});    // non-causal, floor
  for (int config = 0; config < 4; ++config) cases.push_back({16, 4, 128, true, config, true});  // short documents
  cases.push_back({4, 4, 64, true, 2, true});     // short documents, D = 64, floor
  cases.push_back({8, 2, 128, false, 0, true});   // short documents, non-causal
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ForwardVsEmulation, ::testing::ValuesIn(forward_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           const Case& c = i.param;
                           return "H" + std::to_string(c.q_heads) + "x" + std::to_string(c.kv_heads) + "_D" +
                                  std::to_string(c.dim) + (c.causal ? "_causal" : "_full") + "_cfg" +
                                  std::to_string(c.config) + (c.short_documents ? "_short" : "");
                         });

// The isolation probe on the GPU: O and LSE (dQ arrives with the backward).
TEST(ForwardProbe, PrefixModeAndOtherDocumentsAreBitwiseStable) {
  FLAMIA_REQUIRE_GPU();
  for (int kv_heads : {2, 1}) {
    analysis::ProbeOptions o;
    o.kv_heads = kv_heads;
    const auto cases = analysis::run_probe(o, {}, [](const analysis::AttentionInputs& in, const NumericsOptions& opt) {
      return ForwardCall(in, opt, true).run();
    });
    std::string why;
    EXPECT_TRUE(analysis::probe_passes(cases, &why)) << why;
    for (const auto& c : cases) {
      RecordProperty(std::string(to_string(c.mode)) + "_" + c.control + "_" + c.tensor, std::to_string(c.max_abs_change));
      if (c.mode == Isolation::kPrefix || c.control == "other_document") EXPECT_TRUE(c.bitwise_equal) << c.tensor;
    }
  }
}

TEST(Forward, IsDeterministicAndReplaysIdenticallyFromACudaGraph) {
  FLAMIA_REQUIRE_GPU();
  const auto in = analysis::random_inputs({{300, 77, 1000}, 8, 2, 128}, 5);
  ForwardCall call(in, NumericsOptions{}, true);
  const auto first = call.run();
  const auto second = call.run();
  EXPECT_EQ(0, std::memcmp(first.o.data.data(), second.o.data.data(), first.o.data.size() * sizeof(double)));

  FLAMIA_CUDA_CHECK(cudaMemset(call.o.buffer.get(), 0xFF, call.o.buffer.bytes()));
  CapturedCall graph([&](cudaStream_t s, flamia_error* e) { return call.launch(s, e); });
  ASSERT_TRUE(graph.ok()) << graph.message();
  graph.replay(3);
  const auto replay = download_bf16(call.o);
  EXPECT_EQ(0, std::memcmp(first.o.data.data(), replay.data.data(), first.o.data.size() * sizeof(double)));
}

TEST(Forward, NonFiniteInputStaysInsideItsScaleGroupAndDocument) {
  FLAMIA_REQUIRE_GPU();
  auto in = analysis::random_inputs({{200, 100}, 4, 4, 64}, 9);
  in.v.at(150, 0, 7) = NAN;  // document 0, position 150: group [128, 160)
  for (Isolation mode : {Isolation::kDocument, Isolation::kPrefix}) {
    NumericsOptions opt;
    opt.isolation = mode;
    const auto gpu = ForwardCall(in, opt, true).run();
    const int first_nan = mode == Isolation::kPrefix ? 150 : 128;
    for (int t = 0; t < 300; ++t) {
      const bool expect_nan = t >= first_nan && t < 200;
      EXPECT_EQ(std::isnan(gpu.o.at(t, 0, 0)), expect_nan) << to_string(mode) << " row " << t;
      EXPECT_FALSE(std::isnan(gpu.o.at(t, 1, 0))) << "head 1 reads another kv head";
    }
  }
}

// Masked tiles fold P with v_pow_j row_pow_i where a warp's rows allow it and from the exponents
// where V's scale jumps too far within the item (here by ~2^130, past where v_pow_j = 2^(ev_j - c)
// overflows): both ways give the same bits, so in prefix isolation a jump after row 199 (which moves
// the warp of rows 192..207 to the exponent way) leaves rows 0..199 bitwise unchanged, and the rows
// after it still match the emulation.
TEST(Forward, MaskedTilesFoldTheSameAcrossAWideVScaleJump) {
  FLAMIA_REQUIRE_GPU();
  constexpr int kJump = 200;
  const auto base = analysis::random_inputs({{300, 40}, 2, 2, 64}, 11);
  auto small = base, jump = base;
  for (int t = 0; t < 340; ++t)
    for (int h = 0; h < 2; ++h)
      for (int f = 0; f < 64; ++f) {
        small.v.at(t, h, f) = std::ldexp(base.v.at(t, h, f), -100);
        jump.v.at(t, h, f) = std::ldexp(base.v.at(t, h, f), t >= kJump && t < 300 ? 30 : -100);
      }
  NumericsOptions opt;
  opt.isolation = Isolation::kPrefix;
  const auto before = ForwardCall(small, opt, true).run();
  const auto after = ForwardCall(jump, opt, true).run();
  for (int t = 0; t < 340; ++t)
    for (int h = 0; h < 2; ++h) {
      if (t >= kJump && t < 300) continue;
      for (int f = 0; f < 64; ++f)
        ASSERT_EQ(before.o.at(t, h, f), after.o.at(t, h, f)) << "token " << t << " head " << h << " feature " << f;
      ASSERT_EQ(before.lse.at(h, t), after.lse.at(h, t)) << "token " << t << " head " << h;
    }
  for (Isolation mode : {Isolation::kPrefix, Isolation::kDocument}) {
    opt.isolation = mode;
    const auto gpu = mode == Isolation::kPrefix ? after : ForwardCall(jump, opt, true).run();
    const auto emu = reference::mxfp8_forward(reference::quantize_inputs(jump.q, jump.k, jump.v, jump.docs, opt),
                                              jump.docs, reference::AttentionShape{.causal = true}, opt);
    for (double x : gpu.o.data) ASSERT_TRUE(std::isfinite(x)) << to_string(mode);
    EXPECT_GE(compare(gpu.o.data, emu.o.data).cosine, kMinCosineVsEmulation) << to_string(mode);
  }
}

// Grouped interior tiles take V's fold in the exponent with both exponents clamped at 2^-32
// (forward.cu, GroupFold): a V group far below the running max of V's scales (tokens 0..127 at
// 2^-60) and rows whose running max jumps far above the item's first row (tokens 300.. at 2^+60)
// clamp e_g and b_i. Their P codes are 0 either way, and the row sums must still hold every p: the
// LSE (which does not depend on V) and O, row range by row range, match the emulation.
TEST(Forward, GroupedTilesKeepEveryRowSumWhereTheFoldClamps) {
  FLAMIA_REQUIRE_GPU();
  auto in = analysis::random_inputs({{640, 100}, 2, 2, 128}, 13);
  for (int t = 0; t < 640; ++t)
    for (int h = 0; h < 2; ++h)
      for (int f = 0; f < 128; ++f)
        if (t < 128 || t >= 300) in.v.at(t, h, f) = std::ldexp(in.v.at(t, h, f), t < 128 ? -60 : 60);
  for (Isolation mode : {Isolation::kDocument, Isolation::kPrefix}) {
    NumericsOptions opt;
    opt.isolation = mode;
    const auto gpu = ForwardCall(in, opt, true).run();
    const auto emu = reference::mxfp8_forward(reference::quantize_inputs(in.q, in.k, in.v, in.docs, opt), in.docs,
                                              reference::AttentionShape{.causal = true}, opt);
    EXPECT_LE(compare(gpu.lse.data, emu.lse.data).max_abs, kMaxLseDiffVsEmulation) << to_string(mode);
    // Rows of one scale range at a time (a cosine over all rows would see the 2^60 rows only).
    for (auto [first, last] : {std::pair{0, 128}, std::pair{128, 300}, std::pair{300, 640}, std::pair{640, 740}}) {
      std::vector<double> g, e;
      for (int t = first; t < last; ++t)
        for (int h = 0; h < 2; ++h)
          for (int f = 0; f < 128; ++f) {
            g.push_back(gpu.o.at(t, h, f));
            e.push_back(emu.o.at(t, h, f));
          }
      for (double x : g) ASSERT_TRUE(std::isfinite(x)) << to_string(mode) << " rows " << first << ".." << last;
      const auto c = compare(g, e);
      EXPECT_GE(c.cosine, kMinCosineVsEmulation) << to_string(mode) << " rows " << first << ".." << last;
      EXPECT_LE(c.rel_l2, kMaxRelL2VsEmulation) << to_string(mode) << " rows " << first << ".." << last;
    }
  }
}

TEST(Forward, RejectsBadArgumentsWithoutLaunching) {
  FLAMIA_REQUIRE_GPU();
  const auto in = analysis::random_inputs({{64}, 4, 4, 128}, 2);
  ForwardCall call(in, NumericsOptions{}, true);
  flamia_error err{};
  EXPECT_EQ(flamia_forward(&call.q.desc, &call.k.desc, &call.v.desc, &call.docs, &call.options, &call.o.desc,
                           static_cast<float*>(call.lse.get()), call.workspace.get(), call.workspace.bytes() / 2, nullptr,
                           &err),
            FLAMIA_ERROR_WORKSPACE);
  call.q.desc.dim = 96;
  EXPECT_NE(flamia_forward(&call.q.desc, &call.k.desc, &call.v.desc, &call.docs, &call.options, &call.o.desc,
                           static_cast<float*>(call.lse.get()), call.workspace.get(), call.workspace.bytes(), nullptr, &err),
            FLAMIA_SUCCESS);
  EXPECT_NE(std::string(err.message).find("dim"), std::string::npos) << err.message;
}

}  // namespace
}  // namespace flamia::gpu_test
