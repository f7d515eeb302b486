// The dK dV launcher's instance table and the rule that picks a call's instance
// (cuda/sm90/backward.h; host code, no GPU): every call gets an instance the table lists, and the
// rule follows the schedule, turns, interior-code and FP16-partials choices it states.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>

#include "cuda/sm90/backward.h"

namespace flamia::cuda::sm90 {
namespace {

BackwardParams params(int total_tokens, int num_docs, bool group_scales, bool interior_codes, bool dq_partials) {
  BackwardParams p{};
  p.total_tokens = total_tokens, p.num_docs = num_docs;
  p.head_dim = 128, p.causal = true;
  p.group_scales = group_scales, p.interior_codes = interior_codes, p.dq_partials = dq_partials;
  return p;
}

bool listed(DkdvInstance k) {
  return std::find(std::begin(kDkdvInstances), std::end(kDkdvInstances), k) != std::end(kDkdvInstances);
}

TEST(DkdvInstances, TheTableListsEachInstanceOnce) {
  for (size_t i = 0; i < std::size(kDkdvInstances); ++i)
    for (size_t j = i + 1; j < std::size(kDkdvInstances); ++j)
      EXPECT_FALSE(kDkdvInstances[i] == kDkdvInstances[j]) << i << " " << j;
  // Compiled for D = 64 and 128, the FP16 partials' at 128 only: test_kernel_resources.py counts 11.
  const auto partials = std::count_if(std::begin(kDkdvInstances), std::end(kDkdvInstances),
                                      [](DkdvInstance k) { return k.dq_partials; });
  EXPECT_EQ(partials, 1);
  EXPECT_EQ(2 * std::ssize(kDkdvInstances) - partials, 11);
}

TEST(DkdvInstances, EveryCallGetsAListedInstance) {
  const int mean_lengths[] = {1, kDkdvPersistentBelowMeanDocument - 1, kDkdvPersistentBelowMeanDocument,
                              kTurnsFromMeanDocument, 4096, kDqPartialsFromMeanDocument, 65536};
  for (int mean : mean_lengths)
    for (bool group_scales : {false, true})
      for (bool interior : {false, true})
        for (bool partials : {false, true}) {
          if (partials && interior) continue;  // the C API never asks for it (dq_partials_supported)
          const DkdvInstance k = dkdv_instance(params(mean * 4, 4, group_scales, interior, partials));
          EXPECT_TRUE(listed(k)) << "mean " << mean << " grouped " << group_scales << " interior " << interior;
          EXPECT_EQ(k.interior_codes, interior);
          EXPECT_EQ(k.dq_partials, partials);
        }
}

TEST(DkdvInstances, TheRuleFollowsScheduleTurnsAndPartials) {
  // Short documents: the persistent schedule, without turns, with or without interior codes.
  const DkdvInstance short_docs = dkdv_instance(params(278 * 200, 278, true, false, false));
  EXPECT_TRUE(short_docs.persistent);
  EXPECT_FALSE(short_docs.turns);
  EXPECT_TRUE(dkdv_instance(params(278 * 200, 278, true, true, false)).persistent);
  // Long documents with block32 scales: one CTA per item, the consumers taking turns; per-token
  // scales (no grouped steps) and interior codes take none.
  const DkdvInstance grouped = dkdv_instance(params(65536, 16, true, false, false));
  EXPECT_FALSE(grouped.persistent);
  EXPECT_TRUE(grouped.turns);
  EXPECT_FALSE(dkdv_instance(params(65536, 16, false, false, false)).turns);
  const DkdvInstance prefix = dkdv_instance(params(65536, 16, true, true, false));
  EXPECT_FALSE(prefix.persistent || prefix.turns);
  EXPECT_TRUE(prefix.interior_codes);
  // FP16 partials: their own grid instance, whatever the documents.
  const DkdvInstance partials = dkdv_instance(params(65536, 4, true, false, true));
  EXPECT_TRUE(partials.dq_partials);
  EXPECT_FALSE(partials.persistent || partials.turns);
}

}  // namespace
}  // namespace flamia::cuda::sm90
