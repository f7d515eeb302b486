// The emulated MXFP8 attention route (docs/DESIGN.md §2): the spec of record for the Hopper kernels;
// and the mixed NVFP4/FP8 route (Route::kNvfp4Mixed, docs/NUMERICS.md), which differs only in S.
//
// Quantization is bit-exact (the same codes and scales the GPU must produce); products are
// accumulated in double. The tile structure that decides rounding (which running max P is
// rounded against, which keys share a U scale) follows core/tiling.h, so GPU kernels that use
// the same tiles differ from this only by accumulation order and FP32/FP8 accumulators.
//
// Forward, per query i and visible key j of its document (s in log2 units):
//   s_ij  = (cq_i . ck_j) 2^(eq_i + ek_j) * scale * log2(e)        Q/K scales factored out
//   p_ij  = 2^(s_ij - m_i)   with m_i the running max after each key tile (diagonal tile first)
//   O_i   = sum_j E4M3(p_ij 2^(boost + ev_j - rho_i)) cv_j * 2^(rho_i - boost) / l_i
//   rho_i = max of ev_j over the keys visible to i (a mask-aware fold reference: it never
//           looks at keys after i, so it is prefix-safe in every mode; with interior codes, of the
//           per-token ev_j, which bounds every interior group's block32 exponent too)
// With interior codes (prefix isolation, block32) ck_j, ek_j, cv_j and ev_j are the block32 codes
// on interior pairs (tiling::interior_pair) and the per-token codes on the others, in every line
// above and below.
// Backward, rebuilding P from the saved LSE with the forward's codes:
//   D_i = sum_f G^_if O_if (reconstructed dO, saved BF16 O);  E_ij = (cg_i . cv_j) 2^(eg_i + ev_j)
//   U_ij = P_ij (E_ij - D_i);  dS = scale * U
//   dV_j = sum_i E4M3(P_ij 2^(boost + eg_i - gamma)) cg_i 2^(gamma - boost), gamma = max eg in the
//          document over the query heads of j's KV group
//   dQ_i = scale * sum_tiles 2^sigma sum_j E4M3(U_ij 2^ek_j / 2^sigma) ck_j,  sigma per (row, key tile)
//          with NumericsOptions::uses_fp16_partials instead (core/dq_partials.h: sigma_i, beta_i per row)
//   dQ_i = scale 2^-beta_i acc_i,  acc_i = FP16 sum over key tiles ascending of
//          FP16(2^beta_i 2^sigma_i sum_{j in tile} E4M3(U_ij 2^ek_j / 2^sigma_i) ck_j)
//          (the partial exact, each FP16 addition rounded; p_max_i = fwd.row_max_prob)
//   dK_j = scale * sum_tiles 2^tau   sum_i E4M3(U_ij 2^eq_i / 2^tau) cq_i,    tau per (column, query tile)
// (or, with UScaleGeometry::kSquare32, one 32x32 U square scale shared by both products.)
// Mixed NVFP4/FP8 route: S alone changes. Q and K are also encoded in NVFP4 (q_score, k_score: E2M1
// codes, E4M3 scale b per 16 features, FP32 scale s2 per token and head), and in every line above
//   s_ij = s2q_i s2k_j * sum_blocks (bq_ib bk_jb) (cq_i . ck_j)_block * scale * log2(e)
// while cq, eq, ck, ek (E4M3) remain the operands of dQ and dK. dQ is reduced deterministically.
#pragma once

#include <cstdint>

#include "core/documents.h"
#include "core/options.h"
#include "reference/quantize.h"
#include "reference/tensor.h"

