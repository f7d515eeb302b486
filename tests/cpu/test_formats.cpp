// Exhaustive tests of the small-format codecs (formats/minifloat.h) and the shared scales
// (formats/scales.h). The formats have at most 256 codes, so every code, every midpoint and
// the doubles next to them are checked rather than sampled.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "formats/minifloat.h"
#include "formats/scales.h"

namespace flamia::formats {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct FormatCase {
  const char* name;
  MinifloatSpec spec;
  double max;
  int total_bits;
  double min_subnormal;
};

const FormatCase kFormats[] = {
    {"E4M3", kE4M3, kE4M3Max, 8, 0x1p-9},
    {"E5M2", kE5M2, kE5M2Max, 8, 0x1p-16},
    {"E2M1", kE2M1, kE2M1Max, 4, 0.5},
};

// Codes 0..max_finite_code() of the positive half, in increasing order of value.
int top_code(const FormatCase& fc) { return fc.spec.max_finite_code(); }

// Both signs of a magnitude code.
uint8_t negative(const FormatCase& fc, int code) { return uint8_t(code | fc.spec.sign_bit()); }

// Same double, including the sign of zero.
bool same(double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); }

TEST(FormatCodec, MaxFiniteCodeDecodesToTheFormatMax) {
  for (const FormatCase& fc : kFormats) {
    SCOPED_TRACE(fc.name);
    EXPECT_EQ(decode(fc.spec, uint8_t(top_code(fc))), fc.max);
    EXPECT_EQ(decode(fc.spec, negative(fc, top_code(fc))), -fc.max);
    EXPECT_EQ(decode(fc.spec, 1), fc.min_subnormal);
  }
  EXPECT_EQ(kE4M3.max_finite_code(), 0x7E);
  EXPECT_EQ(kE5M2.max_finite_code(), 0x7B);
  EXPECT_EQ(kE2M1.max_finite_code(), 0x7);
}

TEST(FormatCodec, NonFiniteCodesDecodeAsDocumented) {
  EXPECT_TRUE(std::isnan(decode(kE4M3, 0x7F)));
  EXPECT_TRUE(std::isnan(decode(kE4M3, 0xFF)));
  EXPECT_EQ(decode(kE4M3, 0x7C), 384.0);  // exponent all ones is still finite in E4M3 "fn"
  EXPECT_EQ(decode(kE5M2, 0x7C), kInf);
  EXPECT_EQ(decode(kE5M2, 0xFC), -kInf);
  for (int c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) EXPECT_TRUE(std::isnan(decode(kE5M2, uint8_t(c)))) << c;
  const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};  // every E2M1 code is finite
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(decode(kE2M1, uint8_t(c)), e2m1[c]);
    EXPECT_TRUE(same(decode(kE2M1, uint8_t(c | 8)), -e2m1[c]));
  }
}

TEST(FormatCodec, EveryFiniteCodeRoundTripsIncludingSignedZero) {
  for (const FormatCase& fc : kFormats) {
    SCOPED_TRACE(fc.name);
    int finite = 0;
    for (int c = 0; c < (1 << fc.total_bits); ++c) {
      const double v = decode(fc.spec, uint8_t(c));
      if (!std::isfinite(v)) continue;
      ++finite;
      EXPECT_EQ(encode(fc.spec, v), c) << "value " << v;
    }
    // E4M3: 2 NaNs; E5M2: 2 Infs + 6 NaNs; E2M1: none.
    EXPECT_EQ(finite, fc.spec.non_finite == NonFinite::kAllOnesNaN ? 254
                      : fc.spec.non_finite == NonFinite::kIeee     ? 248
                                                                   : 16);
  }
  EXPECT_EQ(encode(kE4M3, -0.0), 0x80);
  EXPECT_EQ(encode(kE2M1, -0.0), 0x8);
}

TEST(FormatCodec, DecodeIsStrictlyIncreasingInTheMagnitudeCode) {
  // The midpoint and neighbour tests below rely on code order being value order.
  for (const FormatCase& fc : kFormats) {
    SCOPED_TRACE(fc.name);
    for (int c = 0; c < top_code(fc); ++c) EXPECT_LT(decode(fc.spec, uint8_t(c)), decode(fc.spec, uint8_t(c + 1)));
  }
}

