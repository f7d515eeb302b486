// Quantizers of the CPU emulation: bit-exact codes and scales, the spec the GPU quantization
// kernels must match. Every scale group is local to one document (docs/DESIGN.md §2).
#pragma once

#include <cstdint>
#include <vector>

#include "core/documents.h"
#include "core/options.h"
#include "formats/scales.h"
#include "reference/tensor.h"

namespace flamia::reference {

// MXFP8 operand: E4M3 codes and one UE8M0 scale per (token, head). Scales are stored densely
// per token, like the kernels' scale metadata, so a block32 group simply repeats its scale on
// each of its tokens and an unaligned document start needs no special layout.
struct Mxfp8Tensor {
  int tokens = 0, heads = 0, dim = 0;
  std::vector<uint8_t> codes;   // [T, H, D] E4M3
  std::vector<uint8_t> scales;  // [T, H] UE8M0
  int64_t saturated = 0;        // finite inputs that clipped to +-448 (only the floor rule clips)

  uint8_t code(int t, int h, int f) const { return codes[(size_t(t) * heads + h) * dim + f]; }
  const uint8_t* code_row(int t, int h) const { return codes.data() + (size_t(t) * heads + h) * dim; }
  uint8_t scale(int t, int h) const { return scales[size_t(t) * heads + h]; }
  // The scale exponent as a double: NaN when the group held a non-finite value.
  double exponent(int t, int h) const {
    const uint8_t s = scale(t, h);
    return formats::ue8m0_is_nan(s) ? double(NAN) : double(formats::ue8m0_exponent(s));
  }
  double value(int t, int h, int f) const { return formats::decode_scaled_e4m3(code(t, h, f), scale(t, h)); }
};

Mxfp8Tensor quantize_mxfp8(const PackedTensor& x, const Documents& docs, ScaleGeometry geometry, ScaleRule rule);

// NVFP4 operand (emulation only; the mixed route's score operands): E2M1 codes, an unsigned E4M3
// scale per 16 features, and a second-level FP32 scale. The FP32 scale's scope is one token of one
// head, not the tensor: a per-tensor amax would couple every document and every position to the
// largest value anywhere in the buffer, including the future. Per token, it is both document- and
// prefix-local. The rules (formats/scales.h) put the largest block scale on 448.
struct Nvfp4Tensor {
  static constexpr int kBlock = formats::kNvfp4Block;
  int tokens = 0, heads = 0, dim = 0;
  std::vector<uint8_t> codes;         // [T, H, D] E2M1, one code per byte
  std::vector<uint8_t> block_scales;  // [T, H, D / 16] E4M3, non-negative
  std::vector<float> token_scales;    // [T, H]
  int64_t saturated = 0;              // finite inputs that clipped to +-6 (a block scale rounded down)

  const uint8_t* code_row(int t, int h) const { return codes.data() + (size_t(t) * heads + h) * dim; }
  const uint8_t* block_row(int t, int h) const { return block_scales.data() + (size_t(t) * heads + h) * (dim / kBlock); }
  float token_scale(int t, int h) const { return token_scales[size_t(t) * heads + h]; }
  double value(int t, int h, int f) const;
};

Nvfp4Tensor quantize_nvfp4(const PackedTensor& x);

// Normalized Walsh-Hadamard rotation along features, in blocks of hadamard_block_size(D)
// (core/options.h: 128, or 64 when D is not a multiple of 128). Orthogonal and symmetric, so it is its own inverse: rotating Q and K
// leaves Q.K^T unchanged, and gradients rotate back with the same call.
void hadamard_rotate(PackedTensor& x);

// A square-group quantizer for fresh matrices (U in its 32x32 Blackwell layout): each
// side x side square of `m` (rows x cols, row-major) gets one ceil-rule scale from its amax.
// Returns the reconstructed values; counts entries that were nonzero and rounded to zero.
struct SquareQuantized {
  std::vector<double> values;
  int64_t nonzero = 0, zeroed = 0;
};
SquareQuantized quantize_squares(const std::vector<double>& m, int rows, int cols, int side);

}  // namespace flamia::reference
