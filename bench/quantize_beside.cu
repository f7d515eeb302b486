// Could the forward's quantization pass run beside its attention kernel instead of before it
// (docs/LEVERS.md, "Not yet tried": the quantizer on a few SMs, the forward on the rest)? What
// decides it, measured on the GPU over one workload (T tokens, H heads for Q, K and V, D = 128,
// --docs equal documents, random BF16), each case a loop of at least --seconds:
//   1. the pass alone, on every SM: the launches of flamia_forward's quantize_qkv (Q and K codes,
//      V's transposed codes, their scales): ms per pass, its nominal DRAM bytes per second, and the
//      board's average power over the loop (NVML's energy counter) and its SM clock;
//   2. the whole forward call (flamia_forward) the same way: at the 700 W cap on the long rows, the
//      pass's power headroom is what an overlap would spend;
//   3. the pass on N SMs only (--free-sms): a blocker kernel holds every other SM (one CTA each with
//      all of its shared memory, so nothing fits beside it, waiting on a host flag) while the pass's
//      launches, which fill whatever SMs are free, are timed with events.
//
//   build/flamia_quantize_beside [--seconds 3] [--free-sms 16,32,48,66] [--tokens 65536] [--heads 16]
//                                [--docs 4]
//
// A probe's tool (session 42): prints a markdown table; not installed, not part of the tests.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "capi/cuda_call.h"
#include "capi/validate.h"
#include "core/operand_layout.h"
#include "cuda_check.h"
#include "flamia/flamia.h"

namespace {

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
  std::vector<int> free_sms = {16, 32, 48, 66};
  int tokens = 65536, heads = 16, docs = 4;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "-h" || a == "--help") {
      std::printf("usage: %s [--seconds S] [--free-sms 16,32,48,66] [--tokens T] [--heads H] [--docs N]\n", argv[0]);
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
    else if (a == "--free-sms") {
      o.free_sms.clear();
      for (const char* p = value; *p != '\0';) {
        o.free_sms.push_back(std::atoi(p));
        const char* comma = std::strchr(p, ',');
        p = comma == nullptr ? p + std::strlen(p) : comma + 1;
      }
    } else {
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
// it; it marks its arrival (host memory, its own slot: no atomics across the bus) and waits until
// the host lets go.
__global__ void hold_sm(const volatile int* release, volatile int* arrived) {
  if (threadIdx.x == 0) {
    arrived[blockIdx.x] = 1;
    __threadfence_system();
    while (*release == 0) __nanosleep(20000);
  }
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
  auto pass = [&] {
    const capi::CallError e = capi::quantize_qkv(tq, tk, tv, docs, numerics, codes, stream);
    if (!e.ok()) {
      std::fprintf(stderr, "quantize_qkv: %s\n", e.message.c_str());
      std::exit(1);
    }
  };
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

  std::printf("T = %d, H = %d (Q, K, V), D = %d, %d documents; %d SMs; each loop >= %.1f s%s\n\n", T, H, D, opt.docs,
              sms, opt.seconds, nvml.available() ? "" : " (no NVML: no power)");
  std::printf("| case | SMs | ms | GB/s (nominal) | W | SM MHz |\n|---|---|---|---|---|---|\n");
  const Loop alone = loop_for(opt.seconds, stream, nvml, pass);
  std::printf("| quantization pass alone | %d | %.4f | %.0f | %.0f | %u |\n", sms, alone.ms, pass_bytes / alone.ms / 1e6,
              alone.watts, alone.mhz);
  const Loop whole = loop_for(opt.seconds, stream, nvml, call);
  std::printf("| forward call (flamia_forward) | %d | %.4f | | %.0f | %u |\n", sms, whole.ms, whole.watts, whole.mhz);

  // 3: the pass on the SMs the blockers leave free.
  int smem_optin = 0;
  CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  CHECK(cudaFuncSetAttribute(hold_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  int *release, *arrived, *release_dev, *arrived_dev;
  CHECK(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped));
  CHECK(cudaHostAlloc(&arrived, size_t(sms) * sizeof(int), cudaHostAllocMapped));
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&release_dev), release, 0));
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&arrived_dev), arrived, 0));
  cudaStream_t hold_stream;
  CHECK(cudaStreamCreateWithFlags(&hold_stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (const int free_sms : opt.free_sms) {
    if (free_sms < 1 || free_sms >= sms) continue;
    const int held = sms - free_sms;
    volatile int* const arrivals = arrived;
    *reinterpret_cast<volatile int*>(release) = 0;
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
    constexpr int kPasses = 10;
    pass();  // warm-up on the free SMs
    CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < kPasses; ++i) pass();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    *reinterpret_cast<volatile int*>(release) = 1;
    CHECK(cudaStreamSynchronize(hold_stream));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("| quantization pass, other SMs held | %d | %.4f | %.0f | | |\n", free_sms, ms / kPasses,
                pass_bytes / (ms / kPasses) / 1e6);
  }
  return 0;
}
