// Backward pass 1: D_i = sum_f dO^_if O_if with dO^ the reconstructed (quantized) incoming
// gradient and O the saved BF16 forward output, as the emulation defines it:
//   D_i = 2^eg_i * sum_f cg_if * O_if.
// A row (token, query head) per D / 8 lanes, 8 features per lane: one 8-byte load of dO's codes
// and one 16-byte load of O each (one warp per row with 1- and 2-byte loads took 174 us per
// 16x4096 call, half of DRAM's bandwidth). The sum's order (8 products per lane, then a butterfly
// over the row's lanes) is fixed, so D_i is deterministic.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/backward.h"
#include "cuda/sm90/fp8_math.cuh"

namespace flamia::cuda::sm90 {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kFeaturesPerLane = 8;  // an 8-byte load of codes, a 16-byte load of BF16 O
template <int D>
constexpr int kRowsPerWarp = 32 / (D / kFeaturesPerLane);

template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) backward_prep_kernel(const BackwardParams p) {
  constexpr int kLanesPerRow = D / kFeaturesPerLane;
  static_assert(kLanesPerRow * kFeaturesPerLane == D && kRowsPerWarp<D> * kLanesPerRow == 32,
                "rows split a warp evenly");
  const int lane = int(threadIdx.x) % 32;
  const int64_t warp = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t row = warp * kRowsPerWarp<D> + lane / kLanesPerRow;  // token * Hq + head
  const bool valid = row < int64_t(p.total_tokens) * p.q_heads;   // every lane shuffles below
  const int64_t token = row / p.q_heads;
  const int head = int(row % p.q_heads);
  const int f0 = lane % kLanesPerRow * kFeaturesPerLane;
  float sum = 0.f;
  if (valid) {
    const uint2 codes = __ldg(reinterpret_cast<const uint2*>(p.g_codes + row * D + f0));
    const auto* o_row = static_cast<const __nv_bfloat16*>(p.o) + token * p.o_stride_token + head * p.o_stride_head;
    const uint4 o = __ldg(reinterpret_cast<const uint4*>(o_row + f0));  // rows are 16-byte aligned (C API)
    const uint32_t o_words[4] = {o.x, o.y, o.z, o.w}, code_words[2] = {codes.x, codes.y};
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // features f0 + 2k, f0 + 2k + 1
      const float2 g = decode_e4m3x2(uint16_t(code_words[k / 2] >> (16 * (k % 2))));
      sum = fmaf(g.x, __uint_as_float(o_words[k] << 16), sum);
      sum = fmaf(g.y, __uint_as_float(o_words[k] & 0xFFFF0000u), sum);
    }
  }
#pragma unroll
  for (int m = kLanesPerRow / 2; m > 0; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (valid && f0 == 0) p.delta[int64_t(head) * p.total_tokens + token] = sum * pow2_of_scale(p.g_scales[row]);
}

}  // namespace

int launch_backward_prep(const BackwardParams& p, void* stream) {
  const int64_t rows = int64_t(p.total_tokens) * p.q_heads;
  auto s = static_cast<cudaStream_t>(stream);
  auto launch = [&](auto d) {
    constexpr int D = decltype(d)::value;
    const int64_t rows_per_block = int64_t(kWarpsPerBlock) * kRowsPerWarp<D>;
    backward_prep_kernel<D><<<unsigned((rows + rows_per_block - 1) / rows_per_block), kWarpsPerBlock * 32, 0, s>>>(p);
  };
  if (p.head_dim == 128) launch(std::integral_constant<int, 128>{});
  else if (p.head_dim == 64) launch(std::integral_constant<int, 64>{});
  else return int(cudaErrorInvalidValue);
  return int(cudaGetLastError());
}

}  // namespace flamia::cuda::sm90
