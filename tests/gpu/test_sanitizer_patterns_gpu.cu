// What `scripts/gpu_check.sh --sanitize` runs under compute-sanitizer (memcheck, racecheck,
// synccheck), and real tests in `ctest -L gpu` as well:
//
// - SanitizerPattern: the minimal reproduction of the hazard class racecheck reports in the
//   attention kernels (docs/KERNELS.md, "Sanitizers"). One producer warp stores a stage's values
//   into shared memory with plain stores and arrives on the stage's "full" mbarrier (tma.cuh's
//   StageRing); consumer warps wait on it, read the values and arrive on "empty", which the
//   producer waits on before it overwrites the stage. The program is correct (the values are
//   asserted), yet racecheck, which does not model mbarriers, reports each store against the
//   loads (and each load against the next round's store).
// - SanitizerWorkload: small training calls (forward, backward) over every kernel instance of one
//   head dim or the other: document and prefix isolation, GQA and MQA, short documents (the
//   persistent dK dV schedule), long ones (the grid schedule, consumer turns), per-token scales,
//   and the backward's FP16 dQ partials (one document of 8,192 tokens, the least they run on).
//   Each checks its outputs against the FP64 reference, so a run under a sanitizer is also a run
//   that computes the right thing. Sizes are kept small for racecheck.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "analysis/inputs.h"
#include "analysis/metrics.h"
#include "cuda/sm90/backward.h"
#include "cuda/sm90/tma.cuh"
#include "forward_harness.h"
#include "reference/attention_fp64.h"

