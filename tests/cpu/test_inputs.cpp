// The random inputs' kinds (analysis/inputs.h): each a stated transform of the same standard normal
// draws, document-local, rounded to BF16.
#include <gtest/gtest.h>

#include <cmath>

#include "analysis/inputs.h"
#include "formats/minifloat.h"

namespace flamia::analysis {
namespace {

const InputShape kShape{{40, 1, 70}, 4, 2, 64};

TEST(InputKinds, EachIsItsTransformOfTheNormalDraws) {
  const AttentionInputs normal = random_inputs(kShape, 3);
  const AttentionInputs sharp = random_inputs(kShape, 3, InputKind::kSharp);
  const AttentionInputs outliers = random_inputs(kShape, 3, InputKind::kOutliers);
  EXPECT_EQ(random_inputs(kShape, 3, InputKind::kNormal).q.data, normal.q.data);
  for (size_t i = 0; i < normal.q.data.size(); ++i) {
    ASSERT_EQ(sharp.q.data[i], formats::round_to_bf16(normal.q.data[i] * kSharpQk));
    const int f = int(i % size_t(kShape.head_dim));
    const double factor = f == kOutlierFeatures[0] || f == kOutlierFeatures[1] ? kOutlierQk : 1.0;
    ASSERT_EQ(outliers.q.data[i], formats::round_to_bf16(normal.q.data[i] * factor)) << i;
  }
  for (size_t i = 0; i < normal.v.data.size(); ++i) {
    const int f = int(i % size_t(kShape.head_dim));
    const double factor = f == kOutlierFeatures[0] || f == kOutlierFeatures[1] ? kOutlierV : 1.0;
    ASSERT_EQ(outliers.v.data[i], formats::round_to_bf16(normal.v.data[i] * factor)) << i;
    ASSERT_EQ(sharp.v.data[i], normal.v.data[i]);
  }
  EXPECT_EQ(sharp.dout.data, normal.dout.data);
  EXPECT_EQ(outliers.dout.data, normal.dout.data);
}

TEST(InputKinds, TheSinkIsEachDocumentsFirstKeyAndEveryQueryLeansTowardIt) {
  const AttentionInputs normal = random_inputs(kShape, 5);
  const AttentionInputs sink = random_inputs(kShape, 5, InputKind::kSink);
  for (int t = 0; t < sink.k.tokens; ++t) {
    const bool first = t == sink.docs.begin(sink.docs.document_of(t));
    for (int h = 0; h < sink.k.heads; ++h)
      for (int f = 0; f < sink.k.dim; ++f) {
        const double expected = first && f < kSinkFeatures ? kSinkKey : normal.k.at(t, h, f);
        ASSERT_EQ(sink.k.at(t, h, f), expected) << t << " " << h << " " << f;
      }
  }
  for (int t = 0; t < sink.q.tokens; ++t)
    for (int h = 0; h < sink.q.heads; ++h)
      for (int f = 0; f < sink.q.dim; ++f) {
        const double lean = f < kSinkFeatures ? kSinkQueryLean : 0.0;
        ASSERT_EQ(sink.q.at(t, h, f), formats::round_to_bf16(normal.q.at(t, h, f) + lean));
      }
  EXPECT_EQ(sink.v.data, normal.v.data);
}

TEST(InputKinds, NamesParseBack) {
  for (InputKind k : {InputKind::kNormal, InputKind::kSharp, InputKind::kOutliers, InputKind::kSink})
    EXPECT_EQ(parse_option<InputKind>(to_string(k)), k);
  EXPECT_EQ(option_names<InputKind>(), "normal, sharp, outliers or sink");
}

}  // namespace
}  // namespace flamia::analysis
