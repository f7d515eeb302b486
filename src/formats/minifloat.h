// Small floating-point formats: E4M3 (OCP "fn"), E5M2, E2M1, and BF16 and FP16 rounding.
//
// One generic codec, parameterized by the format's bit layout, serves every format, so the
// rounding rule is written once: round-to-nearest-even on the magnitude, saturation to the
// largest finite value for finite inputs, correct subnormals. Non-finite inputs never
// saturate: NaN (and Inf where the format has no Inf) encodes as NaN, so a bad input can't
// silently become a large finite number.
//
// Usable from host and device code; no CUDA runtime or standard library beyond <cmath>.
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/host_device.h"

namespace flamia::formats {

// How a format spends its top codes on non-finite values.
enum class NonFinite : uint8_t {
  kNone,        // E2M1: every code is finite; NaN/Inf cannot be represented
  kAllOnesNaN,  // E4M3 "fn": S.1111.111 is NaN, no Inf
  kIeee,        // E5M2: exponent all ones is Inf (mantissa 0) or NaN
};

struct MinifloatSpec {
  int exp_bits;
  int man_bits;
  int bias;
  NonFinite non_finite;

  FLAMIA_HD constexpr int min_exponent() const { return 1 - bias; }  // of the smallest normal
  FLAMIA_HD constexpr uint8_t sign_bit() const { return uint8_t(1u << (exp_bits + man_bits)); }
  // Largest finite magnitude code.
  FLAMIA_HD constexpr uint8_t max_finite_code() const {
    const int all_ones_exp = (1 << exp_bits) - 1;
    switch (non_finite) {
      case NonFinite::kNone: return uint8_t((all_ones_exp << man_bits) | ((1 << man_bits) - 1));
      case NonFinite::kAllOnesNaN: return uint8_t((all_ones_exp << man_bits) | ((1 << man_bits) - 2));
      case NonFinite::kIeee: return uint8_t(((all_ones_exp - 1) << man_bits) | ((1 << man_bits) - 1));
    }
    return 0;
  }
  FLAMIA_HD constexpr uint8_t nan_code() const {  // only meaningful when the format has NaN
    return uint8_t(((1 << exp_bits) - 1) << man_bits | ((1 << man_bits) - 1));
  }
};

inline constexpr MinifloatSpec kE4M3{4, 3, 7, NonFinite::kAllOnesNaN};
inline constexpr MinifloatSpec kE5M2{5, 2, 15, NonFinite::kIeee};
inline constexpr MinifloatSpec kE2M1{2, 1, 1, NonFinite::kNone};

inline constexpr double kE4M3Max = 448.0;
inline constexpr double kE5M2Max = 57344.0;
inline constexpr double kE2M1Max = 6.0;
// log2 of the largest E4M3 power of two below kE4M3Max (448 = 1.75 * 2^8); the OCP MX
// "floor" scale rule subtracts it.
inline constexpr int kE4M3MaxExponent = 8;

FLAMIA_HD double decode(const MinifloatSpec& f, uint8_t code) {
  const uint8_t sign = code & f.sign_bit();
  const int mag = code & (f.sign_bit() - 1);
  const int biased = mag >> f.man_bits;
  const int man = mag & ((1 << f.man_bits) - 1);
  const int all_ones_exp = (1 << f.exp_bits) - 1;
  double value;
  if (f.non_finite == NonFinite::kAllOnesNaN && biased == all_ones_exp && man == (1 << f.man_bits) - 1) {
    value = NAN;
  } else if (f.non_finite == NonFinite::kIeee && biased == all_ones_exp) {
    value = man == 0 ? INFINITY : NAN;
  } else if (biased == 0) {
    value = std::ldexp(double(man), f.min_exponent() - f.man_bits);
  } else {
    value = std::ldexp(double((1 << f.man_bits) + man), biased - f.bias - f.man_bits);
  }
  return sign ? -value : value;
}

// Encodes x with round-to-nearest-even; finite values beyond the range saturate.
FLAMIA_HD uint8_t encode(const MinifloatSpec& f, double x) {
  const uint8_t sign = std::signbit(x) ? f.sign_bit() : uint8_t(0);
  if (std::isnan(x) || (std::isinf(x) && f.non_finite == NonFinite::kAllOnesNaN)) {
    // E2M1 has no NaN code: it saturates here, and the NVFP4 quantizer makes the group's
    // E4M3 block scale NaN so the element still decodes as NaN (formats/scales.h).
    return f.non_finite == NonFinite::kNone ? uint8_t(sign | f.max_finite_code())
                                            : uint8_t(sign | f.nan_code());
  }
  if (std::isinf(x)) {
    if (f.non_finite == NonFinite::kIeee) return uint8_t(sign | (((1 << f.exp_bits) - 1) << f.man_bits));
    return uint8_t(sign | f.max_finite_code());
  }
  const double a = std::fabs(x);
  if (a == 0.0) return sign;
  int exp2_plus_one;
  std::frexp(a, &exp2_plus_one);  // a = m * 2^exp2_plus_one, m in [0.5, 1)
  int e = exp2_plus_one - 1;  // floor(log2 a)
  if (e < f.min_exponent()) e = f.min_exponent();
  // Steps of the lattice at this binade; exact because scaling by 2^k is exact.
  const double steps = std::rint(std::ldexp(a, f.man_bits - e));
  // Subnormals and normals share one formula: code = (e - emin) * 2^man + steps,
  // and a round-up to the next binade carries into the exponent field by itself.
  double mag = double(e - f.min_exponent()) * double(1 << f.man_bits) + steps;
  if (mag > double(f.max_finite_code())) mag = double(f.max_finite_code());
  return uint8_t(sign | uint8_t(mag));
}

// Rounds to the nearest value of the format (the decode of the encode).
FLAMIA_HD double round_to(const MinifloatSpec& f, double x) { return decode(f, encode(f, x)); }

// The shorthands copy the spec into a local constant: device code may not take the address of a
// namespace-scope constexpr object, which passing kE4M3 by reference would do.
FLAMIA_HD uint8_t encode_e4m3(double x) {
  constexpr MinifloatSpec f = kE4M3;
  return encode(f, x);
}
FLAMIA_HD double decode_e4m3(uint8_t c) {
  constexpr MinifloatSpec f = kE4M3;
  return decode(f, c);
}
FLAMIA_HD double round_e4m3(double x) {
  constexpr MinifloatSpec f = kE4M3;
  return round_to(f, x);
}

// An IEEE-style binary float with kMan mantissa bits and normal exponents kMinExp..kMaxExp (Inf
// and NaN, subnormals kept): x rounded to nearest even, overflowing to Inf as the hardware
// conversions do. Returned as the double it represents.
template <int kMan, int kMinExp, int kMaxExp>
FLAMIA_HD double round_to_ieee_float(double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  const double a = std::fabs(x);
  int exp2_plus_one;
  std::frexp(a, &exp2_plus_one);
  int e = exp2_plus_one - 1;
  if (e < kMinExp) e = kMinExp;  // subnormals: the lattice step stays 2^(kMinExp - kMan)
  double r = std::ldexp(std::rint(std::ldexp(a, kMan - e)), e - kMan);
  // The largest finite value is (2 - 2^-kMan) 2^kMaxExp; anything rounding above it is Inf.
  if (r > std::ldexp(double((1 << (kMan + 1)) - 1), kMaxExp - kMan)) r = INFINITY;
  return x < 0 ? -r : r;
}

// BF16: 8 exponent bits, 7 mantissa bits (the kernels' outputs).
FLAMIA_HD double round_to_bf16(double x) { return round_to_ieee_float<7, -126, 127>(x); }

// FP16 (IEEE binary16): 5 exponent bits, 10 mantissa bits, largest finite 65504 (the FP16 dQ
// accumulator and its conversions).
FLAMIA_HD double round_to_fp16(double x) { return round_to_ieee_float<10, -14, 15>(x); }

}  // namespace flamia::formats