TEST(FormatCodec, MidpointsTieToEvenAndTheirNeighboursRoundToNearest) {
  for (const FormatCase& fc : kFormats) {
    SCOPED_TRACE(fc.name);
    for (int c = 0; c < top_code(fc); ++c) {
      const double lo = decode(fc.spec, uint8_t(c)), hi = decode(fc.spec, uint8_t(c + 1));
      const double mid = (lo + hi) / 2;  // exact: a few bits more than the format
      // The mantissa LSB is the code LSB, so the even neighbour is the even code.
      const int even = c % 2 == 0 ? c : c + 1;
      for (double s : {1.0, -1.0}) {
        const int sign = s < 0 ? fc.spec.sign_bit() : 0;
        EXPECT_EQ(encode(fc.spec, s * mid), even | sign) << "midpoint " << s * mid;
        EXPECT_EQ(encode(fc.spec, s * std::nextafter(mid, kInf)), (c + 1) | sign) << "above " << s * mid;
        EXPECT_EQ(encode(fc.spec, s * std::nextafter(mid, 0.0)), c | sign) << "below " << s * mid;
      }
    }
  }
}

TEST(FormatCodec, ValuesJustAboveAndBelowACodeRoundToIt) {
  for (const FormatCase& fc : kFormats) {
    SCOPED_TRACE(fc.name);
    for (int c = 0; c <= top_code(fc); ++c) {
      const double v = decode(fc.spec, uint8_t(c));
      // One double ulp and a relative 2^-20 are both far inside half a format ulp.
      for (double x : {std::nextafter(v, kInf), std::nextafter(v, -kInf), v * (1 + 0x1p-20), v * (1 - 0x1p-20)}) {
        if (x <= 0) continue;  // below +0 is the negative side, checked by symmetry
        EXPECT_EQ(encode(fc.spec, x), c) << x;
        EXPECT_EQ(encode(fc.spec, -x), negative(fc, c)) << -x;
      }
    }
  }
}

TEST(FormatCodec, FiniteOverflowSaturatesToTheLargestFiniteCode) {
  const double e4m3[] = {std::nextafter(448.0, kInf), 449, 464, 479, 480, 512, 1e30, std::numeric_limits<double>::max()};
  for (double x : e4m3) {
    EXPECT_EQ(encode(kE4M3, x), 0x7E) << x;
    EXPECT_EQ(encode(kE4M3, -x), 0xFE) << x;
  }
  // E5M2's next binade would start at 65536; its midpoint 61440 would tie to 65536, yet saturates.
  const double e5m2[] = {std::nextafter(57344.0, kInf), 61439, 61440, 61441, 65536, 1e30, std::numeric_limits<double>::max()};
  for (double x : e5m2) {
    EXPECT_EQ(encode(kE5M2, x), 0x7B) << x;
    EXPECT_EQ(encode(kE5M2, -x), 0xFB) << x;
  }
  const double e2m1[] = {std::nextafter(6.0, kInf), 6.5, 7, 8, 1e30, std::numeric_limits<double>::max()};
  for (double x : e2m1) {
    EXPECT_EQ(encode(kE2M1, x), 0x7) << x;
    EXPECT_EQ(encode(kE2M1, -x), 0xF) << x;
  }
}

TEST(FormatCodec, NaNAndInfinityInputsFollowEachFormatsRules) {
  // E4M3 has no Inf: Inf becomes NaN rather than a silently saturated 448.
  EXPECT_EQ(encode(kE4M3, kNaN), 0x7F);
  EXPECT_EQ(encode(kE4M3, kInf), 0x7F);
  EXPECT_EQ(encode(kE4M3, -kInf), 0xFF);
  EXPECT_TRUE(std::isnan(decode(kE4M3, encode(kE4M3, -kNaN))));
  EXPECT_EQ(encode(kE5M2, kInf), 0x7C);
  EXPECT_EQ(encode(kE5M2, -kInf), 0xFC);
  EXPECT_TRUE(std::isnan(decode(kE5M2, encode(kE5M2, kNaN))));
  EXPECT_TRUE(std::isnan(decode(kE5M2, encode(kE5M2, -kNaN))));
  // E2M1 can hold neither: both saturate (the NVFP4 block scale carries the NaN instead).
  EXPECT_EQ(encode(kE2M1, kInf), 0x7);
  EXPECT_EQ(encode(kE2M1, -kInf), 0xF);
  EXPECT_EQ(encode(kE2M1, kNaN), 0x7);
  EXPECT_EQ(encode(kE2M1, -kNaN), 0xF);
}

