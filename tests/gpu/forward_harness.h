// Host harness for the GPU tests: uploads packed inputs, calls the C API (forward, and forward +
// backward), downloads O, LSE and the gradients into the CPU reference's types so the emulation,
// the FP64 reference and the probe can be compared with the GPU side by side.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/inputs.h"
#include "analysis/probe.h"
#include "core/options.h"
#include "flamia/flamia.h"

namespace flamia::gpu_test {

#define FLAMIA_CUDA_CHECK(expr)                                                              \
  do {                                                                                       \
    const cudaError_t err_ = (expr);                                                         \
    if (err_ != cudaSuccess) throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(err_)); \
  } while (0)

inline bool have_sm90_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9;
}

#define FLAMIA_REQUIRE_GPU() \
  if (!::flamia::gpu_test::have_sm90_device()) GTEST_SKIP() << "no sm_90 CUDA device: GPU test skipped"

// A device allocation that frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { FLAMIA_CUDA_CHECK(cudaMalloc(&ptr_, bytes ? bytes : 1)); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_), std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A packed BF16 tensor on the device, row-major with the given token stride (>= heads * dim).
struct DeviceTensor {
  DeviceBuffer buffer;
  flamia_tensor desc{};
};

inline DeviceTensor upload_bf16(const reference::PackedTensor& x, int64_t token_stride = 0) {
  if (token_stride == 0) token_stride = int64_t(x.heads) * x.dim;
  std::vector<__nv_bfloat16> host(size_t(x.tokens) * token_stride, __float2bfloat16(NAN));
  for (int t = 0; t < x.tokens; ++t)
    for (int h = 0; h < x.heads; ++h)
      for (int f = 0; f < x.dim; ++f) host[t * token_stride + h * x.dim + f] = __float2bfloat16(float(x.at(t, h, f)));
  DeviceTensor d{DeviceBuffer(host.size() * sizeof(__nv_bfloat16)), {}};
  FLAMIA_CUDA_CHECK(cudaMemcpy(d.buffer.get(), host.data(), d.buffer.bytes(), cudaMemcpyHostToDevice));
  d.desc = {d.buffer.get(), FLAMIA_DTYPE_BF16, x.tokens, x.heads, x.dim, token_stride, x.dim};
  return d;
}

inline DeviceTensor empty_bf16(int tokens, int heads, int dim) {
  DeviceTensor d{DeviceBuffer(size_t(tokens) * heads * dim * sizeof(__nv_bfloat16)), {}};
  FLAMIA_CUDA_CHECK(cudaMemset(d.buffer.get(), 0xFF, d.buffer.bytes()));  // poison: NaN bf16
  d.desc = {d.buffer.get(), FLAMIA_DTYPE_BF16, tokens, heads, dim, int64_t(heads) * dim, dim};
  return d;
}

