// C ABI over the format codecs, so tests/python can compare them with ml_dtypes via ctypes.
// Array in, array out; formats are numbered 0 = E4M3, 1 = E5M2, 2 = E2M1. The functions that
// take a format or rule return 0 on success and -1 for an unknown number (nothing written).
#include <cstdint>

#include "formats/minifloat.h"
#include "formats/scales.h"

namespace {

namespace fmt = flamia::formats;

const fmt::MinifloatSpec* spec_of(int format) {
  switch (format) {
    case 0: return &fmt::kE4M3;
    case 1: return &fmt::kE5M2;
    case 2: return &fmt::kE2M1;
  }
  return nullptr;
}

}  // namespace

extern "C" {

int flamia_codec_shim_version() { return 3; }

int flamia_shim_encode(int format, const double* x, uint8_t* codes, int64_t n) {
  const fmt::MinifloatSpec* f = spec_of(format);
  if (!f) return -1;
  for (int64_t i = 0; i < n; ++i) codes[i] = fmt::encode(*f, x[i]);
  return 0;
}

int flamia_shim_decode(int format, const uint8_t* codes, double* out, int64_t n) {
  const fmt::MinifloatSpec* f = spec_of(format);
  if (!f) return -1;
  for (int64_t i = 0; i < n; ++i) out[i] = fmt::decode(*f, codes[i]);
  return 0;
}

void flamia_shim_round_bf16(const double* x, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fmt::round_to_bf16(x[i]);
}

void flamia_shim_round_fp16(const double* x, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fmt::round_to_fp16(x[i]);
}

// rule: 0 = ceil, 1 = floor (formats/scales.h).
int flamia_shim_scale_for_amax(const double* amax, int rule, uint8_t* out, int64_t n) {
  if (rule != 0 && rule != 1) return -1;
  const fmt::ScaleRule r = rule == 0 ? fmt::ScaleRule::kCeil : fmt::ScaleRule::kFloor;
  for (int64_t i = 0; i < n; ++i) out[i] = fmt::scale_for_amax(amax[i], r);
  return 0;
}

void flamia_shim_decode_ue8m0(const uint8_t* codes, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fmt::decode_ue8m0(codes[i]);
}

}  // extern "C"
