// Exact FP64 softmax attention over packed documents: the ground truth every route is measured against.
//
// Per document and query head h (reading kv head h / (Hq / Hkv)), for query i and the keys j of
// its own document that it sees (AttentionShape::keys_of: j <= i when causal, inside the window):
//   s_ij = c(scale * q_i . k_j)  (scale = shape.scale_for(D); c the softcap, softcap tanh(x / softcap),
//                                 or the identity)
//   lse_i = log sum_j exp(s_ij)   (natural log, computed against the row max)
//   O_i  = sum_j exp(s_ij - lse_i) v_j
// Backward of L = sum(O * dout), rebuilding P from the given lse:
//   P_ij = exp(s_ij - lse_i), D_i = dout_i . o_i, dP_ij = dout_i . v_j,
//   dS_ij = P_ij (dP_ij - D_i) c'(s_ij)  (c' = 1 - (s_ij / softcap)^2, or 1)
//   dq_i = scale * sum_j dS_ij k_j
//   dk_j = scale * sum_i dS_ij q_i   and   dv_j = sum_i P_ij dout_i   (summed over the query heads of a kv head)
//
// Work is split into tasks with fixed boundaries (blocks of query rows for O, lse and dq; blocks
// of keys for dk and dv, each summing its rows in row order), so results are bitwise independent
// of the thread count, and a query row's O, lse and dq depend only on its own document (and, when
// causal, only on positions <= its own).
#pragma once

#include "core/documents.h"
#include "reference/tensor.h"

namespace flamia::reference {

// q [T, Hq, D], k and v [T, Hkv, D] with Hq % Hkv == 0; docs must cover T tokens.
// Returns O [T, Hq, D] and the natural-log LSE [Hq, T]. Throws std::invalid_argument naming
// the bad argument on mismatched shapes.
ForwardOutputs reference_forward(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                                 const Documents& docs, const AttentionShape& shape);

// Exact gradients of L = sum(O * dout) given the forward's o [T, Hq, D] and lse [Hq, T].
// dout has the shape of q; dq, dk, dv have the shapes of q, k, v.
Gradients reference_backward(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                             const PackedTensor& o, const HeadTokenTensor& lse, const PackedTensor& dout,
                             const Documents& docs, const AttentionShape& shape);

// The same with documents of their own for the keys (flash_attn's cu_seqlens_q and cu_seqlens_k):
// document d's queries are q's rows q_docs[d], its keys k's and v's rows k_docs[d] (as many
// documents in both), the mask aligned bottom-right (AttentionShape::keys_of), as a query chunk
// of a longer document attending to the keys up to its end does. A row that sees no key has
// O = 0 and LSE = -inf. dk and dv have the shapes of k and v.
ForwardOutputs reference_forward(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                                 const Documents& q_docs, const Documents& k_docs, const AttentionShape& shape);
Gradients reference_backward(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                             const PackedTensor& o, const HeadTokenTensor& lse, const PackedTensor& dout,
                             const Documents& q_docs, const Documents& k_docs, const AttentionShape& shape);

}  // namespace flamia::reference