TEST(FormatCodec, E4M3SubnormalsRoundToNearestEven) {
  EXPECT_EQ(encode(kE4M3, 0x1p-9), 0x01);                  // smallest subnormal
  EXPECT_EQ(encode(kE4M3, 0x1p-10), 0x00);                 // half of it ties to zero (even)
  EXPECT_EQ(encode(kE4M3, -0x1p-10), 0x80);                // ... keeping the sign
  EXPECT_EQ(encode(kE4M3, std::nextafter(0x1p-10, 1.0)), 0x01);
  EXPECT_EQ(encode(kE4M3, 0.75 * 0x1p-9), 0x01);
  EXPECT_EQ(encode(kE4M3, 0.25 * 0x1p-9), 0x00);
  EXPECT_EQ(encode(kE4M3, 1.5 * 0x1p-9), 0x02);            // tie between 1 and 2 steps
  EXPECT_EQ(encode(kE4M3, 2.5 * 0x1p-9), 0x02);
  EXPECT_EQ(encode(kE4M3, 7.5 * 0x1p-9), 0x08);            // largest subnormal up to 2^-6
  EXPECT_EQ(decode(kE4M3, 0x08), 0x1p-6);
  EXPECT_EQ(encode(kE4M3, std::numeric_limits<double>::denorm_min()), 0x00);
  EXPECT_EQ(encode(kE5M2, 0x1p-17), 0x00);                 // E5M2: half of 2^-16
  EXPECT_EQ(encode(kE5M2, 0.75 * 0x1p-16), 0x01);
  EXPECT_EQ(encode(kE2M1, 0.25), 0x0);                     // E2M1: half of 0.5
  EXPECT_EQ(encode(kE2M1, 0.75), 0x2);                     // tie between 0.5 and 1
}

