// Shared power-of-two scales: the UE8M0 format and the rules that pick a group's exponent.
//
// A group of values x with amax = max|x| is stored as codes c = E4M3(x / 2^e) and one
// exponent e. The two rules differ only in how they treat the top of the E4M3 range:
//   ceil : the smallest e with amax / 2^e <= 448       (never clips)
//   floor: e = floor(log2 amax) - 8                    (OCP MX; amax/2^e may reach 512 and clip)
// An all-zero group uses the smallest exponent, -127 (code 0x00; OCP MX's floor(log2 0) clamped):
// its codes are zero whatever the scale, and the smallest exponent keeps it out of every max taken
// over scales (the fold references), where an arbitrary e = 0 would dwarf a document of small
// values (an all-zero dO row, common at document ends, would zero all of dV). A group holding NaN
// or Inf gets the NaN exponent, so every value decoded from it is NaN (non-finite input is never
// silently zeroed or saturated).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/host_device.h"
#include "formats/minifloat.h"

namespace flamia::formats {

enum class ScaleRule : uint8_t { kCeil, kFloor };

// UE8M0: an unsigned 8-bit exponent, value 2^(code - 127); 0xFF is NaN.
inline constexpr int kUe8m0Bias = 127;
inline constexpr uint8_t kUe8m0NaN = 0xFF;
inline constexpr int kMinScaleExponent = -127;  // code 0x00
inline constexpr int kMaxScaleExponent = 127;   // code 0xFE

FLAMIA_HD uint8_t encode_ue8m0(int exponent) {
  if (exponent < kMinScaleExponent) exponent = kMinScaleExponent;
  if (exponent > kMaxScaleExponent) exponent = kMaxScaleExponent;
  return uint8_t(exponent + kUe8m0Bias);
}
FLAMIA_HD bool ue8m0_is_nan(uint8_t code) { return code == kUe8m0NaN; }
FLAMIA_HD int ue8m0_exponent(uint8_t code) { return int(code) - kUe8m0Bias; }  // not for NaN
FLAMIA_HD double decode_ue8m0(uint8_t code) {
  return ue8m0_is_nan(code) ? double(NAN) : std::ldexp(1.0, ue8m0_exponent(code));
}

// The UE8M0 scale code of a group with the given amax (max of |x| over the group; NaN if any
// element is NaN or Inf). Exponents outside UE8M0's range are clamped to it: a group so small
// that it needs e < -127 encodes partly as E4M3 subnormals or zeros.
FLAMIA_HD uint8_t scale_for_amax(double amax, ScaleRule rule) {
  if (std::isnan(amax) || std::isinf(amax)) return kUe8m0NaN;
  if (amax == 0.0) return encode_ue8m0(kMinScaleExponent);
  int k;
  const double frac = std::frexp(amax, &k);  // amax = frac * 2^k, frac in [0.5, 1)
  // floor(log2 amax) = k - 1, so the OCP floor rule is e = k - 1 - 8.
  int e = k - 1 - kE4M3MaxExponent;
  // amax / 2^e = frac * 2^9 lies in [256, 512); ceil bumps e when that exceeds 448 = 0.875 * 2^9.
  if (rule == ScaleRule::kCeil && frac > kE4M3Max / 512.0) e += 1;
  return encode_ue8m0(e);
}

// scale_for_amax for a float amax >= +0 (or NaN/Inf), from its bits alone: the kernels' per-row
// scales (sigma, tau of the backward) take it on every tile, where the double frexp was a hot spot.
// Equal to scale_for_amax(double(amax), rule) for every such float (tested over every exponent).
// A float's frexp fraction is (1 + mantissa / 2^23) / 2, so "frac > 448 / 512" is a mantissa test;
// zero and subnormal amax (floor(log2) <= -127, so e <= -135) clamp to the smallest exponent.
inline constexpr int kFloatMantissaBits = 23;
// The ceil rule's bump as a float mantissa test: mantissa / 2^23 > 2 * 448 / 512 - 1 = 0.75 (exact:
// the threshold is an integer).
inline constexpr uint32_t kCeilMantissa = uint32_t((2.0 * kE4M3Max / 512.0 - 1.0) * (1u << kFloatMantissaBits));
static_assert(kE4M3MaxExponent == 8 && kCeilMantissa == 0x600000u, "448 = 1.75 * 2^8");
FLAMIA_HD uint8_t scale_for_float_amax(float amax, ScaleRule rule) {
  constexpr int kFloatBias = 127, kMantissaBits = kFloatMantissaBits;
  uint32_t bits;
  std::memcpy(&bits, &amax, sizeof bits);
  const int biased = int(bits >> kMantissaBits) & 0xff;
  if (biased == 0xff) return kUe8m0NaN;
  if (biased == 0) return encode_ue8m0(kMinScaleExponent);
  int e = biased - kFloatBias - kE4M3MaxExponent;
  if (rule == ScaleRule::kCeil && (bits & ((1u << kMantissaBits) - 1)) > kCeilMantissa) e += 1;
  return encode_ue8m0(e);
}

// The ceil rule's scale of a float amax as the two powers a kernel applies, 2^s (after a product)
// and 2^-s (before rounding to E4M3), for s the exponent of scale_for_float_amax(|amax|, kCeil);
// both NaN for its NaN code. Integer arithmetic without branches (the backward's row scales take it
// per row and step): adding 0x1FFFFF to the bits carries into the exponent field exactly when the
// mantissa passes the ceil threshold 0x600000, so (bits + 0x1FFFFF) >> 23 is the biased exponent
// plus the ceil bump, and the code is that minus 8 (448 < 2^9), clamped at 0 (zero and subnormal
// amax). The largest finite amax gives code 247, so 2^-s is always normal; 2^s of code 0 is the
// subnormal 2^-127.
struct ScalePowers {
  float pow, inv;
};
FLAMIA_HD ScalePowers ceil_scale_powers(float amax) {
  constexpr uint32_t kCarry = (1u << kFloatMantissaBits) - kCeilMantissa - 1u;  // 0x1FFFFF
  uint32_t bits;
  std::memcpy(&bits, &amax, sizeof bits);
  bits &= 0x7fffffffu;
  const int biased_ceil = int((bits + kCarry) >> 23);
  const int code = biased_ceil > kE4M3MaxExponent ? biased_ceil - kE4M3MaxExponent : 0;
  const bool nan = bits >= 0x7f800000u;  // Inf or NaN
  const uint32_t pow_bits = uint32_t(code) << 23 > 0x400000u ? uint32_t(code) << 23 : 0x400000u;
  const uint32_t inv_bits = uint32_t(2 * kUe8m0Bias - code) << 23;
  const uint32_t out[2] = {nan ? 0x7fc00000u : pow_bits, nan ? 0x7fc00000u : inv_bits};
  ScalePowers powers;
  std::memcpy(&powers.pow, &out[0], sizeof(float));
  std::memcpy(&powers.inv, &out[1], sizeof(float));
  return powers;
}

// Quantizes one value against its group's scale code: the E4M3 code of x / 2^e.
// A group with the NaN scale stores zero codes: the NaN travels in the scale alone, so it reaches
// exactly the products that apply this group's scale. A NaN *code* would leak through tensor-core
// products even where the mask multiplies it by 0 (0 * NaN = NaN), e.g. into earlier queries.
FLAMIA_HD uint8_t encode_scaled_e4m3(double x, uint8_t scale) {
  if (ue8m0_is_nan(scale)) return 0;
  return encode_e4m3(std::ldexp(x, -ue8m0_exponent(scale)));
}
FLAMIA_HD double decode_scaled_e4m3(uint8_t code, uint8_t scale) {
  if (ue8m0_is_nan(scale)) return NAN;
  return std::ldexp(decode_e4m3(code), ue8m0_exponent(scale));
}

// NVFP4 (the mixed route's score operands, emulation only): E2M1 codes, an unsigned E4M3 scale per
// 16 consecutive features, and a second-level FP32 scale per (token, head). A per-tensor second
// level (the general NVFP4 format) would couple every document and every position to the largest
// value anywhere in the buffer, the future included; per token it is document- and prefix-local.
//   s2    = FP32(amax_token / (6 * 448))        round to nearest; the largest block scale lands on 448
//   b     = E4M3(amax_16 / (6 * s2))            quotient in double (6 * s2 is exact), RNE, saturating
//   code  = E2M1(x / (b * s2))                  quotient in double (b * s2 is exact), RNE, saturating at 6
//   value = decode(code) * b * s2
// An all-zero token takes s2 = 1 and an all-zero block b = 0 (its codes are signed zeros). A token
// holding NaN or Inf takes s2 = NaN: every value decoded from it is NaN (E2M1 has no NaN code).
inline constexpr int kNvfp4Block = 16;

inline float nvfp4_token_scale(double amax) {
  if (std::isnan(amax) || std::isinf(amax)) return NAN;
  if (amax == 0.0) return 1.0f;
  return float(amax / (kE2M1Max * kE4M3Max));
}
// The E4M3 code of a block's scale; NaN (0x7F) when the token scale is NaN.
inline uint8_t nvfp4_block_scale(double block_amax, float token_scale) {
  return encode(kE4M3, block_amax / (kE2M1Max * double(token_scale)));
}
// The E2M1 code of x in a block with scale code `block` and the token's scale. A zero step (an
// all-zero block) stores signed zeros; a NaN step stores zeros and the NaN travels in the scales.
inline uint8_t nvfp4_code(double x, uint8_t block, float token_scale) {
  const double step = decode(kE4M3, block) * double(token_scale);
  if (!(step > 0)) return uint8_t(std::signbit(x) && !std::isnan(step) ? kE2M1.sign_bit() : 0);
  return encode(kE2M1, x / step);
}
inline double nvfp4_value(uint8_t code, uint8_t block, float token_scale) {
  return decode(kE2M1, code) * decode(kE4M3, block) * double(token_scale);
}

}  // namespace flamia::formats