namespace flamia::reference {

// Diagnostics of one emulated call (docs/DESIGN.md §4).
struct RouteStats {
  int64_t saturated_q = 0, saturated_k = 0, saturated_v = 0, saturated_g = 0;  // loaded operands
  int64_t saturated_p = 0, saturated_u = 0;                                    // fresh operands
  int64_t u_nonzero = 0, u_zeroed = 0;  // U entries in the dQ product: nonzero, and of those rounded to 0
  int64_t rows = 0;                     // query rows that contributed a row residual
  double row_residual_max = 0.0;        // max_i |sum_j dS_ij| before U is rounded
  double row_residual_sum_sq = 0.0;
  // dQ by FP16 partials (NumericsOptions::uses_fp16_partials), finite rows only: the largest
  // |U_ij 2^ek_j| / 2^sigma_i (the bounds of core/dq_partials.h keep it <= 448, up to the float
  // rounding of their inputs) and the largest magnitude a boosted partial or the FP16 accumulator
  // held (< 2^15 by the same bounds). 0 when the call takes the deterministic reduction.
  double dq_u_ratio_max = 0.0, dq_acc_max = 0.0;

  double u_zero_fraction() const { return u_nonzero ? double(u_zeroed) / double(u_nonzero) : 0.0; }
  double row_residual_rms() const;
  void merge(const RouteStats& other);
};

// Q, K and V after the optional Hadamard rotation, encoded once; the forward and the backward
// both read these codes. The mixed route encodes Q and K a second time, in NVFP4, for S. With NumericsOptions::interior_codes() (prefix isolation, block32), K and
// V are also encoded block32 (k_interior, v_interior): interior pairs (tiling::interior_pair) read
// those, every other pair k and v's per-token codes. Empty otherwise.
struct QuantizedInputs {
  Mxfp8Tensor q, k, v;
  Mxfp8Tensor k_interior, v_interior;
  Nvfp4Tensor q_score, k_score;  // Route::kNvfp4Mixed: the score operands (from the same rotated Q, K)
  Route route = Route::kMxfp8;
  bool hadamard = false;
  bool has_interior_codes() const { return k_interior.tokens > 0; }
};

QuantizedInputs quantize_inputs(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                                const Documents& docs, const NumericsOptions& options);
// Documents with their own key lengths (flash_attn's cu_seqlens_q and cu_seqlens_k, as many of each):
// Q's (and dO's) scale groups count from the query documents' starts, K's and V's from the key
// documents', and the mask is aligned bottom-right (AttentionShape::keys_of), so a query chunk that
// starts on a 128-token tile and attends its document's key prefix gets bitwise the whole call's O,
// LSE and dQ rows. A row that sees no key gets O = 0 and LSE = -inf. Prefix isolation needs the
// same documents for both (its interior pairs are positions shared by queries and keys).
QuantizedInputs quantize_inputs(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                                const Documents& q_docs, const Documents& k_docs, const NumericsOptions& options);

// O (rounded to BF16) and the natural-log LSE (rounded to FP32), as the GPU returns them.
ForwardOutputs mxfp8_forward(const QuantizedInputs& in, const Documents& docs, const AttentionShape& shape,
                             const NumericsOptions& options, RouteStats* stats = nullptr);
ForwardOutputs mxfp8_forward(const QuantizedInputs& in, const Documents& q_docs, const Documents& k_docs,
                             const AttentionShape& shape, const NumericsOptions& options, RouteStats* stats = nullptr);

// dQ, dK, dV (rounded to BF16, rotated back when Q and K were rotated) for incoming dout.
Gradients mxfp8_backward(const QuantizedInputs& in, const ForwardOutputs& fwd, const PackedTensor& dout,
                         const Documents& docs, const AttentionShape& shape, const NumericsOptions& options,
                         RouteStats* stats = nullptr);
Gradients mxfp8_backward(const QuantizedInputs& in, const ForwardOutputs& fwd, const PackedTensor& dout,
                         const Documents& q_docs, const Documents& k_docs, const AttentionShape& shape,
                         const NumericsOptions& options, RouteStats* stats = nullptr);

// One training call for a fixed dO: Q, K and V quantized, the forward, then the backward for dout.
struct TrainingOutputs {
  ForwardOutputs fwd;
  Gradients grads;
  RouteStats stats;  // both passes'
};
TrainingOutputs mxfp8_training(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                               const PackedTensor& dout, const Documents& docs, const AttentionShape& shape,
                               const NumericsOptions& options);
TrainingOutputs mxfp8_training(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                               const PackedTensor& dout, const Documents& q_docs, const Documents& k_docs,
                               const AttentionShape& shape, const NumericsOptions& options);

}  // namespace flamia::reference