// The nearest code by exhaustive search, ties to the even code; saturating, finite x only.
int brute_force_nearest(const FormatCase& fc, double x) {
  const double a = std::fmin(std::fabs(x), fc.max);
  int best = 0;
  for (int c = 1; c <= top_code(fc); ++c) {
    const double d = std::fabs(decode(fc.spec, uint8_t(c)) - a), db = std::fabs(decode(fc.spec, uint8_t(best)) - a);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return std::signbit(x) ? negative(fc, best) : best;
}

TEST(FormatCodec, EncodeMatchesBruteForceNearestOnRandomValues) {
  std::mt19937_64 rng(20240611);
  for (const FormatCase& fc : kFormats) {
    SCOPED_TRACE(fc.name);
    // Log-uniform from far below the smallest subnormal to far above the max, both signs.
    std::uniform_real_distribution<double> log2_mag(std::log2(fc.min_subnormal) - 4, std::log2(fc.max) + 4);
    for (int i = 0; i < 4000; ++i) {
      const double x = (i % 2 ? -1 : 1) * std::exp2(log2_mag(rng));
      ASSERT_EQ(encode(fc.spec, x), brute_force_nearest(fc, x)) << x;
    }
  }
}

TEST(FormatCodec, E4M3AsUnsignedNvfp4BlockScaleRoundsToNearestEven) {
  // NVFP4 stores each 16-element block's scale amax/6 as a positive E4M3 value.
  EXPECT_EQ(encode(kE4M3, 1.0), 0x38);
  EXPECT_EQ(encode(kE4M3, 0.1), 0x1D);           // 0.1 * 2^7 = 12.8 -> 13/128
  EXPECT_EQ(decode(kE4M3, 0x1D), 13.0 / 128);
  EXPECT_EQ(encode(kE4M3, 448.0 * 6 / 6), 0x7E);
  EXPECT_EQ(encode(kE4M3, 1e4 / 6), 0x7E);       // too large a block saturates
  EXPECT_EQ(encode(kE4M3, 1.0625), 0x38);        // tie between 1 and 1.125: mantissa 000
  EXPECT_EQ(encode(kE4M3, 1.1875), 0x3A);        // tie between 1.125 and 1.25: mantissa 010
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> amax(0.0, 3000.0);
  for (int i = 0; i < 2000; ++i) {
    const double scale = amax(rng) / 6;
    const uint8_t code = encode(kE4M3, scale);
    ASSERT_EQ(code & 0x80, 0) << scale;  // the sign bit stays clear
    ASSERT_EQ(code, brute_force_nearest(kFormats[0], scale)) << scale;
  }
}

TEST(Ue8m0, EncodesAndDecodesEveryExponentAndClampsTheRange) {
  for (int e = kMinScaleExponent; e <= kMaxScaleExponent; ++e) {
    const uint8_t code = encode_ue8m0(e);
    EXPECT_EQ(code, e + 127);
    EXPECT_FALSE(ue8m0_is_nan(code));
    EXPECT_EQ(ue8m0_exponent(code), e);
    EXPECT_EQ(decode_ue8m0(code), std::ldexp(1.0, e));
  }
  EXPECT_EQ(decode_ue8m0(0x00), 0x1p-127);
  EXPECT_EQ(decode_ue8m0(0xFE), 0x1p127);
  EXPECT_EQ(encode_ue8m0(-128), 0x00);  // never reaches the NaN code from either side
  EXPECT_EQ(encode_ue8m0(-1000), 0x00);
  EXPECT_EQ(encode_ue8m0(128), 0xFE);
  EXPECT_EQ(encode_ue8m0(1000), 0xFE);
  EXPECT_TRUE(ue8m0_is_nan(kUe8m0NaN));
  EXPECT_TRUE(std::isnan(decode_ue8m0(0xFF)));
}

// amax values across the scale range: powers of two times factors in [1, 2) that sit on and
// next to the rule boundaries (448 = 1.75 * 2^8 is the clip point, 0.875 * 2^k its binade form).
std::vector<double> amax_sweep() {
  const double factors[] = {1.0, std::nextafter(1.0, 2.0), 1.25, 1.5, std::nextafter(1.75, 0.0), 1.75,
                            std::nextafter(1.75, 2.0), 1.8, 1.875, std::nextafter(2.0, 0.0)};
  std::vector<double> out;
  for (int k = -110; k <= 120; ++k)
    for (double f : factors) out.push_back(std::ldexp(f, k));
  for (double v : {448.0, 449.0, 464.0, 480.0, 512.0, 0.875, 0.4375, 1e-20, 1e20, 3.0e30}) out.push_back(v);
  return out;
}

TEST(ScaleForAmax, CeilRulePicksTheSmallestExponentThatDoesNotClip) {
  for (double amax : amax_sweep()) {
    const uint8_t s = scale_for_amax(amax, ScaleRule::kCeil);
    ASSERT_FALSE(ue8m0_is_nan(s)) << amax;
    const int e = ue8m0_exponent(s);
    EXPECT_LE(std::ldexp(amax, -e), kE4M3Max) << amax;
    EXPECT_GT(std::ldexp(amax, 1 - e), kE4M3Max) << amax;
    // So amax itself survives quantization to within half an E4M3 ulp (2^-4 relative).
    const double back = decode_scaled_e4m3(encode_scaled_e4m3(amax, s), s);
    EXPECT_LE(std::fabs(back - amax), amax * 0x1p-4) << amax;
  }
}

TEST(ScaleForAmax, FloorRuleIsFloorLog2MinusEight) {
  for (double amax : amax_sweep()) {
    const uint8_t s = scale_for_amax(amax, ScaleRule::kFloor);
    const int e = ue8m0_exponent(s);
    EXPECT_EQ(e, std::ilogb(amax) - kE4M3MaxExponent) << amax;
    const double scaled = std::ldexp(amax, -e);
    EXPECT_GE(scaled, 256.0) << amax;  // so amax / 2^e may exceed 448 and clip
    EXPECT_LT(scaled, 512.0) << amax;
  }
}

TEST(ScaleForAmax, Amax480ClipsUnderFloorAndIsExactUnderCeil) {
  const uint8_t floor_s = scale_for_amax(480.0, ScaleRule::kFloor);
  EXPECT_EQ(ue8m0_exponent(floor_s), 0);
  EXPECT_EQ(encode_scaled_e4m3(480.0, floor_s), 0x7E);
  EXPECT_EQ(decode_scaled_e4m3(encode_scaled_e4m3(480.0, floor_s), floor_s), 448.0);
  const uint8_t ceil_s = scale_for_amax(480.0, ScaleRule::kCeil);
  EXPECT_EQ(ue8m0_exponent(ceil_s), 1);
  EXPECT_EQ(decode_scaled_e4m3(encode_scaled_e4m3(480.0, ceil_s), ceil_s), 480.0);
  // 448 itself fits at e = 0 under both rules; one ulp above, ceil moves up.
  EXPECT_EQ(ue8m0_exponent(scale_for_amax(448.0, ScaleRule::kCeil)), 0);
  EXPECT_EQ(ue8m0_exponent(scale_for_amax(448.0, ScaleRule::kFloor)), 0);
  EXPECT_EQ(ue8m0_exponent(scale_for_amax(std::nextafter(448.0, kInf), ScaleRule::kCeil)), 1);
}

TEST(ScaleForAmax, ZeroAmaxUsesTheSmallestExponentAndNonFiniteAmaxIsNaN) {
  for (ScaleRule rule : {ScaleRule::kCeil, ScaleRule::kFloor}) {
    EXPECT_EQ(scale_for_amax(0.0, rule), 0x00);
    EXPECT_EQ(scale_for_amax(-0.0, rule), 0x00);
    for (double bad : {kNaN, kInf}) {
      const uint8_t s = scale_for_amax(bad, rule);
      EXPECT_EQ(s, kUe8m0NaN);
      EXPECT_EQ(encode_scaled_e4m3(1.0, s), 0) << "NaN scales keep the codes zero: the NaN lives in the scale";
      for (int c = 0; c < 256; ++c) EXPECT_TRUE(std::isnan(decode_scaled_e4m3(uint8_t(c), s))) << c;
    }
  }
  // Out of UE8M0's range the exponent clamps instead of wrapping into the NaN code.
  EXPECT_EQ(scale_for_amax(0x1p200, ScaleRule::kCeil), 0xFE);
  EXPECT_EQ(scale_for_amax(0x1p-200, ScaleRule::kFloor), 0x00);
}

TEST(ScaleForAmax, FloatBitsFormEqualsTheDoubleRuleOnEveryExponent) {
  // Every float exponent (zero, subnormals, normals, Inf/NaN) with the mantissas at and around the
  // ceil threshold (1.75 = 0x600000), the ends, and random ones.
  std::mt19937 rng(5);
  for (uint32_t biased = 0; biased <= 0xff; ++biased) {
    std::vector<uint32_t> mantissas = {0, 1, 2, 0x400000, 0x5fffff, 0x600000, 0x600001, 0x7ffffe, 0x7fffff};
    for (int i = 0; i < 2000; ++i) mantissas.push_back(rng() & 0x7fffff);
    for (uint32_t mantissa : mantissas) {
      const float amax = std::bit_cast<float>(biased << 23 | mantissa);
      for (ScaleRule rule : {ScaleRule::kCeil, ScaleRule::kFloor})
        ASSERT_EQ(scale_for_float_amax(amax, rule), scale_for_amax(double(amax), rule))
            << std::hexfloat << amax << " rule " << int(rule);
    }
  }
  EXPECT_EQ(scale_for_float_amax(-0.0f, ScaleRule::kCeil), 0x00);
}

// The kernels' branch-free ceil powers: 2^s and 2^-s of scale_for_float_amax's ceil code, bit for
// bit (2^-127 subnormal, NaN for the NaN code), on every exponent of either sign.
TEST(ScaleForAmax, CeilPowersEqualThePowersOfTheCeilCode) {
  auto same_bits = [](float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); };
  auto power = [](uint8_t code, int sign) {
    return ue8m0_is_nan(code) ? std::numeric_limits<float>::quiet_NaN()
                              : float(std::ldexp(1.0, sign * ue8m0_exponent(code)));
  };
  std::mt19937 rng(6);
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t biased = 0; biased <= 0xff; ++biased) {
      std::vector<uint32_t> mantissas = {0, 1, 2, 0x400000, 0x5fffff, 0x600000, 0x600001, 0x7ffffe, 0x7fffff};
      for (int i = 0; i < 2000; ++i) mantissas.push_back(rng() & 0x7fffff);
      for (uint32_t mantissa : mantissas) {
        const float amax = std::bit_cast<float>(sign | biased << 23 | mantissa);
        const uint8_t code = scale_for_float_amax(std::fabs(amax), ScaleRule::kCeil);
        const ScalePowers powers = ceil_scale_powers(amax);
        ASSERT_TRUE(same_bits(powers.pow, power(code, +1)) || (std::isnan(powers.pow) && ue8m0_is_nan(code)))
            << std::hexfloat << amax << ": 2^s " << powers.pow;
        ASSERT_TRUE(same_bits(powers.inv, power(code, -1)) || (std::isnan(powers.inv) && ue8m0_is_nan(code)))
            << std::hexfloat << amax << ": 2^-s " << powers.inv;
      }
    }
  EXPECT_TRUE(same_bits(ceil_scale_powers(0.f).pow, 0x1p-127f));
  EXPECT_TRUE(same_bits(ceil_scale_powers(std::numeric_limits<float>::max()).inv, 0x1p-120f));
}

