// GPU backward vs the CPU emulation (the spec), the FP64 reference (the accuracy bars) and the
// isolation contract for dQ. The emulation's backward is fed the GPU's own forward outputs (O,
// LSE), so the comparison isolates the backward kernels. They differ from the emulation only by
// FP32 accumulation and exp2f: P and U are rebuilt in FP32, and the few values that land on the
// other side of an E4M3 rounding boundary move single codes by one step (U = P (E - D) is a
// difference, so its low bits are the least stable; dQ and dK feel that, dV hardly).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "analysis/metrics.h"
#include "analysis/probe.h"
#include "cuda/sm90/backward.h"
#include "forward_harness.h"
#include "graph_capture.h"
#include "reference/attention_fp64.h"
#include "reference/mxfp8_route.h"

namespace flamia::gpu_test {
namespace {

using analysis::compare;

constexpr double kMinCosineVsEmulation = 0.9999;
constexpr double kMaxRelL2VsEmulation = 1.5e-2;

// Unaligned starts everywhere, and empty documents (idle tile slots) in the middle and at the end.
const std::vector<int> kAwkwardLengths = {1, 31, 32, 0, 33, 127, 129, 1000, 4097, 0};

struct Case {
  int q_heads, kv_heads, dim;
  bool causal;
  int config;  // index into analysis::default_numerics_configs() (rowcol U: the Hopper layout)
  // dO zero on the 1000-token document and on 300 tokens inside the 4097-token one (tokens whose
  // labels a loss ignores): whole query and key tiles whose U is zero, so sigma and tau come from a
  // zero max, and their scaled operands must stay exactly zero (not 0 * inf).
  bool zero_dout_spans = false;
};

bool same_bits(const reference::PackedTensor& a, const reference::PackedTensor& b) {
  return a.data.size() == b.data.size() && std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(double)) == 0;
}

class BackwardVsEmulation : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardVsEmulation, MatchesTheEmulationAndMeetsTheBars) {
  FLAMIA_REQUIRE_GPU();
  const Case c = GetParam();
  NumericsOptions opt = analysis::default_numerics_configs()[c.config];
  // The kernels reduce dQ in a pass of their own (and their forward saves no row_max_prob), so
  // the emulation they are held to is the deterministic reduction.
  opt.dq_reduction = DqReduction::kDeterministic;
  auto in = analysis::random_inputs({kAwkwardLengths, c.q_heads, c.kv_heads, c.dim}, 4321 + c.config);
  if (c.zero_dout_spans) {
    ASSERT_EQ(in.docs.end(7) - in.docs.begin(7), 1000);
    ASSERT_EQ(in.docs.end(8) - in.docs.begin(8), 4097);
    for (const auto& [begin, end] : {std::pair{in.docs.begin(7), in.docs.end(7)},
                                     std::pair{in.docs.begin(8) + 1200, in.docs.begin(8) + 1500}})
      for (int token = begin; token < end; ++token)
        for (int h = 0; h < c.q_heads; ++h) std::fill_n(in.dout.row(token, h), c.dim, 0.0);
  }
  const reference::AttentionShape shape{.causal = c.causal};

  TrainingCall call(in, opt, c.causal);
  const auto gpu = call.run_training();
  const auto qin = reference::quantize_inputs(in.q, in.k, in.v, in.docs, opt);
  const reference::ForwardOutputs gpu_fwd{gpu.forward.o, gpu.forward.lse};
  const auto emu = reference::mxfp8_backward(qin, gpu_fwd, in.dout, in.docs, shape, opt);
  const auto exact_fwd = reference::reference_forward(in.q, in.k, in.v, in.docs, shape);
  const auto exact = reference::reference_backward(in.q, in.k, in.v, exact_fwd.o, exact_fwd.lse, in.dout, in.docs, shape);

