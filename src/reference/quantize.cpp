#include "reference/quantize.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "formats/minifloat.h"

namespace flamia::reference {

using formats::ScaleRule;

namespace {

// max(amax, max|x|), or NaN as soon as a non-finite value shows up (NaN and Inf both make the
// group's scale NaN, so they propagate instead of saturating).
double nan_max_abs(const double* x, int n, double amax) {
  for (int i = 0; i < n; ++i) {
    const double a = std::fabs(x[i]);
    if (!std::isfinite(a)) return NAN;
    if (a > amax) amax = a;
  }
  return amax;
}

}  // namespace

Mxfp8Tensor quantize_mxfp8(const PackedTensor& x, const Documents& docs, ScaleGeometry geometry, ScaleRule rule) {
  if (docs.total_tokens() != x.tokens) {
    throw std::invalid_argument("quantize_mxfp8: cu_seqlens covers " + std::to_string(docs.total_tokens()) +
                                " tokens but the tensor has " + std::to_string(x.tokens));
  }
  Mxfp8Tensor q;
  q.tokens = x.tokens, q.heads = x.heads, q.dim = x.dim;
  q.codes.resize(x.size());
  q.scales.resize(size_t(x.tokens) * x.heads);
  for (int d = 0; d < docs.count(); ++d) {
    const int begin = docs.begin(d), len = docs.length(d);
    for (int h = 0; h < x.heads; ++h) {
      for (int g0 = 0; g0 < len; g0 = scale_group_end(g0, geometry, len)) {
        const int g1 = scale_group_end(g0, geometry, len);
        double amax = 0.0;
        for (int p = g0; p < g1; ++p) amax = nan_max_abs(x.row(begin + p, h), x.dim, amax);
        const uint8_t scale = formats::scale_for_amax(amax, rule);
        const double limit = std::ldexp(formats::kE4M3Max, formats::ue8m0_is_nan(scale) ? 0 : formats::ue8m0_exponent(scale));
        for (int p = g0; p < g1; ++p) {
          const int t = begin + p;
          q.scales[size_t(t) * x.heads + h] = scale;
          const double* src = x.row(t, h);
          uint8_t* dst = q.codes.data() + (size_t(t) * x.heads + h) * x.dim;
          for (int f = 0; f < x.dim; ++f) {
            dst[f] = formats::encode_scaled_e4m3(src[f], scale);
            if (!formats::ue8m0_is_nan(scale) && std::fabs(src[f]) > limit) ++q.saturated;
          }
        }
      }
    }
  }
  return q;
}

double Nvfp4Tensor::value(int t, int h, int f) const {
  const size_t row = size_t(t) * heads + h;
  return formats::nvfp4_value(codes[row * dim + f], block_scales[row * (dim / kBlock) + f / kBlock], token_scales[row]);
}

Nvfp4Tensor quantize_nvfp4(const PackedTensor& x) {
  if (x.dim % Nvfp4Tensor::kBlock != 0) {
    throw std::invalid_argument("quantize_nvfp4: head dim must be a multiple of 16, got " + std::to_string(x.dim));
  }
  Nvfp4Tensor q;
  q.tokens = x.tokens, q.heads = x.heads, q.dim = x.dim;
  const int blocks = x.dim / Nvfp4Tensor::kBlock;
  q.codes.resize(x.size());
  q.block_scales.resize(size_t(x.tokens) * x.heads * blocks);
  q.token_scales.resize(size_t(x.tokens) * x.heads);
  for (int t = 0; t < x.tokens; ++t) {
    for (int h = 0; h < x.heads; ++h) {
      const size_t row = size_t(t) * x.heads + h;
      const double* src = x.row(t, h);
      // The rules live in formats/scales.h: the token scale puts the largest block scale on 448.
      const float token_scale = formats::nvfp4_token_scale(nan_max_abs(src, x.dim, 0.0));
      q.token_scales[row] = token_scale;
      for (int b = 0; b < blocks; ++b) {
        const double* blk = src + b * Nvfp4Tensor::kBlock;
        const uint8_t bs = formats::nvfp4_block_scale(nan_max_abs(blk, Nvfp4Tensor::kBlock, 0.0), token_scale);
        q.block_scales[row * blocks + b] = bs;
        const double step = formats::decode(formats::kE4M3, bs) * double(token_scale);
        for (int f = 0; f < Nvfp4Tensor::kBlock; ++f) {
          q.codes[row * x.dim + b * Nvfp4Tensor::kBlock + f] = formats::nvfp4_code(blk[f], bs, token_scale);
          if (step > 0 && std::fabs(blk[f]) / step > formats::kE2M1Max) ++q.saturated;
        }
      }
    }
  }
  return q;
}

void hadamard_rotate(PackedTensor& x) {
  const int n = hadamard_block_size(x.dim);
  if (n == 0) throw std::invalid_argument("hadamard rotation needs head dim a multiple of 64, got " + std::to_string(x.dim));
  const double norm = 1.0 / std::sqrt(double(n));
  for (int t = 0; t < x.tokens; ++t) {
    for (int h = 0; h < x.heads; ++h) {
      double* row = x.row(t, h);
      for (int b = 0; b < x.dim; b += n) {
        double* v = row + b;
        for (int len = 1; len < n; len <<= 1)  // in-place fast Walsh-Hadamard transform
          for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; ++j) {
              const double a = v[j], c = v[j + len];
              v[j] = a + c, v[j + len] = a - c;
            }
        for (int j = 0; j < n; ++j) v[j] *= norm;
      }
    }
  }
}

SquareQuantized quantize_squares(const std::vector<double>& m, int rows, int cols, int side) {
  SquareQuantized out;
  out.values.assign(m.size(), 0.0);
  for (int r0 = 0; r0 < rows; r0 += side) {
    for (int c0 = 0; c0 < cols; c0 += side) {
      const int r1 = std::min(rows, r0 + side), c1 = std::min(cols, c0 + side);
      double amax = 0.0;
      for (int r = r0; r < r1; ++r) amax = nan_max_abs(&m[size_t(r) * cols + c0], c1 - c0, amax);
      const uint8_t scale = formats::scale_for_amax(amax, ScaleRule::kCeil);
      for (int r = r0; r < r1; ++r) {
        for (int c = c0; c < c1; ++c) {
          const double u = m[size_t(r) * cols + c];
          const uint8_t code = formats::encode_scaled_e4m3(u, scale);
          const double back = formats::decode_scaled_e4m3(code, scale);
          out.values[size_t(r) * cols + c] = back;
          if (u != 0.0) {
            ++out.nonzero;
            if (back == 0.0) ++out.zeroed;
          }
        }
      }
    }
  }
  return out;
}

}  // namespace flamia::reference