// BF16 values as the top half of a float32.
double bf16_value(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }

TEST(Bf16Rounding, EveryBf16ValueRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const double v = bf16_value(uint16_t(b));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(round_to_bf16(v)));
      continue;
    }
    ASSERT_TRUE(same(round_to_bf16(v), v)) << std::hex << b;
  }
}

TEST(Bf16Rounding, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  // Positive finite bf16 codes 0..0x7F7F, subnormals included; the code LSB is the mantissa LSB.
  for (uint32_t b = 0; b < 0x7F7F; ++b) {
    const double lo = bf16_value(uint16_t(b)), hi = bf16_value(uint16_t(b + 1));
    const double mid = (lo + hi) / 2;
    const double even = b % 2 == 0 ? lo : hi;
    ASSERT_EQ(round_to_bf16(mid), even) << std::hex << b;
    ASSERT_EQ(round_to_bf16(-mid), -even) << std::hex << b;
    ASSERT_EQ(round_to_bf16(std::nextafter(mid, kInf)), hi) << std::hex << b;
    ASSERT_EQ(round_to_bf16(std::nextafter(mid, 0.0)), lo) << std::hex << b;
  }
}

TEST(Bf16Rounding, OverflowGoesToInfinityAsTheHardwareDoes) {
  const double max = bf16_value(0x7F7F);  // (2 - 2^-7) * 2^127
  EXPECT_EQ(max, 0x1.FEp127);
  const double mid = 0x1.FFp127;  // halfway to 2^128: ties to the even "code" 2^128 = Inf
  EXPECT_EQ(round_to_bf16(std::nextafter(mid, 0.0)), max);
  EXPECT_EQ(round_to_bf16(mid), kInf);
  EXPECT_EQ(round_to_bf16(-mid), -kInf);
  EXPECT_EQ(round_to_bf16(0x1p128), kInf);
  EXPECT_EQ(round_to_bf16(1e300), kInf);
  EXPECT_EQ(round_to_bf16(-1e300), -kInf);
  EXPECT_EQ(round_to_bf16(kInf), kInf);
  EXPECT_EQ(round_to_bf16(-kInf), -kInf);
  EXPECT_TRUE(std::isnan(round_to_bf16(kNaN)));
}

