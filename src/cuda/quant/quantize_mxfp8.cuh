// MXFP8 quantization of packed variable-length BF16 operands on the GPU (sm_90a).
//
// The spec is the CPU quantizer reference::quantize_mxfp8 (src/reference/quantize.cpp): the
// codes and scales written here are bitwise identical to it. Scale groups are counted from each
// document start (block32: 32 tokens x D features of one head, the last group of a document may
// be short; token: one token x D features), amax is NaN as soon as the group holds a NaN or Inf
// (scale 0xFF; formats::encode_scaled_e4m3 stores such a group's codes as zeros). The scale comes
// from the shared host/device codec (formats::scale_for_float_amax of the amax: detail::
// scale_for_bf16_amax, equal to the CPU's formats::scale_for_amax on every BF16 value); the codes
// from the hardware E4M3 conversion (detail::encode_scaled_e4m3x4), which equals the shared codec
// formats::encode_scaled_e4m3 on every input the kernel gives it (tested exhaustively on the GPU).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/options.h"
#ifdef __CUDACC__
#include "cuda/fp8_convert.cuh"
#endif
#include "formats/host_device.h"
#include "formats/minifloat.h"
#include "formats/scales.h"

namespace flamia::cuda {

namespace detail {

// The per-element steps of the kernel, exposed so that tests can check them exhaustively against
// the host codecs (tests/gpu/test_quantize_gpu.cu).

// The scale code of a group whose amax is the BF16 bit pattern `bits` (sign cleared, low 16 bits;
// a pattern above 0x7F80, Inf, is NaN): formats::scale_for_float_amax of the float that pattern
// widens to (exactly: a BF16 is the top half of a float), from the bits alone, so it cannot depend
// on FTZ or fast-math flags. Equal to the CPU quantizer's formats::scale_for_amax of the amax's
// double for every pattern (DeviceCodecs.Bf16ScaleMatchesTheDoubleRuleExhaustively); the double
// rule here had a chain of double operations and branches per row on the scale phase's path.
FLAMIA_HD uint8_t scale_for_bf16_amax(uint32_t bits, formats::ScaleRule rule) {
  float amax;
  const uint32_t widened = bits << 16;
  std::memcpy(&amax, &widened, sizeof amax);
  return formats::scale_for_float_amax(amax, rule);
}

#ifdef __CUDACC__
// formats::encode_scaled_e4m3 of the four BF16 values packed in w0 and w1 (low halves first) under
// the UE8M0 scale code `scale`, as four bytes (the first value in the low byte), for finite values:
// a group holding NaN or Inf has the NaN scale, whose codes are zero. The fast form of the shared
// double codec:
//   - x * 2^-e is exact in float (BF16 widens exactly; a power of two only moves the exponent)
//     unless it falls below 2^-126, and every such value is < 2^-10, half E4M3's smallest
//     subnormal, so it and its float rounding both encode as a signed zero;
//   - the conversion (pack_e4m3x4) rounds to nearest even, subnormals included, and saturates
//     finite values beyond 448 to +-448, as the codec does;
//   - the multiply is inline PTX without .ftz, so a BF16 subnormal is not flushed under -ftz.
// It is the composition of a per-row half (inverse_scale and code_mask, once per scale) and a
// per-chunk half (encode_e4m3x4), which the kernel calls apart: the row half has branches
// (subnormal powers of two) that cost more than the chunk's arithmetic when run for every chunk.
__device__ __forceinline__ float inverse_scale(uint8_t scale) {
  return formats::ue8m0_is_nan(scale) ? __uint_as_float(0x7FC00000u) : exp2i_float(-formats::ue8m0_exponent(scale));
}
// What encode_e4m3x4 keeps of its codes under inverse_scale(s): none for the NaN scale.
__device__ __forceinline__ uint32_t code_mask(float inv_scale) {
  return (__float_as_uint(inv_scale) & 0x7FFFFFFFu) > 0x7F800000u ? 0u : ~0u;
}
// inv_scale and mask from inverse_scale and code_mask of one scale.
__device__ __forceinline__ uint32_t encode_e4m3x4(uint32_t w0, uint32_t w1, float inv_scale, uint32_t mask) {
  float x[4];
  const uint32_t widened[4] = {w0 << 16, w0 & 0xFFFF0000u, w1 << 16, w1 & 0xFFFF0000u};
#pragma unroll
  for (int i = 0; i < 4; ++i) asm("mul.rn.f32 %0, %1, %2;" : "=f"(x[i]) : "f"(__uint_as_float(widened[i])), "f"(inv_scale));
  return pack_e4m3x4(x[0], x[1], x[2], x[3]) & mask;
}
__device__ __forceinline__ uint32_t encode_scaled_e4m3x4(uint32_t w0, uint32_t w1, uint8_t scale) {
  const float inv = inverse_scale(scale);
  return encode_e4m3x4(w0, w1, inv, code_mask(inv));
}
#endif

}  // namespace detail

// Quantizes x [total_tokens, heads, dim] (BF16, element strides token_stride and head_stride,
// features contiguous) into scales [total_tokens, heads] (UE8M0, one byte per token and head; a
// block32 group repeats its scale on each of its tokens) and the E4M3 codes in one or both of two
// layouts: `codes` [total_tokens, heads, dim] (contiguous) and `transposed_codes`, the transposed,
// padded layout of core/operand_layout.h ([heads, dim, layout::transposed_tokens(total_tokens,
// num_docs)], 16-byte aligned; every slot of a document's steps is written, the padding with zero
// codes, slots outside every document's steps are not). Either codes pointer may be null, not both.
//
// cu_seqlens (device, num_docs + 1 entries) delimits the documents; entries are clamped into
// [0, total_tokens] (and each end to at least its begin), so malformed offsets cannot make the
// kernel read or write out of bounds, though they give meaningless results. Tokens outside every
// document are not written. The grid is one CTA per 32-token tile slot of core/schedule.h
// and group of 4 heads, so no document length is needed on the host.
//
// Requirements (else cudaErrorInvalidValue, nothing launched): dim a multiple of 8 in [8, 256],
// 1 <= heads <= 65535, non-null x, cu_seqlens, scales and one codes pointer when there is work,
// transposed_codes 16-byte aligned. 16-byte loads are used when x is
// 16-byte aligned and both strides are multiples of 8 elements, scalar loads otherwise; codes
// are written 8 bytes at a time when the codes pointer is 8-byte aligned. Asynchronous on
// `stream`; returns the launch status.
//
// second (not null; geometry must be kToken): the same input also encoded with block32 groups in
// the same pass (read once), into second's buffers as above (either codes pointer may be null;
// the same alignment rules), bitwise what a block32 launch of its own writes, except that with
// skip_tile > 0 (a multiple of 32) the positions of each document's last skip_tiles tiles of
// skip_tile tokens (counted from the document start) get no second codes, scales or transposed
// slots, and idle slots are not zeroed in the second's transposed layout. Prefix isolation's
// interior codes of K and V next to their per-token codes: no pair reads a document's last
// tiling::kFrontierTiles frontier tiles with them, and every tile read with them lies inside its
// document.
//
// row_delta (not null; x is the backward's incoming gradient dO; dim 64 or 128, 16-byte loads, both
// codes pointers set, second null): the launch also forms the backward's row term D_i of every row
// (token t, head h) of every document, delta[h * total_tokens + t] = 2^e_th * sum_f c_thf * o_thf,
// from the codes and scale it writes and the forward's BF16 output o (same shape as x, rows 16-byte
// aligned), in the fixed order of cuda/gradient_row_dot.cuh: bitwise what the backward prep pass
// forms. The backward's deterministic passes take D_i from here, where dO's codes are at hand,
// instead of reading them back in a pass of their own.
struct BlockCodes {
  uint8_t* codes = nullptr;
  uint8_t* transposed_codes = nullptr;
  uint8_t* scales = nullptr;
  int skip_tile = 0, skip_tiles = 0;
};
struct RowDelta {
  const __nv_bfloat16* o = nullptr;
  int64_t o_stride_token = 0, o_stride_head = 0;  // elements
  float* delta = nullptr;                         // [heads, total_tokens]
};
cudaError_t launch_quantize_mxfp8(const __nv_bfloat16* x, int64_t token_stride, int64_t head_stride, int total_tokens,
                                  int heads, int dim, const int32_t* cu_seqlens, int num_docs,
                                  flamia::ScaleGeometry geometry, flamia::ScaleRule rule, uint8_t* codes,
                                  uint8_t* transposed_codes, uint8_t* scales, cudaStream_t stream,
                                  const BlockCodes* second = nullptr, const RowDelta* row_delta = nullptr);

// The mask-aware V fold reference: prefix_max[t, h] = the largest V scale exponent of head h over
// positions [document start, t] of t's document, as a UE8M0 byte [total_tokens, heads]. NaN
// propagates: once a 0xFF scale is seen, the rest of the document stays 0xFF. (UE8M0 codes are
// the exponent plus 127, so the byte order is the exponent order and 0xFF, NaN, is the largest
// byte: the running byte max is exactly the NaN-propagating running max of the exponents.)
// cu_seqlens is clamped as above. max_doc_len, a bound on the document lengths, only picks the
// grid (one CTA per document when every document fits one chunk; any bound gives the same bytes).
// Asynchronous on `stream`; returns the launch status.
cudaError_t launch_prefix_max_scales(const uint8_t* scales, int total_tokens, int heads, const int32_t* cu_seqlens,
                                     int num_docs, int max_doc_len, uint8_t* prefix_max, cudaStream_t stream);

}  // namespace flamia::cuda
