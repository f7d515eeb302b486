// Hopper MXFP8 attention forward: launcher interface (host-callable, no CUDA headers needed).
#pragma once

#include <cstdint>

#include "cuda/sm90/kernel_problem.h"

namespace flamia::cuda::sm90 {

// What the forward kernel reads and writes. Codes and scales come from the quantization kernels
// (src/cuda/quant/): E4M3 codes [T, H, D] contiguous (V's in the transposed layout instead) and
// one UE8M0 scale per (token, head).
struct ForwardParams : KernelProblem {
  const uint8_t* q_codes;     // [T, Hq, D]
  const uint8_t* q_scales;    // [T, Hq]
  const uint8_t* k_codes;     // [T, Hkv, D]
  const uint8_t* k_scales;    // [T, Hkv]
  const uint8_t* v_codes_t;   // [Hkv, D, vt_pitch] (core/operand_layout.h)
  int64_t vt_pitch;           // layout::transposed_tokens(T, num_docs)
  const uint8_t* v_scales;    // [T, Hkv]
  const uint8_t* v_fold_ref;  // [T, Hkv]: running max of V's scale exponents within the document
  // Interior tiles' K and V codes (KernelProblem::interior_codes; else the same as k_codes and
  // v_codes_t) and scales, at k_scales + interior_scales_shift and v_scales + interior_scales_shift
  // (0 without interior codes; the C API's layouts place both at one shift).
  const uint8_t *k_interior_codes, *v_interior_codes_t;
  int64_t interior_scales_shift;
  void* o;                    // BF16 [T, Hq, D] with the strides below (elements)
  int64_t o_stride_token, o_stride_head;
  float* lse;  // [Hq, T], natural log
  // [Hq, T]: 1 / l_i = exp(m_i - LSE_i), the row's largest probability, which bounds U's row scale
  // in the FP16-partials backward (core/dq_partials.h); null: not written (inference calls).
  float* row_max_prob;
  int* work_counter;  // the persistent kernel's item counter (launch.cuh; zeroed by the launch)
};

// Returns the cudaError_t of the launch as an int (0 = success). head_dim must be 64 or 128.
int launch_forward(const ForwardParams& params, void* stream);

}  // namespace flamia::cuda::sm90