TEST(Bf16Rounding, SubnormalsRoundToNearestEvenWithoutFlushing) {
  const double tiny = 0x1p-133;  // smallest bf16 subnormal
  EXPECT_EQ(bf16_value(0x0001), tiny);
  EXPECT_EQ(round_to_bf16(tiny), tiny);
  EXPECT_TRUE(same(round_to_bf16(tiny / 2), 0.0));   // tie to zero
  EXPECT_TRUE(same(round_to_bf16(-tiny / 2), -0.0));
  EXPECT_EQ(round_to_bf16(0.75 * tiny), tiny);
  EXPECT_EQ(round_to_bf16(1.5 * tiny), 2 * tiny);    // tie to even
  EXPECT_EQ(round_to_bf16(127.5 * tiny), 0x1p-126);  // largest subnormal rounds up to the min normal
  EXPECT_EQ(round_to_bf16(std::numeric_limits<double>::denorm_min()), 0.0);
  EXPECT_TRUE(same(round_to_bf16(-0.0), -0.0));
  EXPECT_EQ(round_to_bf16(1.0 + 0x1p-8), 1.0);  // tie at 1 + half ulp goes to even 1.0
  EXPECT_EQ(round_to_bf16(1.0 + 3 * 0x1p-8), 1.0 + 0x1p-6);
}

// FP16 values from their bits.
double fp16_value(uint16_t bits) {
  const int biased = (bits >> 10) & 0x1f, man = bits & 0x3ff;
  const double mag = biased == 0x1f ? (man ? kNaN : kInf)
                     : biased == 0  ? std::ldexp(double(man), -24)
                                    : std::ldexp(double(1024 + man), biased - 25);
  return (bits & 0x8000) ? -mag : mag;
}

