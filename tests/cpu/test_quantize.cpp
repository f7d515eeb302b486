#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "analysis/inputs.h"
#include "core/documents.h"
#include "formats/minifloat.h"
#include "reference/quantize.h"

namespace flamia::reference {
namespace {

PackedTensor column(std::vector<double> values) {  // [T, 1, 1]
  PackedTensor x(int(values.size()), 1, 1);
  x.data = std::move(values);
  return x;
}

Documents one_document(int len) {
  const int lengths[] = {len};
  return Documents::from_lengths(lengths);
}

// Review §4: a toy signed quantizer with codes {-1, 0, 1} and shared scale max|x|. Query 1 never
// reads x2, yet the value it reads for x1 depends on x2 through the shared scale.
TEST(ScaleLeak, TwoTokenIntegerCounterexample) {
  auto reconstruct_first = [](double x1, double x2) {
    const double scale = std::max(std::fabs(x1), std::fabs(x2));
    return std::nearbyint(x1 / scale) * scale;
  };
  EXPECT_EQ(reconstruct_first(1.0, 1.0), 1.0);
  EXPECT_EQ(reconstruct_first(1.0, 3.0), 0.0);
}

// Review §4: doubling a scale preserves normal E4M3 values but not the subnormal edge. A value on
// the smallest subnormal (2^-9 at scale 1) becomes a tie between 0 and 2^-9 at scale 2 and rounds
// to the even code, 0, when a later token in its block32 group pushes the exponent up.
TEST(ScaleLeak, SubnormalEdgeWhenTheGroupScaleDoubles) {
  const Documents docs = one_document(2);
  const double tiny = std::ldexp(1.0, -9);
  const auto a = quantize_mxfp8(column({tiny, 448.0}), docs, ScaleGeometry::kBlock32, ScaleRule::kCeil);
  const auto b = quantize_mxfp8(column({tiny, 449.0}), docs, ScaleGeometry::kBlock32, ScaleRule::kCeil);
  EXPECT_EQ(a.exponent(0, 0), 0);
  EXPECT_EQ(b.exponent(0, 0), 1);
  EXPECT_EQ(a.value(0, 0, 0), tiny);
  EXPECT_EQ(b.value(0, 0, 0), 0.0);
  // Per-token scales close this path: token 0's value no longer depends on token 1.
  const auto ta = quantize_mxfp8(column({tiny, 448.0}), docs, ScaleGeometry::kToken, ScaleRule::kCeil);
  const auto tb = quantize_mxfp8(column({tiny, 449.0}), docs, ScaleGeometry::kToken, ScaleRule::kCeil);
  EXPECT_EQ(ta.value(0, 0, 0), tb.value(0, 0, 0));
}

// Review §4: under the floor rule 480 sits at exponent 0 and clips to 448; ceil moves to
// exponent 1, where 480 = 240 * 2 is exact.
TEST(ScaleRules, FloorClips480CeilDoesNot) {
  const Documents docs = one_document(1);
  const auto floor = quantize_mxfp8(column({480.0}), docs, ScaleGeometry::kToken, ScaleRule::kFloor);
  const auto ceil = quantize_mxfp8(column({480.0}), docs, ScaleGeometry::kToken, ScaleRule::kCeil);
  EXPECT_EQ(floor.exponent(0, 0), 0);
  EXPECT_EQ(floor.value(0, 0, 0), 448.0);
  EXPECT_EQ(floor.saturated, 1);
  EXPECT_EQ(ceil.exponent(0, 0), 1);
  EXPECT_EQ(ceil.value(0, 0, 0), 480.0);
  EXPECT_EQ(ceil.saturated, 0);
}

TEST(Mxfp8Quantizer, Block32GroupsAreCountedFromEachDocumentStart) {
  const int lengths[] = {5, 40, 33};
  const Documents docs = Documents::from_lengths(lengths);
  auto in = analysis::random_inputs({{5, 40, 33}, 2, 2, 8}, 7);
  const auto q = quantize_mxfp8(in.q, docs, ScaleGeometry::kBlock32, ScaleRule::kCeil);
  for (int d = 0; d < docs.count(); ++d) {
    for (int h = 0; h < 2; ++h) {
      for (int g0 = 0; g0 < docs.length(d); g0 += 32) {
        const int g1 = std::min(g0 + 32, docs.length(d));
        double amax = 0;
        for (int p = g0; p < g1; ++p)
          for (int f = 0; f < 8; ++f) amax = std::max(amax, std::fabs(in.q.at(docs.begin(d) + p, h, f)));
        const uint8_t expected = formats::scale_for_amax(amax, ScaleRule::kCeil);
        for (int p = g0; p < g1; ++p) {
          const int t = docs.begin(d) + p;
          ASSERT_EQ(q.scale(t, h), expected) << "doc " << d << " pos " << p;
          for (int f = 0; f < 8; ++f)
            ASSERT_EQ(q.code(t, h, f), formats::encode_scaled_e4m3(in.q.at(t, h, f), expected));
        }
      }
    }
  }
}

TEST(Mxfp8Quantizer, GroupsNeverSpanTwoDocuments) {
  // Scaling document 0 by 2^20 must not move a single code or scale of document 1.
  const int lengths[] = {20, 20};
  const Documents docs = Documents::from_lengths(lengths);
  auto in = analysis::random_inputs({{20, 20}, 1, 1, 16}, 3);
  const auto before = quantize_mxfp8(in.k, docs, ScaleGeometry::kBlock32, ScaleRule::kCeil);
  for (int t = 0; t < 20; ++t)
    for (int f = 0; f < 16; ++f) in.k.at(t, 0, f) *= std::ldexp(1.0, 20);
  const auto after = quantize_mxfp8(in.k, docs, ScaleGeometry::kBlock32, ScaleRule::kCeil);
  for (int t = 20; t < 40; ++t) {
    EXPECT_EQ(before.scale(t, 0), after.scale(t, 0));
    for (int f = 0; f < 16; ++f) EXPECT_EQ(before.code(t, 0, f), after.code(t, 0, f));
  }
  EXPECT_NE(before.scale(0, 0), after.scale(0, 0));
}

TEST(Mxfp8Quantizer, NonFiniteInputPoisonsItsGroupOnly) {
  const Documents docs = one_document(40);
  std::vector<double> v(40, 1.5);
  v[3] = INFINITY;
  v[35] = NAN;
  const auto q = quantize_mxfp8(column(v), docs, ScaleGeometry::kBlock32, ScaleRule::kCeil);
  for (int t = 0; t < 40; ++t) EXPECT_TRUE(std::isnan(q.value(t, 0, 0))) << t;  // both groups hold one
  std::vector<double> w(40, 1.5);
  w[35] = NAN;
  const auto r = quantize_mxfp8(column(w), docs, ScaleGeometry::kBlock32, ScaleRule::kCeil);
  for (int t = 0; t < 32; ++t) EXPECT_EQ(r.value(t, 0, 0), 1.5);
  for (int t = 32; t < 40; ++t) EXPECT_TRUE(std::isnan(r.value(t, 0, 0)));
}

TEST(Mxfp8Quantizer, AllZeroGroupUsesTheSmallestExponent) {
  const Documents docs = one_document(3);
  const auto q = quantize_mxfp8(column({0.0, -0.0, 0.0}), docs, ScaleGeometry::kBlock32, ScaleRule::kFloor);
  EXPECT_EQ(q.scale(0, 0), formats::encode_ue8m0(formats::kMinScaleExponent));
  EXPECT_EQ(q.value(1, 0, 0), 0.0);
}

TEST(Mxfp8Quantizer, ReconstructionErrorIsWithinHalfAnE4M3Step) {
  auto in = analysis::random_inputs({{100}, 2, 2, 64}, 11);
  const auto q = quantize_mxfp8(in.v, in.docs, ScaleGeometry::kBlock32, ScaleRule::kCeil);
  for (int t = 0; t < 100; ++t)
    for (int h = 0; h < 2; ++h)
      for (int f = 0; f < 64; ++f) {
        const double x = in.v.at(t, h, f), y = q.value(t, h, f);
        // relative step 2^-3 for normals; absolute floor 2^-10 * 2^e for subnormals
        EXPECT_LE(std::fabs(x - y), std::max(std::fabs(x) * 0x1p-4, std::ldexp(1.0, -10 + int(q.exponent(t, h)))));
      }
}

TEST(Nvfp4Quantizer, PerTokenScaleIsLocalAndAccurate) {
  auto in = analysis::random_inputs({{6}, 1, 1, 32}, 5);
  const auto a = quantize_nvfp4(in.q);
  for (int f = 0; f < 32; ++f) in.q.at(5, 0, f) *= 1000.0;  // a later token grows
  const auto b = quantize_nvfp4(in.q);
  for (int t = 0; t < 5; ++t)
    for (int f = 0; f < 32; ++f) {
      EXPECT_EQ(a.value(t, 0, f), b.value(t, 0, f));
      // E2M1 keeps 1 mantissa bit: relative error <= 1/4 above the block's smallest normal step
      const double x = in.q.at(t, 0, f);
      EXPECT_LE(std::fabs(a.value(t, 0, f) - x), std::fabs(x) * 0.25 + 0.26 * a.token_scales[t] * 448);
    }
  // The largest block scale of each token sits at the top of E4M3.
  for (int t = 0; t < 6; ++t) {
    uint8_t top = 0;
    for (int b2 = 0; b2 < 2; ++b2) top = std::max(top, a.block_scales[t * 2 + b2]);
    EXPECT_EQ(formats::decode(formats::kE4M3, top), 448.0);
  }
}

TEST(Nvfp4Quantizer, NonFiniteInputDecodesAsNaN) {
  PackedTensor x(1, 1, 16);
  x.at(0, 0, 4) = NAN;
  const auto q = quantize_nvfp4(x);
  for (int f = 0; f < 16; ++f) EXPECT_TRUE(std::isnan(q.value(0, 0, f)));
  EXPECT_THROW(quantize_nvfp4(PackedTensor(1, 1, 10)), std::invalid_argument);
}

TEST(Hadamard, IsOrthonormalAndItsOwnInverse) {
  auto in = analysis::random_inputs({{3}, 2, 2, 128}, 9);
  PackedTensor a = in.q, b = in.k;
  hadamard_rotate(a);
  hadamard_rotate(b);
  for (int t = 0; t < 3; ++t) {
    double dot_before = 0, dot_after = 0;
    for (int f = 0; f < 128; ++f) dot_before += in.q.at(t, 0, f) * in.k.at(t, 0, f), dot_after += a.at(t, 0, f) * b.at(t, 0, f);
    EXPECT_NEAR(dot_before, dot_after, 1e-12);
  }
  hadamard_rotate(a);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a.data[i], in.q.data[i], 1e-14);
  EXPECT_EQ(hadamard_block_size(64), 64);
  EXPECT_EQ(hadamard_block_size(96), 0);
  PackedTensor bad(1, 1, 96);
  EXPECT_THROW(hadamard_rotate(bad), std::invalid_argument);
}

TEST(SquareQuantizer, OneScalePerSquareAndZeroCounting) {
  // 2x2 squares over a 2x4 matrix: the right square's large entry zeroes its small neighbour.
  const std::vector<double> m = {1.0, 2.0, 1e-6, 384.0, 3.0, 0.0, 0.5, 1.0};
  const auto q = quantize_squares(m, 2, 4, 2);
  EXPECT_EQ(q.values[0], 1.0);
  EXPECT_EQ(q.values[3], 384.0);
  EXPECT_EQ(q.values[2], 0.0);
  EXPECT_EQ(q.nonzero, 7);
  EXPECT_EQ(q.zeroed, 1);
}

}  // namespace
}  // namespace flamia::reference
