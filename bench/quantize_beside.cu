// Could the forward's quantization pass run beside its attention kernel instead of before it
// (docs/LEVERS.md, "Not yet tried": the quantizer on a few SMs, the forward on the rest)? What
// decides it, measured on the GPU over one workload (T tokens, H heads for Q, K and V, D = 128,
// --docs equal documents, random BF16), each case a loop of at least --seconds:
//   1. the pass alone, on every SM: the launches of flamia_forward's quantize_qkv (Q and K codes,
//      V's transposed codes, their scales): ms per pass, its nominal DRAM bytes per second, and the
//      board's average power over the loop (NVML's energy counter) and its SM clock; then the same
//      bytes as a plain stream (stream_half: no arithmetic), the bound of any quantizer;
//   2. the whole forward call (flamia_forward) the same way: at the 700 W cap on the long rows, the
//      pass's power headroom is what an overlap would spend;
//   3. the attention after the pass alone (flamia_forward's second half, capi::attend_codes: the V
//      fold reference, the work order and the forward kernel over the pass's codes), the same way;
//   4. the pass, the plain stream and the attention on N SMs only (--free-sms): a blocker kernel
//      holds every other SM (one CTA each with all of its shared memory, so nothing fits beside it,
//      until a flag in device memory lets go) while the launches, which fill whatever SMs are free,
//      are timed with events;
//   5. the pass (then the plain stream) and the attention at once, each on its own SMs (--split K:
//      green contexts of K SMs for the producer and the rest for the attention, which reads a
//      second copy of the codes): each side's ms per run while the other runs beside it, and the
//      power. This is the overlap's best case: no dependency between the two, no tail.
//
//   build/flamia_quantize_beside [--seconds 3] [--free-sms 16,32,48,66,100,116] [--split 16,32,48]
//                                [--tokens 65536] [--heads 16] [--docs 4]
//
// A probe's tool (sessions 42, 43): prints a markdown table; not installed, not part of the tests.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "capi/cuda_call.h"
#include "capi/validate.h"
#include "core/operand_layout.h"
#include "cuda_check.h"
#include "flamia/flamia.h"

namespace {

// CHECK for the driver API (green contexts).
#define CHECK_CU(call)                                               \
  do {                                                               \
    const CUresult r_ = (call);                                      \
    if (r_ != CUDA_SUCCESS) {                                        \
      const char* text_ = nullptr;                                   \
      cuGetErrorString(r_, &text_);                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, text_ ? text_ : "?"); \
      std::exit(1);                                                  \
    }                                                                \
  } while (0)

// NVML through dlopen (the driver's libnvidia-ml.so.1; no header needed): the board's energy
// counter (mJ) and the SM clock, as bench/gpu_monitor.py reads them. Absent: no power column.
class Nvml {
 public:
  explicit Nvml(int cuda_device) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib_ == nullptr) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<int (*)(const char*, void**)>(dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    energy_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(dlsym(lib_, "nvmlDeviceGetTotalEnergyConsumption"));
    clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
    char bus[32] = {};
    if (init == nullptr || by_bus == nullptr || energy_ == nullptr || clock_ == nullptr ||
        cudaDeviceGetPCIBusId(bus, sizeof(bus), cuda_device) != cudaSuccess || init() != 0 || by_bus(bus, &device_) != 0)
      device_ = nullptr;
  }
  bool available() const { return device_ != nullptr; }
  double energy_joules() const {
    unsigned long long mj = 0;
    return available() && energy_(device_, &mj) == 0 ? double(mj) / 1e3 : 0.0;
  }
  unsigned sm_mhz() const {
    unsigned mhz = 0;
    constexpr int kClockSm = 1;  // NVML_CLOCK_SM
    return available() && clock_(device_, kClockSm, &mhz) == 0 ? mhz : 0;
  }

 private:
  void* lib_ = nullptr;
  void* device_ = nullptr;
  int (*energy_)(void*, unsigned long long*) = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
};