TEST(Fp16Rounding, EveryFp16ValueRoundTrips) {
  int nans = 0;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const double v = fp16_value(uint16_t(b));
    if (std::isnan(v)) {
      ++nans;
      EXPECT_TRUE(std::isnan(round_to_fp16(v)));
      continue;
    }
    ASSERT_TRUE(same(round_to_fp16(v), v)) << std::hex << b;
  }
  EXPECT_EQ(nans, 2 * 1023);
  EXPECT_EQ(fp16_value(0x7BFF), 65504.0);
  EXPECT_EQ(fp16_value(0x3C00), 1.0);
}

TEST(Fp16Rounding, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  // Positive finite fp16 codes 0..0x7BFF, subnormals included; the code LSB is the mantissa LSB.
  for (uint32_t b = 0; b < 0x7BFF; ++b) {
    const double lo = fp16_value(uint16_t(b)), hi = fp16_value(uint16_t(b + 1));
    const double mid = (lo + hi) / 2;
    const double even = b % 2 == 0 ? lo : hi;
    ASSERT_EQ(round_to_fp16(mid), even) << std::hex << b;
    ASSERT_EQ(round_to_fp16(-mid), -even) << std::hex << b;
    ASSERT_EQ(round_to_fp16(std::nextafter(mid, kInf)), hi) << std::hex << b;
    ASSERT_EQ(round_to_fp16(std::nextafter(mid, 0.0)), lo) << std::hex << b;
  }
}

TEST(Fp16Rounding, OverflowGoesToInfinity) {
  const double max = 65504.0;  // (2 - 2^-10) * 2^15
  const double mid = 65520.0;  // max + half an ulp (ulp 32): ties to the even "code" 2^16 = Inf
  EXPECT_EQ(round_to_fp16(std::nextafter(mid, 0.0)), max);
  EXPECT_EQ(round_to_fp16(mid), kInf);
  EXPECT_EQ(round_to_fp16(-mid), -kInf);
  EXPECT_EQ(round_to_fp16(65536.0), kInf);
  EXPECT_EQ(round_to_fp16(1e300), kInf);
  EXPECT_EQ(round_to_fp16(-1e300), -kInf);
  EXPECT_EQ(round_to_fp16(kInf), kInf);
  EXPECT_EQ(round_to_fp16(-kInf), -kInf);
  EXPECT_TRUE(std::isnan(round_to_fp16(kNaN)));
  EXPECT_TRUE(std::isnan(round_to_fp16(-kNaN)));
}

TEST(Fp16Rounding, SubnormalsRoundToNearestEvenWithoutFlushing) {
  const double tiny = 0x1p-24;  // smallest fp16 subnormal
  EXPECT_EQ(fp16_value(0x0001), tiny);
  EXPECT_EQ(round_to_fp16(tiny), tiny);
  EXPECT_TRUE(same(round_to_fp16(0x1p-25), 0.0));  // exactly half: ties to even zero
  EXPECT_TRUE(same(round_to_fp16(-0x1p-25), -0.0));
  EXPECT_EQ(round_to_fp16(std::nextafter(0x1p-25, 1.0)), tiny);
  EXPECT_TRUE(same(round_to_fp16(std::nextafter(0x1p-25, 0.0)), 0.0));  // below 2^-25: zero
  EXPECT_TRUE(same(round_to_fp16(0x1p-40), 0.0));
  EXPECT_EQ(round_to_fp16(0.75 * tiny), tiny);
  EXPECT_EQ(round_to_fp16(1.5 * tiny), 2 * tiny);    // tie to even
  EXPECT_EQ(round_to_fp16(2.5 * tiny), 2 * tiny);    // tie to even
  EXPECT_EQ(round_to_fp16(1023.5 * tiny), 0x1p-14);  // largest subnormal rounds up to the min normal
  EXPECT_EQ(round_to_fp16(std::numeric_limits<double>::denorm_min()), 0.0);
  EXPECT_TRUE(same(round_to_fp16(-0.0), -0.0));
  EXPECT_EQ(round_to_fp16(1.0 + 0x1p-11), 1.0);  // tie at 1 + half ulp goes to even 1.0
  EXPECT_EQ(round_to_fp16(1.0 + 3 * 0x1p-11), 1.0 + 0x1p-9);
  EXPECT_EQ(round_to_fp16(2049.0), 2048.0);  // integers above 2048 step by 2
  EXPECT_EQ(round_to_fp16(2051.0), 2052.0);
}

}  // namespace
}  // namespace flamia::formats