  const std::pair<const char*, std::array<const reference::PackedTensor*, 3>> grads[] = {
      {"dq", {&*gpu.forward.dq, &emu.dq, &exact.dq}},
      {"dk", {&gpu.dk, &emu.dk, &exact.dk}},
      {"dv", {&gpu.dv, &emu.dv, &exact.dv}}};
  for (const auto& [name, t] : grads) {
    const auto vs_emu = compare(t[0]->data, t[1]->data), vs_ref = compare(t[0]->data, t[2]->data);
    const auto emu_ref = compare(t[1]->data, t[2]->data);
    RecordProperty(std::string("cos_") + name + "_vs_emulation", std::to_string(vs_emu.cosine));
    RecordProperty(std::string("rel_l2_") + name + "_vs_emulation", std::to_string(vs_emu.rel_l2));
    RecordProperty(std::string("cos_") + name + "_vs_fp64", std::to_string(vs_ref.cosine));
    RecordProperty(std::string("cos_") + name + "_emulation_vs_fp64", std::to_string(emu_ref.cosine));
    EXPECT_GE(vs_emu.cosine, kMinCosineVsEmulation) << name;
    EXPECT_LE(vs_emu.rel_l2, kMaxRelL2VsEmulation) << name;
    EXPECT_GE(vs_ref.cosine, 0.997) << name << " (docs/DESIGN.md §4 bar)";
    for (double x : t[0]->data) ASSERT_TRUE(std::isfinite(x)) << name << ": every element is written and finite";
  }
}

std::vector<Case> backward_cases() {
  std::vector<Case> cases;
  cases.push_back({16, 4, 128, true, 0});  // GQA 16/4
  for (int config = 1; config < 4; ++config) cases.push_back({8, 2, 128, true, config});  // GQA 8/2, every config
  cases.push_back({8, 1, 128, true, 0});    // MQA (8 heads: the CPU emulation of one KV head is serial)
  cases.push_back({4, 4, 64, true, 0});     // MHA, D = 64
  cases.push_back({4, 2, 64, true, 3});     // prefix, D = 64
  cases.push_back({8, 2, 128, false, 0});   // non-causal
  cases.push_back({8, 2, 64, false, 2});    // non-causal, floor
  cases.push_back({8, 2, 128, true, 0, true});  // dO zero on whole tiles
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, BackwardVsEmulation, ::testing::ValuesIn(backward_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           const Case& c = i.param;
                           return "H" + std::to_string(c.q_heads) + "x" + std::to_string(c.kv_heads) + "_D" +
                                  std::to_string(c.dim) + (c.causal ? "_causal" : "_full") + "_cfg" +
                                  std::to_string(c.config) + (c.zero_dout_spans ? "_zero_dout_spans" : "");
                         });

// The isolation probe with dQ: prefix mode leaves dQ of rows <= i bitwise unchanged when the
// suffix moves, other documents never reach it, and document mode does move (the probe is not blind).
TEST(BackwardProbe, DqIsBitwiseStableInPrefixModeAndAcrossDocuments) {
  FLAMIA_REQUIRE_GPU();
  for (int kv_heads : {2, 1}) {
    analysis::ProbeOptions o;
    o.kv_heads = kv_heads;
    const auto cases = analysis::run_probe(o, {}, [](const analysis::AttentionInputs& in, const NumericsOptions& opt) {
      return TrainingCall(in, opt, true).run_training().forward;
    });
    std::string why;
    EXPECT_TRUE(analysis::probe_passes(cases, &why)) << why;
    bool saw_dq = false;
    for (const auto& c : cases) {
      RecordProperty(std::string(to_string(c.mode)) + "_" + c.control + "_" + c.tensor + "_kv" + std::to_string(kv_heads),
                     std::to_string(c.max_abs_change));
      if (c.tensor != "dq") continue;
      saw_dq = true;
      if (c.mode == Isolation::kPrefix || c.control == "other_document") EXPECT_TRUE(c.bitwise_equal) << c.control;
      if (c.mode == Isolation::kDocument && c.control == "suffix") EXPECT_FALSE(c.bitwise_equal) << "probe is blind";
    }
    EXPECT_TRUE(saw_dq);
  }
}