struct Options {
  double seconds = 3.0;
  std::vector<int> free_sms = {16, 32, 48, 66, 100, 116};
  std::vector<int> split = {16, 32, 48};
  int tokens = 65536, heads = 16, docs = 4;
};

std::vector<int> int_list(const char* text) {  // "16,32,48"
  std::vector<int> out;
  for (const char* p = text; *p != '\0';) {
    out.push_back(std::atoi(p));
    const char* comma = std::strchr(p, ',');
    p = comma == nullptr ? p + std::strlen(p) : comma + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "-h" || a == "--help") {
      std::printf("usage: %s [--seconds S] [--free-sms 16,32,48,66,100,116] [--split 16,32,48] [--tokens T] [--heads H]"
                  " [--docs N]\n",
                  argv[0]);
      std::exit(0);
    }
    if (value == nullptr) {
      std::fprintf(stderr, "%s needs a value (try --help)\n", a.c_str());
      std::exit(2);
    }
    ++i;
    if (a == "--seconds") o.seconds = std::atof(value);
    else if (a == "--tokens") o.tokens = std::atoi(value);
    else if (a == "--heads") o.heads = std::atoi(value);
    else if (a == "--docs") o.docs = std::atoi(value);
    else if (a == "--free-sms") o.free_sms = int_list(value);
    else if (a == "--split") o.split = int_list(value);
    else {
      std::fprintf(stderr, "unknown argument %s (try --help)\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.seconds <= 0 || o.tokens < 1 || o.heads < 1 || o.docs < 1 || o.docs > o.tokens) {
    std::fprintf(stderr, "bad arguments (try --help)\n");
    std::exit(2);
  }
  return o;
}

// One CTA per SM that it holds: all of the SM's shared memory is its, so no other CTA fits beside
// it; it marks its arrival (mapped host memory, its own slot: one write) and waits until the host
// lets go through a flag in device memory (a copy engine writes it). Polling host memory instead,
// from every held SM, slowed the free SMs' kernels up to 2x (session 43, call 1).
__global__ void hold_sm(const volatile int* release, volatile int* arrived) {
  if (threadIdx.x == 0) {
    arrived[blockIdx.x] = 1;
    __threadfence_system();
    while (*release == 0) __nanosleep(20000);
  }
}

// The pass's DRAM traffic without its arithmetic: reads `in` and writes half as many bytes (as BF16
// in, E4M3 out), four 16-byte loads in flight per thread. What a quantizer beside the forward could
// at best move on the SMs it is given.
__global__ void __launch_bounds__(256) stream_half(const uint4* __restrict__ in, uint2* __restrict__ out, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] = in[i + u * stride];
#pragma unroll
    for (int u = 0; u < 4; ++u) out[i + u * stride] = make_uint2(x[u].x ^ x[u].y, x[u].z ^ x[u].w);
  }
  for (; i < n; i += stride) out[i] = make_uint2(in[i].x ^ in[i].y, in[i].z ^ in[i].w);
}