inline reference::PackedTensor download_bf16(const DeviceTensor& d) {
  const auto& t = d.desc;
  std::vector<__nv_bfloat16> host(size_t(t.tokens) * t.stride_token);
  FLAMIA_CUDA_CHECK(cudaMemcpy(host.data(), d.buffer.get(), host.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  reference::PackedTensor x(int(t.tokens), int(t.heads), int(t.dim));
  for (int i = 0; i < x.tokens; ++i)
    for (int h = 0; h < x.heads; ++h)
      for (int f = 0; f < x.dim; ++f) x.at(i, h, f) = double(__bfloat162float(host[i * t.stride_token + h * t.stride_head + f]));
  return x;
}

inline flamia_options to_c_options(const NumericsOptions& o, bool causal) {
  flamia_options c;
  flamia_default_options(&c);
  c.causal = causal;
  c.isolation = o.isolation == Isolation::kPrefix ? FLAMIA_ISOLATION_PREFIX : FLAMIA_ISOLATION_DOCUMENT;
  c.scale_geometry = o.scale_geometry == ScaleGeometry::kToken ? FLAMIA_SCALE_TOKEN : FLAMIA_SCALE_BLOCK32;
  c.scale_rule = o.scale_rule == ScaleRule::kFloor ? FLAMIA_SCALE_RULE_FLOOR : FLAMIA_SCALE_RULE_CEIL;
  c.p_boost_log2 = o.p_boost_log2;
  return c;
}

// How a training call hands q, k and v to its backward: the backward quantizes them again
// (flamia_forward + flamia_backward), or reads the codes the forward saved (flamia_forward_train +
// flamia_backward_saved).
enum class QkvHandOver { kRequantize, kSavedCodes };

// Everything one forward call needs on the device, kept alive together (also across graph capture).
struct ForwardCall {
  DeviceTensor q, k, v, o;
  DeviceBuffer lse, cu_seqlens, workspace;
  DeviceBuffer saved_codes;  // kSavedCodes only
  std::vector<int32_t> cu_host;
  flamia_documents docs{};
  flamia_options options{};
  QkvHandOver hand_over = QkvHandOver::kRequantize;

  ForwardCall(const analysis::AttentionInputs& in, const NumericsOptions& opt, bool causal,
              QkvHandOver hand_over_ = QkvHandOver::kRequantize)
      : hand_over(hand_over_) {
    q = upload_bf16(in.q), k = upload_bf16(in.k), v = upload_bf16(in.v);
    o = empty_bf16(in.q.tokens, in.q.heads, in.q.dim);
    lse = DeviceBuffer(size_t(in.q.heads) * in.q.tokens * sizeof(float));
    FLAMIA_CUDA_CHECK(cudaMemset(lse.get(), 0xFF, lse.bytes()));
    cu_host = in.docs.cu_seqlens();
    cu_seqlens = DeviceBuffer(cu_host.size() * sizeof(int32_t));
    FLAMIA_CUDA_CHECK(cudaMemcpy(cu_seqlens.get(), cu_host.data(), cu_seqlens.bytes(), cudaMemcpyHostToDevice));
    docs = {static_cast<const int32_t*>(cu_seqlens.get()), cu_host.data(), in.docs.count(), std::max(1, in.docs.max_length())};
    options = to_c_options(opt, causal);
    size_t bytes = 0;
    flamia_error err{};
    const bool saving = hand_over == QkvHandOver::kSavedCodes;
    if ((saving ? flamia_forward_train_workspace_size : flamia_forward_workspace_size)(
            &q.desc, &k.desc, &v.desc, &docs, &options, &bytes, &err) != FLAMIA_SUCCESS)
      throw std::runtime_error(err.message);
    workspace = DeviceBuffer(bytes);
    if (saving) {
      if (flamia_saved_codes_size(&q.desc, &k.desc, &v.desc, &docs, &options, &bytes, &err) != FLAMIA_SUCCESS)
        throw std::runtime_error(err.message);
      saved_codes = DeviceBuffer(bytes);
      FLAMIA_CUDA_CHECK(cudaMemset(saved_codes.get(), 0xFF, bytes));  // poison: every byte read must be written
    }
  }

  flamia_status launch(cudaStream_t stream, flamia_error* err) {
    if (hand_over == QkvHandOver::kSavedCodes)
      return flamia_forward_train(&q.desc, &k.desc, &v.desc, &docs, &options, &o.desc, static_cast<float*>(lse.get()),
                                  saved_codes.get(), saved_codes.bytes(), workspace.get(), workspace.bytes(), stream, err);
    return flamia_forward(&q.desc, &k.desc, &v.desc, &docs, &options, &o.desc, static_cast<float*>(lse.get()),
                          workspace.get(), workspace.bytes(), stream, err);
  }

  analysis::ProbeOutputs run() {
    flamia_error err{};
    const flamia_status st = launch(nullptr, &err);
    if (st != FLAMIA_SUCCESS) throw std::runtime_error(std::string("flamia_forward: ") + err.message);
    FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
    analysis::ProbeOutputs out{download_bf16(o), reference::HeadTokenTensor(int(q.desc.heads), int(q.desc.tokens)), {}};
    std::vector<float> l(out.lse.data.size());
    FLAMIA_CUDA_CHECK(cudaMemcpy(l.data(), lse.get(), l.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < l.size(); ++i) out.lse.data[i] = l[i];
    return out;
  }
};

// A whole training call: the forward above, then flamia_backward for the inputs' dout.
struct TrainingCall : ForwardCall {
  DeviceTensor dout, dq, dk, dv;
  DeviceBuffer backward_workspace;

  TrainingCall(const analysis::AttentionInputs& in, const NumericsOptions& opt, bool causal,
               QkvHandOver hand_over_ = QkvHandOver::kRequantize)
      : ForwardCall(in, opt, causal, hand_over_) {
    dout = upload_bf16(in.dout);
    dq = empty_bf16(in.q.tokens, in.q.heads, in.q.dim);
    dk = empty_bf16(in.k.tokens, in.k.heads, in.k.dim);
    dv = empty_bf16(in.v.tokens, in.v.heads, in.v.dim);
    size_t bytes = 0;
    flamia_error err{};
    if ((hand_over == QkvHandOver::kSavedCodes ? flamia_backward_saved_workspace_size : flamia_backward_workspace_size)(
            &q.desc, &k.desc, &v.desc, &docs, &options, &bytes, &err) != FLAMIA_SUCCESS)
      throw std::runtime_error(err.message);
    backward_workspace = DeviceBuffer(bytes);
  }

  flamia_status launch_backward(cudaStream_t stream, flamia_error* err) {
    if (hand_over == QkvHandOver::kSavedCodes) {
      // Shapes only: flamia_backward_saved must not read q, k or v.
      flamia_tensor qs = q.desc, ks = k.desc, vs = v.desc;
      qs.data = ks.data = vs.data = nullptr;
      return flamia_backward_saved(&qs, &ks, &vs, &o.desc, static_cast<const float*>(lse.get()), &dout.desc, &docs,
                                   &options, saved_codes.get(), saved_codes.bytes(), &dq.desc, &dk.desc, &dv.desc,
                                   backward_workspace.get(), backward_workspace.bytes(), stream, err);
    }
    return flamia_backward(&q.desc, &k.desc, &v.desc, &o.desc, static_cast<const float*>(lse.get()), &dout.desc, &docs,
                           &options, &dq.desc, &dk.desc, &dv.desc, backward_workspace.get(),
                           backward_workspace.bytes(), stream, err);
  }

  // Forward then backward on one stream (what a CUDA graph captures).
  flamia_status launch_training(cudaStream_t stream, flamia_error* err) {
    const flamia_status st = launch(stream, err);
    return st != FLAMIA_SUCCESS ? st : launch_backward(stream, err);
  }

  struct Result {
    analysis::ProbeOutputs forward;  // o, lse and dq
    reference::PackedTensor dk, dv;
  };

  Result run_training() {
    analysis::ProbeOutputs fwd = run();
    flamia_error err{};
    if (launch_backward(nullptr, &err) != FLAMIA_SUCCESS) throw std::runtime_error(std::string("flamia_backward: ") + err.message);
    FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
    fwd.dq = download_bf16(dq);
    return {std::move(fwd), download_bf16(dk), download_bf16(dv)};
  }
};

}  // namespace flamia::gpu_test