TEST(Backward, IsBitwiseRepeatableAndATrainingCallReplaysFromACudaGraph) {
  FLAMIA_REQUIRE_GPU();
  const auto in = analysis::random_inputs({{300, 77, 1000, 129}, 8, 2, 128}, 5);
  TrainingCall call(in, NumericsOptions{}, true);
  const auto first = call.run_training();
  const auto second = call.run_training();
  EXPECT_TRUE(same_bits(*first.forward.dq, *second.forward.dq));
  EXPECT_TRUE(same_bits(first.dk, second.dk));
  EXPECT_TRUE(same_bits(first.dv, second.dv));

  for (DeviceTensor* t : {&call.o, &call.dq, &call.dk, &call.dv})
    FLAMIA_CUDA_CHECK(cudaMemset(t->buffer.get(), 0xFF, t->buffer.bytes()));
  CapturedCall graph([&](cudaStream_t s, flamia_error* e) { return call.launch_training(s, e); });
  ASSERT_TRUE(graph.ok()) << graph.message();
  graph.replay(3);
  EXPECT_TRUE(same_bits(first.forward.o, download_bf16(call.o)));
  EXPECT_TRUE(same_bits(*first.forward.dq, download_bf16(call.dq)));
  EXPECT_TRUE(same_bits(first.dk, download_bf16(call.dk)));
  EXPECT_TRUE(same_bits(first.dv, download_bf16(call.dv)));
}

// The training pair (flamia_forward_train keeps q, k and v's codes, flamia_backward_saved reads them
// and not q, k, v) gives bitwise the outputs and gradients of flamia_forward + flamia_backward, for
// both geometries, prefix isolation and GQA, and a captured training call replays identically.
TEST(Backward, SavedCodesGiveBitwiseTheSameOutputsAndGradients) {
  FLAMIA_REQUIRE_GPU();
  const auto in = analysis::random_inputs({kAwkwardLengths, 8, 2, 128}, 11);
  for (int config : {0, 1, 3}) {  // block32, token, prefix
    const NumericsOptions opt = analysis::default_numerics_configs()[config];
    TrainingCall plain(in, opt, true);
    TrainingCall saved(in, opt, true, QkvHandOver::kSavedCodes);
    saved.options.deterministic = 1;  // FP16 dQ partials (the default) sum in no fixed order
    const auto want = plain.run_training(), got = saved.run_training();
    EXPECT_TRUE(same_bits(want.forward.o, got.forward.o)) << config;
    EXPECT_EQ(want.forward.lse.data, got.forward.lse.data) << config;
    EXPECT_TRUE(same_bits(*want.forward.dq, *got.forward.dq)) << config;
    EXPECT_TRUE(same_bits(want.dk, got.dk)) << config;
    EXPECT_TRUE(same_bits(want.dv, got.dv)) << config;
    if (config != 0) continue;

    for (DeviceTensor* t : {&saved.o, &saved.dq, &saved.dk, &saved.dv})
      FLAMIA_CUDA_CHECK(cudaMemset(t->buffer.get(), 0xFF, t->buffer.bytes()));
    FLAMIA_CUDA_CHECK(cudaMemset(saved.saved_codes.get(), 0xFF, saved.saved_codes.bytes()));
    CapturedCall graph([&](cudaStream_t s, flamia_error* e) { return saved.launch_training(s, e); });
    ASSERT_TRUE(graph.ok()) << graph.message();
    graph.replay(2);
    EXPECT_TRUE(same_bits(want.forward.o, download_bf16(saved.o)));
    EXPECT_TRUE(same_bits(*want.forward.dq, download_bf16(saved.dq)));
    EXPECT_TRUE(same_bits(want.dk, download_bf16(saved.dk)));
    EXPECT_TRUE(same_bits(want.dv, download_bf16(saved.dv)));
  }
}

// The first `tokens` tokens of t.
reference::PackedTensor leading_tokens(const reference::PackedTensor& t, int tokens) {
  reference::PackedTensor out(tokens, t.heads, t.dim);
  std::copy_n(t.data.begin(), out.data.size(), out.data.begin());
  return out;
}

