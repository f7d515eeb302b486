// Backward pass 1: D_i = sum_f dO^_if O_if with dO^ the reconstructed (quantized) incoming
// gradient and O the saved BF16 forward output, as the emulation defines it:
//   D_i = 2^eg_i * sum_f cg_if * O_if.
// One warp per (token, query head) row.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/backward.h"
#include "cuda/sm90/fp8_math.cuh"

namespace flamia::cuda::sm90 {
namespace {

constexpr int kWarpsPerBlock = 8;

template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) backward_prep_kernel(const BackwardParams p) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;  // token * Hq + head
  if (row >= int64_t(p.total_tokens) * p.q_heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t token = row / p.q_heads;
  const int head = int(row % p.q_heads);
  const uint8_t* g = p.g_codes + row * D;
  const auto* o = static_cast<const __nv_bfloat16*>(p.o) + token * p.o_stride_token + head * p.o_stride_head;
  float sum = 0.f;
#pragma unroll
  for (int f = lane; f < D; f += 32) sum += decode_e4m3(g[f]) * __bfloat162float(o[f]);
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, m);
  if (lane == 0) p.delta[int64_t(head) * p.total_tokens + token] = sum * pow2_of_scale(p.g_scales[row]);
}

}  // namespace

int launch_backward_prep(const BackwardParams& p, void* stream) {
  const int64_t rows = int64_t(p.total_tokens) * p.q_heads;
  const dim3 grid(unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock)), block(kWarpsPerBlock * 32);
  auto s = static_cast<cudaStream_t>(stream);
  if (p.head_dim == 128) backward_prep_kernel<128><<<grid, block, 0, s>>>(p);
  else if (p.head_dim == 64) backward_prep_kernel<64><<<grid, block, 0, s>>>(p);
  else return int(cudaErrorInvalidValue);
  return int(cudaGetLastError());
}

}  // namespace flamia::cuda::sm90
