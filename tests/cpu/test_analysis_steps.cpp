// The progress steps of the numerics table and the probe: the CLI estimates each step before the
// run, so the steps a run reports must be the ones listed in advance, one for one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "analysis/inputs.h"
#include "analysis/numerics.h"
#include "analysis/probe.h"

namespace flamia::analysis {
namespace {

TEST(NumericsSteps, RunNumericsReportsExactlyTheListedSteps) {
  const AttentionInputs in = random_inputs({{40, 24}, 2, 1, 64}, 0);
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    std::vector<NumericsOptions> configs;
    for (const NumericsOptions& c : default_numerics_configs())
      if (causal || c.isolation != Isolation::kPrefix) configs.push_back(c);
    const std::vector<NumericsStep> steps = numerics_steps(configs, {.causal = causal});
    std::vector<std::string> reported;
    const auto rows = run_numerics(in, {.causal = causal}, configs, [&](const std::string& s) { reported.push_back(s); });
    std::vector<std::string> listed;
    size_t forwards = 0, backwards = 0;
    for (const NumericsStep& s : steps) {
      listed.push_back(s.name);
      forwards += s.work == NumericsWork::kRouteForward;
      backwards += s.work == NumericsWork::kRouteBackward;
    }
    EXPECT_EQ(reported, listed);
    EXPECT_EQ(forwards, configs.size());
    EXPECT_EQ(backwards * 5, rows.size());  // one backward step per dQ reduction's five rows
    // Causal: the four MXFP8 document/rowcol configurations run the fp16_partials backward too.
    EXPECT_EQ(backwards, configs.size() + (causal ? 4 : 0));
    ASSERT_GE(steps.size(), 2u);
    EXPECT_EQ(steps[0].work, NumericsWork::kReferenceForward);
    EXPECT_EQ(steps[1].work, NumericsWork::kReferenceBackward);
  }
}

TEST(ProbeSteps, RunProbeReportsTheInputsAndEachCall) {
  ProbeOptions o;
  o.head_dim = 64;
  int calls = 0;
  const ProbeCall zeros = [&](const AttentionInputs& in, const NumericsOptions&) {
    ++calls;
    const int t = in.docs.total_tokens();
    return ProbeOutputs{reference::PackedTensor(t, in.q.heads, in.q.dim), reference::HeadTokenTensor(in.q.heads, t), {}};
  };
  std::vector<std::string> reported;
  run_probe(o, [&](const std::string& s) { reported.push_back(s); }, zeros);
  EXPECT_EQ(calls, kProbeCalls);
  ASSERT_EQ(reported.size(), size_t(kProbeCalls) + 1);
  EXPECT_EQ(reported[0], "generating inputs");
}

}  // namespace
}  // namespace flamia::analysis