namespace flamia::gpu_test {
namespace {

// --- the minimal reproduction -----------------------------------------------------------------
namespace pattern {

constexpr int kStages = 2;
constexpr int kConsumerWarps = 4;
constexpr int kThreads = 32 * (1 + kConsumerWarps);
constexpr int kValues = 64;  // per stage: two per producer lane
constexpr int kUses = 6;     // three rounds of the ring: every stage is refilled after its consumers

__host__ __device__ inline float value_of(int use, int i) { return float(use * 1000 + i); }

struct Shared {
  cuda::sm90::StageRing<kStages> ring;
  float values[kStages][kValues];
};

// out[consumer thread]: the sum over every use of the values the thread read (each lane reads
// values that other producer lanes stored).
__global__ void __launch_bounds__(kThreads) mbarrier_stage_kernel(float* out, int* mismatches) {
  __shared__ Shared sm;
  if (threadIdx.x == 0) {
    sm.ring.init(32, kConsumerWarps);  // full: every producer lane arrives; empty: one per consumer warp
    cuda::sm90::barrier_init_fence();
  }
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (warp == 0) {
    // Producer: wait until the stage is free, store its values (plain STS), arrive on "full".
    for (int use = 0; use < kUses; ++use) {
      sm.ring.wait_empty(use);
      float* v = sm.values[sm.ring.stage(use)];
      v[lane] = value_of(use, lane);
      v[lane + 32] = value_of(use, lane + 32);
      sm.ring.arrive_full(use);
    }
  } else {
    // Consumers: wait on "full", load (LDS) values other lanes stored, arrive on "empty" once the
    // whole warp's loads are done.
    const int c = int(threadIdx.x) - 32;
    float sum = 0.f;
    int bad = 0;
    for (int use = 0; use < kUses; ++use) {
      sm.ring.wait_full(use);
      const float* v = sm.values[sm.ring.stage(use)];
      const int i = (c * 7 + use * 13) % kValues, j = (c * 5 + 31) % kValues;
      const float a = v[i], b = v[j];
      bad += (a != value_of(use, i)) + (b != value_of(use, j));
      sum += a + b;
      __syncwarp();
      if (lane == 0) sm.ring.arrive_empty(use);
    }
    out[c] = sum;
    if (bad) atomicAdd(mismatches, bad);
  }
}

}  // namespace pattern

TEST(SanitizerPattern, MbarrierOrdersTheProducersStoresBeforeTheConsumersLoads) {
  FLAMIA_REQUIRE_GPU();
  constexpr int kConsumerThreads = 32 * pattern::kConsumerWarps;
  DeviceBuffer out(kConsumerThreads * sizeof(float)), mismatches(sizeof(int));
  FLAMIA_CUDA_CHECK(cudaMemset(mismatches.get(), 0, sizeof(int)));
  for (int rep = 0; rep < 4; ++rep)
    pattern::mbarrier_stage_kernel<<<8, pattern::kThreads>>>(static_cast<float*>(out.get()),
                                                             static_cast<int*>(mismatches.get()));
  FLAMIA_CUDA_CHECK(cudaGetLastError());
  FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
  int bad = -1;
  std::vector<float> sums(kConsumerThreads);
  FLAMIA_CUDA_CHECK(cudaMemcpy(&bad, mismatches.get(), sizeof(int), cudaMemcpyDeviceToHost));
  FLAMIA_CUDA_CHECK(cudaMemcpy(sums.data(), out.get(), sums.size() * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(bad, 0) << "a consumer read a value its stage did not hold";
  for (int c = 0; c < kConsumerThreads; ++c) {
    float want = 0.f;
    for (int use = 0; use < pattern::kUses; ++use) {
      const int i = (c * 7 + use * 13) % pattern::kValues, j = (c * 5 + 31) % pattern::kValues;
      want += pattern::value_of(use, i) + pattern::value_of(use, j);
    }
    ASSERT_EQ(sums[size_t(c)], want) << "consumer thread " << c;
  }
}

// --- small training calls ---------------------------------------------------------------------
using analysis::compare;

bool all_finite(const reference::PackedTensor& t) {
  return std::all_of(t.data.begin(), t.data.end(), [](double x) { return std::isfinite(x); });
}

// The first `tokens` tokens of t.
reference::PackedTensor leading_tokens(const reference::PackedTensor& t, int tokens) {
  reference::PackedTensor out(tokens, t.heads, t.dim);
  std::copy_n(t.data.begin(), out.data.size(), out.data.begin());
  return out;
}

struct Workload {
  const char* name;
  std::vector<int> lengths;
  int q_heads, kv_heads, dim;
  bool causal;
  int config;  // index into analysis::default_numerics_configs(): 0 block32, 1 token, 3 prefix
};

// Mean document < 512 tokens: the persistent dK dV schedule, no consumer turns; >= 512: one CTA
// per dK dV item, turns where scales are grouped (block32, or prefix isolation's interior codes).
std::vector<Workload> workloads() {
  return {
      {"DocumentShortGqa", {1, 33, 0, 129, 300}, 4, 2, 128, true, 0},
      {"DocumentLongMqa", {640, 700}, 2, 1, 128, true, 0},
      {"PrefixShortGqaD64", {1, 129, 300}, 4, 2, 64, true, 3},
      {"PrefixLongMqaD64", {700, 1000}, 2, 1, 64, true, 3},
      {"TokenScalesNonCausal", {700}, 2, 1, 128, false, 1},
  };
}

class SanitizerWorkload : public ::testing::TestWithParam<Workload> {};

TEST_P(SanitizerWorkload, MeetsTheBarsAgainstFp64) {
  FLAMIA_REQUIRE_GPU();
  const Workload w = GetParam();
  const NumericsOptions opt = analysis::default_numerics_configs()[w.config];
  const auto in = analysis::random_inputs({w.lengths, w.q_heads, w.kv_heads, w.dim}, 97);
  TrainingCall call(in, opt, w.causal);
  const auto gpu = call.run_training();
  const reference::AttentionShape shape{.causal = w.causal};
  const auto exact_fwd = reference::reference_forward(in.q, in.k, in.v, in.docs, shape);
  const auto exact = reference::reference_backward(in.q, in.k, in.v, exact_fwd.o, exact_fwd.lse, in.dout, in.docs, shape);
  ASSERT_TRUE(all_finite(gpu.forward.o));
  EXPECT_GE(compare(gpu.forward.o.data, exact_fwd.o.data).cosine, 0.998) << "o";
  const std::pair<const char*, std::pair<const reference::PackedTensor*, const reference::PackedTensor*>> grads[] = {
      {"dq", {&*gpu.forward.dq, &exact.dq}}, {"dk", {&gpu.dk, &exact.dk}}, {"dv", {&gpu.dv, &exact.dv}}};
  for (const auto& [name, t] : grads) {
    ASSERT_TRUE(all_finite(*t.first)) << name;
    EXPECT_GE(compare(t.first->data, t.second->data).cosine, 0.997) << name << " (docs/DESIGN.md §4 bar)";
  }
}

INSTANTIATE_TEST_SUITE_P(Small, SanitizerWorkload, ::testing::ValuesIn(workloads()),
                         [](const ::testing::TestParamInfo<Workload>& i) { return std::string(i.param.name); });

// The backward's FP16 dQ partials (flamia_backward_saved's default where they apply: D = 128, causal,
// document isolation, documents of >= 8,192 tokens on average) on the smallest call they run on.
// Causal rows < kChecked see only keys < kChecked, so their O and dQ are the FP64 reference's of
// the leading kChecked tokens alone.
TEST(SanitizerWorkload, DqPartialsOneDocumentOf8192Tokens) {
  FLAMIA_REQUIRE_GPU();
  constexpr int kTokens = cuda::sm90::kDqPartialsFromMeanDocument, kChecked = 512;
  ASSERT_TRUE(cuda::sm90::dq_partials_supported(128, true, false, kTokens, 1));
  const auto in = analysis::random_inputs({{kTokens}, 2, 1, 128}, 5);
  TrainingCall call(in, NumericsOptions{}, true, QkvHandOver::kSavedCodes);
  ASSERT_EQ(call.options.deterministic, 0) << "the FP16 partials are the non-deterministic reduction";
  const auto gpu = call.run_training();
  ASSERT_TRUE(all_finite(gpu.forward.o));
  ASSERT_TRUE(all_finite(*gpu.forward.dq));
  ASSERT_TRUE(all_finite(gpu.dk));
  ASSERT_TRUE(all_finite(gpu.dv));

  const std::vector<int> checked = {kChecked};
  const Documents docs = Documents::from_lengths(checked);
  const auto q = leading_tokens(in.q, kChecked), k = leading_tokens(in.k, kChecked),
             v = leading_tokens(in.v, kChecked), dout = leading_tokens(in.dout, kChecked);
  const reference::AttentionShape shape{};
  const auto fwd = reference::reference_forward(q, k, v, docs, shape);
  const auto grads = reference::reference_backward(q, k, v, fwd.o, fwd.lse, dout, docs, shape);
  EXPECT_GE(compare(leading_tokens(gpu.forward.o, kChecked).data, fwd.o.data).cosine, 0.998) << "o";
  EXPECT_GE(compare(leading_tokens(*gpu.forward.dq, kChecked).data, grads.dq.data).cosine, 0.997)
      << "dq (docs/DESIGN.md §4 bar)";
}

}  // namespace
}  // namespace flamia::gpu_test
