// Host tensors for the CPU reference and emulation: packed [T, H, D] rows of doubles.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "core/options.h"

namespace flamia::reference {

// A packed activation tensor [tokens, heads, dim], row-major (dim fastest), held in double.
// Inputs that model BF16 tensors hold values that are exactly representable in BF16.
struct PackedTensor {
  int tokens = 0, heads = 0, dim = 0;
  std::vector<double> data;

  PackedTensor() = default;
  PackedTensor(int t, int h, int d) : tokens(t), heads(h), dim(d), data(size_t(t) * h * d, 0.0) {}

  double* row(int t, int h) { return data.data() + (size_t(t) * heads + h) * dim; }
  const double* row(int t, int h) const { return data.data() + (size_t(t) * heads + h) * dim; }
  double& at(int t, int h, int f) { return row(t, h)[f]; }
  double at(int t, int h, int f) const { return row(t, h)[f]; }
  size_t size() const { return data.size(); }
};

// Per-(head, token) statistics such as the log-sum-exp, stored [heads, tokens] like the GPU output.
struct HeadTokenTensor {
  int heads = 0, tokens = 0;
  std::vector<double> data;

  HeadTokenTensor() = default;
  HeadTokenTensor(int h, int t) : heads(h), tokens(t), data(size_t(h) * t, 0.0) {}
  double& at(int h, int t) { return data[size_t(h) * tokens + t]; }
  double at(int h, int t) const { return data[size_t(h) * tokens + t]; }
};

// The mask and the softmax scale of one call (core/options.h).
using flamia::AttentionShape;

}  // namespace flamia::reference

namespace flamia::reference {

// What an attention forward returns: O [T, Hq, D] and the natural-log LSE [Hq, T], and for the
// backward's FP16 dQ partials each row's largest probability p_max = exp(m_i - LSE_i) = 1 / l_i
// [Hq, T] (FP32; 0 on tokens outside every document; empty where a forward does not save it).
struct ForwardOutputs {
  PackedTensor o;
  HeadTokenTensor lse;
  HeadTokenTensor row_max_prob;
};

// What an attention backward returns, in the layouts of q, k and v.
struct Gradients {
  PackedTensor dq, dk, dv;
};

}  // namespace flamia::reference