// Runs `step` (which enqueues one pass or call on `stream`) back to back for at least `seconds`:
// ms per step, average board power (W) and the SM clock at the end (MHz; 0 without NVML).
struct Loop {
  double ms, watts;
  unsigned mhz;
};
template <class Step>
Loop loop_for(double seconds, cudaStream_t stream, const Nvml& nvml, Step step) {
  for (int i = 0; i < 3; ++i) step();  // warm-up
  CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const double joules0 = nvml.energy_joules();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(cudaEventRecord(start, stream));
  long steps = 0;
  for (double elapsed = 0; elapsed < seconds;) {
    for (int i = 0; i < 50; ++i, ++steps) step();  // a batch, then one host sync (a gap of ~10 us)
    CHECK(cudaStreamSynchronize(stream));
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double watts = nvml.available() ? (nvml.energy_joules() - joules0) / wall : 0.0;
  const unsigned mhz = nvml.sm_mhz();
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return {double(ms) / double(steps), watts, mhz};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flamia;
  const Options opt = parse(argc, argv);
  constexpr int D = 128;
  const int T = opt.tokens, H = opt.heads;
  int device = 0, sms = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const Nvml nvml(device);

  // Inputs: Q, K, V [T, H, D] BF16 (uniform in [-2, 2)), equal documents.
  const size_t elements = size_t(T) * H * D;
  std::vector<__nv_bfloat16> host(elements);
  uint32_t state = 12345;
  for (auto& x : host) {
    state = state * 1664525u + 1013904223u;
    x = __float2bfloat16(float(state >> 8) / float(1 << 24) * 4.f - 2.f);
  }
  std::vector<int32_t> cu(size_t(opt.docs) + 1);
  for (int d = 0; d <= opt.docs; ++d) cu[size_t(d)] = int32_t(int64_t(T) * d / opt.docs);
  __nv_bfloat16 *q, *k, *v, *o;
  int32_t* cu_dev;
  float* lse;
  for (__nv_bfloat16** p : {&q, &k, &v, &o}) CHECK(cudaMalloc(p, elements * sizeof(__nv_bfloat16)));
  for (__nv_bfloat16* p : {q, k, v})
    CHECK(cudaMemcpy(p, host.data(), elements * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&cu_dev, cu.size() * sizeof(int32_t)));
  CHECK(cudaMemcpy(cu_dev, cu.data(), cu.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&lse, size_t(T) * H * sizeof(float)));

  auto tensor = [&](void* data) {
    return flamia_tensor{data, FLAMIA_DTYPE_BF16, T, H, D, int64_t(H) * D, D};
  };
  const flamia_tensor tq = tensor(q), tk = tensor(k), tv = tensor(v);
  flamia_tensor to = tensor(o);
  int max_len = 0;
  for (int d = 0; d < opt.docs; ++d) max_len = std::max(max_len, cu[size_t(d) + 1] - cu[size_t(d)]);
  const flamia_documents docs{cu_dev, nullptr, opt.docs, max_len};
  flamia_options options;
  flamia_default_options(&options);

  // The forward's workspace, as flamia_forward carves it; the pass writes its q, k, v regions.
  size_t ws_bytes = 0;
  flamia_error error{};
  if (flamia_forward_workspace_size(&tq, &tk, &tv, &docs, &options, &ws_bytes, &error) != FLAMIA_SUCCESS) {
    std::fprintf(stderr, "flamia_forward_workspace_size: %s\n", error.message);
    return 1;
  }
  uint8_t* workspace;
  CHECK(cudaMalloc(&workspace, ws_bytes));
  const NumericsOptions numerics = capi::numerics_options(options);
  const capi::ForwardWorkspace ws = capi::forward_workspace_layout(T, H, H, D, opt.docs, numerics.interior_codes());
  const capi::QkvCodePointers codes = capi::qkv_code_pointers(workspace, ws);

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto quantize_into = [&](const capi::QkvCodePointers& dst, cudaStream_t s) {
    const capi::CallError e = capi::quantize_qkv(tq, tk, tv, docs, numerics, dst, s);
    if (!e.ok()) {
      std::fprintf(stderr, "quantize_qkv: %s\n", e.message.c_str());
      std::exit(1);
    }
  };
  auto pass = [&] { quantize_into(codes, stream); };
  auto call = [&] {
    if (flamia_forward(&tq, &tk, &tv, &docs, &options, &to, lse, workspace, ws_bytes, stream, &error) != FLAMIA_SUCCESS) {
      std::fprintf(stderr, "flamia_forward: %s\n", error.message);
      std::exit(1);
    }
  };
  // The pass's DRAM bytes as written down: Q, K, V read as BF16; Q's and K's codes, V's transposed
  // codes (its slots) and the three scale arrays written.
  const double pass_bytes = 3.0 * double(elements) * 2 + 2.0 * double(elements) +
                            double(H) * D * double(layout::transposed_tokens(T, opt.docs)) + 3.0 * T * H;

  // The same bytes as a plain stream (stream_half): 3 T H D BF16 read, half as many bytes written.
  const size_t copy_vectors = 3 * elements * sizeof(__nv_bfloat16) / sizeof(uint4);
  uint4* copy_in;
  uint2* copy_out;
  CHECK(cudaMalloc(&copy_in, copy_vectors * sizeof(uint4)));
  CHECK(cudaMalloc(&copy_out, copy_vectors * sizeof(uint2)));
  CHECK(cudaMemset(copy_in, 0x3c, copy_vectors * sizeof(uint4)));
  const double copy_bytes = double(copy_vectors) * (sizeof(uint4) + sizeof(uint2));
  auto copy_on = [&](cudaStream_t s, int sm_count) {  // 4 CTAs of 256 threads per SM
    stream_half<<<4 * sm_count, 256, 0, s>>>(copy_in, copy_out, copy_vectors);
    CHECK(cudaGetLastError());
  };
  auto copy = [&] { copy_on(stream, sms); };

  std::printf("T = %d, H = %d (Q, K, V), D = %d, %d documents; %d SMs; each loop >= %.1f s%s\n\n", T, H, D, opt.docs,
              sms, opt.seconds, nvml.available() ? "" : " (no NVML: no power)");
  std::printf("| case | SMs | ms | GB/s (nominal) | W | SM MHz |\n|---|---|---|---|---|---|\n");
  const Loop alone = loop_for(opt.seconds, stream, nvml, pass);
  std::printf("| quantization pass alone | %d | %.4f | %.0f | %.0f | %u |\n", sms, alone.ms, pass_bytes / alone.ms / 1e6,
              alone.watts, alone.mhz);
  const Loop plain = loop_for(opt.seconds, stream, nvml, copy);
  std::printf("| its bytes as a plain stream (no arithmetic) | %d | %.4f | %.0f | %.0f | %u |\n", sms, plain.ms,
              copy_bytes / plain.ms / 1e6, plain.watts, plain.mhz);
  const Loop whole = loop_for(opt.seconds, stream, nvml, call);
  std::printf("| forward call (flamia_forward) | %d | %.4f | | %.0f | %u |\n", sms, whole.ms, whole.watts, whole.mhz);
  // 3: the forward's second half over the pass's codes (left in the workspace by the loops above).
  const int64_t shift = capi::interior_scales_shift(ws);
  auto attend_into = [&](uint8_t* base, const capi::QkvCodePointers& qkv, flamia_tensor* out, float* lse_out,
                         cudaStream_t s) {
    const capi::CallError e = capi::attend_codes(tq, tk, docs, options, numerics, qkv, shift, base, ws, out, lse_out, nullptr, s);
    if (!e.ok()) {
      std::fprintf(stderr, "attend_codes: %s\n", e.message.c_str());
      std::exit(1);
    }
  };
  auto attend = [&] { attend_into(workspace, codes, &to, lse, stream); };
  const Loop attention = loop_for(opt.seconds, stream, nvml, attend);
  std::printf("| attention after the pass (fold reference, work order, forward kernel) | %d | %.4f | | %.0f | %u |\n",
              sms, attention.ms, attention.watts, attention.mhz);
  std::fflush(stdout);

  // 4: the pass, the plain stream and the attention on the SMs the blockers leave free. CTAs that find
  // no room wait for the free SMs' CTAs to exit (the forward's persistent CTAs then find no item).
  int smem_optin = 0;
  CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  CHECK(cudaFuncSetAttribute(hold_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  int *arrived, *arrived_dev, *release_dev, *release_host;
  CHECK(cudaHostAlloc(&arrived, size_t(sms) * sizeof(int), cudaHostAllocMapped));
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&arrived_dev), arrived, 0));
  CHECK(cudaMalloc(&release_dev, sizeof(int)));
  CHECK(cudaHostAlloc(&release_host, sizeof(int), cudaHostAllocDefault));
  *release_host = 1;
  cudaStream_t hold_stream, release_stream;
  CHECK(cudaStreamCreateWithFlags(&hold_stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&release_stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  volatile int* const arrivals = arrived;
  for (const int free_sms : opt.free_sms) {
    if (free_sms < 1 || free_sms >= sms) continue;
    const int held = sms - free_sms;
    CHECK(cudaMemset(release_dev, 0, sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < held; ++i) arrivals[i] = 0;
    hold_sm<<<held, 32, size_t(smem_optin), hold_stream>>>(release_dev, arrived_dev);
    CHECK(cudaGetLastError());
    const auto t0 = std::chrono::steady_clock::now();
    for (int resident = 0; resident < held;) {
      resident = 0;
      for (int i = 0; i < held; ++i) resident += arrivals[i];
      if (resident < held && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
        std::fprintf(stderr, "only %d of %d blockers became resident\n", resident, held);
        return 1;
      }
    }
    constexpr int kRuns = 10;
    auto time_runs = [&](auto run) {
      run();  // warm-up on the free SMs
      CHECK(cudaEventRecord(start, stream));
      for (int i = 0; i < kRuns; ++i) run();
      CHECK(cudaEventRecord(stop, stream));
      CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      return double(ms) / kRuns;
    };
    const double pass_ms = time_runs(pass), attend_ms = time_runs(attend);
    const double copy_ms = time_runs([&] { copy_on(stream, free_sms); });
    CHECK(cudaMemcpyAsync(release_dev, release_host, sizeof(int), cudaMemcpyHostToDevice, release_stream));
    CHECK(cudaStreamSynchronize(hold_stream));
    std::printf("| quantization pass, other SMs held | %d | %.4f | %.0f | | |\n", free_sms, pass_ms,
                pass_bytes / pass_ms / 1e6);
    std::printf("| plain stream, other SMs held | %d | %.4f | %.0f | | |\n", free_sms, copy_ms, copy_bytes / copy_ms / 1e6);
    std::printf("| attention, other SMs held | %d | %.4f | | | |\n", free_sms, attend_ms);
    std::fflush(stdout);
  }

  // 5: both at once in green contexts: the producer (the pass, into the first workspace's codes, or
  // the plain stream) on K SMs, the attention on the rest (over a second workspace's codes, into its
  // own O and LSE). Each side first runs alone on its SMs, then both run back to back, each side
  // `runs` times, sized so that both last about as long, enqueued in proportion from one thread.
  if (opt.split.empty()) return 0;
  uint8_t* workspace2;
  __nv_bfloat16* o2;
  float* lse2;
  CHECK(cudaMalloc(&workspace2, ws_bytes));
  CHECK(cudaMalloc(&o2, elements * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&lse2, size_t(T) * H * sizeof(float)));
  flamia_tensor to2 = tensor(o2);
  const capi::QkvCodePointers codes2 = capi::qkv_code_pointers(workspace2, ws);
  quantize_into(codes2, stream);
  CHECK(cudaDeviceSynchronize());
  CHECK_CU(cuInit(0));
  CUdevice cu_device;
  CHECK_CU(cuDeviceGet(&cu_device, device));
  CUcontext primary;
  CHECK_CU(cuCtxGetCurrent(&primary));
  CUdevResource all_sms;
  CHECK_CU(cuDeviceGetDevResource(cu_device, &all_sms, CU_DEV_RESOURCE_TYPE_SM));
  std::printf("\nBoth at once (green contexts; SM partitions: minimum %u, alignment %u). ms per run while the other"
              " side runs (alone on the same SMs):\n\n",
              all_sms.sm.minSmPartitionSize, all_sms.sm.smCoscheduledAlignment);
  std::printf("| producer | its SMs | attention SMs | producer ms (alone) | attention ms (alone) | overlap (%%) | W | SM MHz |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (const int k : opt.split) {
    CUdevResource group, rest;
    unsigned groups = 1;
    if (cuDevSmResourceSplitByCount(&group, &groups, &all_sms, &rest, 0, unsigned(k)) != CUDA_SUCCESS || groups < 1) {
      std::printf("| %d SMs: split refused | | | | | | | |\n", k);
      continue;
    }
    CUgreenCtx green[2];
    CUcontext ctx[2];
    CUstream side[2];
    for (int g = 0; g < 2; ++g) {
      CUdevResourceDesc desc;
      CHECK_CU(cuDevResourceGenerateDesc(&desc, g == 0 ? &group : &rest, 1));
      CHECK_CU(cuGreenCtxCreate(&green[g], desc, cu_device, CU_GREEN_CTX_DEFAULT_STREAM));
      CHECK_CU(cuCtxFromGreenCtx(&ctx[g], green[g]));
      CHECK_CU(cuGreenCtxStreamCreate(&side[g], green[g], CU_STREAM_NON_BLOCKING, 0));
    }
    const cudaStream_t producer_stream = reinterpret_cast<cudaStream_t>(side[0]);
    const cudaStream_t attend_stream = reinterpret_cast<cudaStream_t>(side[1]);
    const int producer_sms = int(group.sm.smCount), attend_sms = int(rest.sm.smCount);
    auto attend_side = [&] { attend_into(workspace2, codes2, &to2, lse2, attend_stream); };
    auto host_time = [&](int g, const std::function<void()>& run, int runs) {
      CHECK_CU(cuCtxSetCurrent(ctx[g]));
      run();
      CHECK_CU(cuStreamSynchronize(side[g]));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < runs; ++i) run();
      CHECK_CU(cuStreamSynchronize(side[g]));
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / runs;
    };
    const double attend_alone = host_time(1, attend_side, 10);
    for (const bool plain_stream : {false, true}) {
      const std::function<void()> producer = [&] {
        if (plain_stream) {
          copy_on(producer_stream, producer_sms);
        } else {
          quantize_into(codes, producer_stream);
        }
      };
      const double producer_alone = host_time(0, producer, 10);
      const int producer_runs = std::max(10, int(opt.seconds * 1e3 / 2 / producer_alone));
      const int attend_runs = std::max(10, int(producer_runs * producer_alone / attend_alone));
      const double joules0 = nvml.energy_joules();
      const auto t0 = std::chrono::steady_clock::now();
      for (int a = 0, b = 0; a < producer_runs || b < attend_runs;) {
        if (a < producer_runs && (b >= attend_runs || double(a) / producer_runs <= double(b) / attend_runs)) {
          CHECK_CU(cuCtxSetCurrent(ctx[0]));
          producer();
          ++a;
        } else {
          CHECK_CU(cuCtxSetCurrent(ctx[1]));
          attend_side();
          ++b;
        }
      }
      double done_ms[2] = {0, 0};
      for (int finished = 0; finished < 2;) {
        for (int g = 0; g < 2; ++g) {
          if (done_ms[g] > 0) continue;
          const CUresult r = cuStreamQuery(side[g]);
          if (r == CUDA_ERROR_NOT_READY) continue;
          CHECK_CU(r);
          done_ms[g] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          ++finished;
        }
      }
      const double wall_s = std::max(done_ms[0], done_ms[1]) / 1e3;
      const double watts = nvml.available() ? (nvml.energy_joules() - joules0) / wall_s : 0.0;
      const unsigned mhz = nvml.sm_mhz();
      const double overlap = 100.0 * std::min(done_ms[0], done_ms[1]) / std::max(done_ms[0], done_ms[1]);
      std::printf("| %s | %d | %d | %.4f (%.4f) | %.4f (%.4f) | %.0f | %.0f | %u |\n",
                  plain_stream ? "plain stream" : "quantization pass", producer_sms, attend_sms,
                  done_ms[0] / producer_runs, producer_alone, done_ms[1] / attend_runs, attend_alone, overlap, watts,
                  mhz);
      std::fflush(stdout);
    }
    CHECK_CU(cuCtxSetCurrent(primary));
    for (int g = 0; g < 2; ++g) {
      CHECK_CU(cuStreamDestroy(side[g]));
      CHECK_CU(cuGreenCtxDestroy(green[g]));
    }
  }
  return 0;
}
