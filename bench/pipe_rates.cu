// What one SM of this GPU issues per clock: 2^x on the MUFU (ex2.approx.ftz.f32, the attention
// kernels' exponentials), FP32 FMAs, and the two mixed as a softmax's exponent pass mixes them
// (one 2^x and six FP32 operations per score). The budget of KERNELS.md ("Where the time goes")
// rests on these rates; this measures them rather than taking them from a table.
//
//   build/flamia_pipe_rates        (on a machine with the GPU; built with FLAMIA_CUDA)
//
// Each variant is one launch of a CTA per SM; every thread runs 8 independent chains, so the rate
// is the pipe's throughput, not a chain's latency. Elements per clock come from clock64() of one
// CTA, the effective clock from the same cycles over the launch's event time.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "cuda_check.h"

namespace {

enum class Mix { kExp2, kFma, kSoftmax };
constexpr int kChains = 8;

template <Mix kMix>
__global__ void pipe_kernel(float* sink, long long* cycles, int iterations) {
  float x[kChains];
  for (int j = 0; j < kChains; ++j) x[j] = -0.001f * float(threadIdx.x + j);
  const long long t0 = clock64();
  for (int i = 0; i < iterations; ++i) {
#pragma unroll
    for (int j = 0; j < kChains; ++j) {
      if constexpr (kMix == Mix::kExp2) {
        asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[j]));
      } else if constexpr (kMix == Mix::kFma) {
        x[j] = fmaf(x[j], 0.999f, -0.001f);
      } else {  // 2^x, then what a score takes around it: FFMA, FMUL, FADD, FFMA, FMUL, FMNMX
        float p;
        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p) : "f"(x[j]));
        x[j] = fminf(0.5f * fmaf(fmaf(p, 0.5f, x[j]) * 0.999f + p, 0.7f, -0.3f), 0.f);
      }
    }
  }
  const long long t1 = clock64();
  float s = 0.f;
  for (int j = 0; j < kChains; ++j) s += x[j];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;  // keeps the chains alive
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <Mix kMix>
void measure(const char* name, int sms, int threads, int iterations, int instructions_per_element) {
  float* sink = nullptr;
  long long* cycles = nullptr;
  CHECK(cudaMalloc(&sink, sizeof(float) * sms * threads));
  CHECK(cudaMalloc(&cycles, sizeof(long long) * sms));
  pipe_kernel<kMix><<<sms, threads>>>(sink, cycles, 16);  // warm-up
  CHECK(cudaGetLastError());
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start));
  pipe_kernel<kMix><<<sms, threads>>>(sink, cycles, iterations);
  CHECK(cudaEventRecord(stop));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  long long cta_cycles = 0;
  CHECK(cudaMemcpy(&cta_cycles, cycles, sizeof(long long), cudaMemcpyDeviceToHost));
  const double elements = double(threads) * iterations * kChains;  // per SM
  std::printf("%-34s %5d threads/SM  %8.3f ms  %9lld cycles  %6.2f elements/clock/SM  (%d instr/element, %4.0f MHz)\n",
              name, threads, ms, cta_cycles, elements / double(cta_cycles), instructions_per_element,
              double(cta_cycles) / (ms * 1e3));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaFree(sink));
  CHECK(cudaFree(cycles));
}

}  // namespace

int main() {
  int device = 0, sms = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("%s, %d SMs\n", prop.name, sms);
  for (int threads : {128, 256, 512, 1024}) measure<Mix::kExp2>("ex2.approx.ftz.f32", sms, threads, 4096, 1);
  for (int threads : {256, 1024}) measure<Mix::kFma>("fma.rn.f32", sms, threads, 4096, 1);
  for (int threads : {256, 1024}) measure<Mix::kSoftmax>("ex2 + 6 FP32 (a softmax's mix)", sms, threads, 2048, 7);
  return 0;
}
