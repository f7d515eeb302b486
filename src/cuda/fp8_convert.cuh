// Exact powers of two (of integers and of UE8M0 scale codes) and the hardware E4M3 conversions,
// shared by the quantization kernel and the Hopper attention kernels (device code only).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "formats/scales.h"

namespace flamia::cuda {

// 2^e as a float, exact (built from the bits), for any integer e: subnormal down to 2^-149, 0
// below, +inf above 2^127.
__device__ __forceinline__ float exp2i_float(int e) {
  if (e > 127) return __int_as_float(0x7f800000);
  if (e >= -126) return __int_as_float((e + 127) << 23);
  return e >= -149 ? __int_as_float(1 << (e + 149)) : 0.f;
}

// 2^e and 2^-e of a UE8M0 scale code (e = code - 127; NaN for the NaN code), exact, from the code's
// bits without a branch: 2^e's biased float exponent is the code itself (code 0: the subnormal
// 2^-127), 2^-e's is 254 - code (code 254: 2^-127).
static_assert(formats::kUe8m0NaN == 0xFF && formats::kUe8m0Bias == 127, "a code is its 2^e's biased float exponent");
__device__ __forceinline__ float pow2_of_scale(uint8_t code) {
  return __uint_as_float(code == formats::kUe8m0NaN ? 0x7fc00000u : code == 0 ? 0x00400000u : uint32_t(code) << 23);
}
__device__ __forceinline__ float inv_pow2_of_scale(uint8_t code) {
  return __uint_as_float(code == formats::kUe8m0NaN ? 0x7fc00000u : code == 254 ? 0x00400000u : uint32_t(254 - code) << 23);
}

// Two floats to two E4M3 codes (round to nearest even, subnormals included; finite values beyond
// 448 saturate to +-448; NaN stays NaN), lo in the low byte.
__device__ __forceinline__ uint32_t pack_e4m3x2(float lo, float hi) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

// Four floats to four E4M3 codes (as pack_e4m3x2), a in the low byte: two conversions whose 16-bit
// results make one word (ptxas writes the second into the first's upper half: F2FP's merge operand),
// where two zero-extended pack_e4m3x2 results took a mask, a shift and an OR per word.
__device__ __forceinline__ uint32_t pack_e4m3x4(float a, float b, float c, float d) {
  uint32_t word;
  asm("{\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
      "mov.b32 %0, {lo, hi};\n\t}"
      : "=r"(word)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  return word;
}

// The values of two E4M3 codes (the low byte of `codes` first), through the hardware's E4M3 to
// half conversion: exact (every E4M3 value is a half).
__device__ __forceinline__ float2 decode_e4m3x2(uint16_t codes) {
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes), __NV_E4M3)));
}

}  // namespace flamia::cuda