// dK dV runs one of two schedules per call (backward_dkdv.cu's DkdvSchedule: one CTA per item when
// documents are long on average, persistent CTAs when they are short), and the consumers of the
// forward, dQ and dK dV take turns at issuing their products or not (kernel_problem.h's
// consumers_take_turns: grouped scales and long documents); every combination gives bitwise the
// same results: two calls over the same two long documents, the second with short documents
// appended until the mean length falls below both switches, must agree on the long documents'
// outputs and gradients, documents being independent. Both head dims, document isolation with
// block32 (turns, then none) and prefix isolation (no turns).
TEST(Backward, BothDkdvSchedulesAndConsumerTurnsGiveBitwiseTheSameResults) {
  FLAMIA_REQUIRE_GPU();
  const std::vector<int> long_docs = {2500, 3100};
  const int tokens = long_docs[0] + long_docs[1];
  ASSERT_FALSE(cuda::sm90::dkdv_runs_persistent(tokens, int64_t(long_docs.size())));
  ASSERT_TRUE(cuda::sm90::consumers_take_turns(true, tokens, int64_t(long_docs.size())));
  std::vector<int> with_short = long_docs;
  int short_tokens = tokens;
  while (!cuda::sm90::dkdv_runs_persistent(short_tokens, int64_t(with_short.size()))) {
    with_short.push_back(64);
    short_tokens += 64;
  }
  ASSERT_FALSE(cuda::sm90::consumers_take_turns(true, short_tokens, int64_t(with_short.size())));
  for (int dim : {128, 64}) {
    const auto in_short = analysis::random_inputs({with_short, 8, 2, dim}, 23);
    const analysis::AttentionInputs in_long{Documents::from_lengths(long_docs), leading_tokens(in_short.q, tokens),
                                            leading_tokens(in_short.k, tokens), leading_tokens(in_short.v, tokens),
                                            leading_tokens(in_short.dout, tokens)};
    for (int config : {0, 3}) {  // block32 document, prefix
      const NumericsOptions opt = analysis::default_numerics_configs()[config];
      const auto grid = TrainingCall(in_long, opt, true).run_training();
      const auto persistent = TrainingCall(in_short, opt, true).run_training();
      const std::string where = "D " + std::to_string(dim) + ", config " + std::to_string(config);
      EXPECT_TRUE(same_bits(grid.forward.o, leading_tokens(persistent.forward.o, tokens))) << where;
      EXPECT_TRUE(same_bits(*grid.forward.dq, leading_tokens(*persistent.forward.dq, tokens))) << where;
      EXPECT_TRUE(same_bits(grid.dk, leading_tokens(persistent.dk, tokens))) << where;
      EXPECT_TRUE(same_bits(grid.dv, leading_tokens(persistent.dv, tokens))) << where;
    }
  }
}

TEST(Backward, NonFiniteGradientStaysInsideItsDocument) {
  FLAMIA_REQUIRE_GPU();
  auto in = analysis::random_inputs({{200, 100}, 4, 4, 64}, 9);
  in.dout.at(150, 0, 7) = NAN;  // document 0, query head 0
  const auto gpu = TrainingCall(in, NumericsOptions{}, true).run_training();
  for (int t = 200; t < 300; ++t) {
    EXPECT_FALSE(std::isnan(gpu.forward.dq->at(t, 0, 0))) << "dq, document 1, row " << t;
    EXPECT_FALSE(std::isnan(gpu.dk.at(t, 0, 0))) << "dk, document 1, row " << t;
    EXPECT_FALSE(std::isnan(gpu.dv.at(t, 0, 0))) << "dv, document 1, row " << t;
  }
  for (int t = 0; t < 300; ++t) EXPECT_FALSE(std::isnan(gpu.dv.at(t, 1, 0))) << "kv head 1 never reads query head 0";
  EXPECT_TRUE(std::isnan(gpu.dv.at(0, 0, 0))) << "the NaN reaches dV of its own document and head";
}

TEST(Backward, RejectsBadArgumentsWithoutLaunching) {
  FLAMIA_REQUIRE_GPU();
  const auto in = analysis::random_inputs({{64}, 4, 2, 128}, 2);
  TrainingCall call(in, NumericsOptions{}, true);
  flamia_error err{};
  auto backward = [&](size_t workspace_bytes) {
    return flamia_backward(&call.q.desc, &call.k.desc, &call.v.desc, &call.o.desc, static_cast<const float*>(call.lse.get()),
                           &call.dout.desc, &call.docs, &call.options, &call.dq.desc, &call.dk.desc, &call.dv.desc,
                           call.backward_workspace.get(), workspace_bytes, nullptr, &err);
  };
  EXPECT_EQ(backward(call.backward_workspace.bytes() - 1), FLAMIA_ERROR_WORKSPACE);
  EXPECT_NE(std::string(err.message).find("flamia_backward_workspace_size"), std::string::npos) << err.message;
  call.dk.desc.heads = 4;  // dk must be shaped like k
  EXPECT_EQ(backward(call.backward_workspace.bytes()), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("dk.heads"), std::string::npos) << err.message;
}

}  // namespace
}  // namespace flamia::gpu_test
