// Physical layouts of E4M3 code tensors that the Hopper kernels read, shared by the quantizer that
// writes them, the kernels that read them, the C API that sizes them and the tests.
//
// 1. The key permutation. A wgmma m64nN accumulator holds, for lane (g, t) of a warp, columns
//    8nb + 2t + {0,1}; the register A operand of the next product (m64k32, contracting over those
//    columns) wants positions 4t..4t+3 and 16+4t..16+4t+3 of each 32-column step. The contraction
//    is a sum, so instead of shuffling registers the columns of each step are permuted: A position
//    kappa = 16h + 4t' + e holds column 16h + 8(e/2) + 2t' + e%2, and the B operand is laid out with
//    the same permutation. It maps each 16-column half of a step onto itself.
// 2. The transposed, padded layout [heads, dim, padded_tokens] of an operand that a product contracts
//    over tokens (V in O = P.V): row (h, f) holds feature f of every token, tokens contiguous. Each
//    document starts at a multiple of kKeyStep (so 16-byte copies of a tile are aligned) and its
//    tokens sit at permuted_position(position in the document); every other slot (the rest of a
//    document's last step, the idle slots between documents and after the last) is zero, so the
//    whole layout is defined: the kernels' TMA tile loads run past a document's end.
#pragma once

#include <cstdint>

#include "core/schedule.h"
#include "formats/host_device.h"

namespace flamia::layout {

// Columns per k-step of an FP8 wgmma (k32): the period of the key permutation.
inline constexpr int kKeyStep = 32;

// The column held at A position kappa (0..31) of a step.
FLAMIA_HD constexpr int permuted_key(int kappa) {
  const int half = kappa >> 4, w = kappa & 15, t = w >> 2, e = w & 3;
  return half * 16 + (e >> 1) * 8 + 2 * t + (e & 1);
}
// Inverse of permuted_key: the A position that holds column `key` (0..31) of a step.
FLAMIA_HD constexpr int kappa_of_key(int key) {
  const int half = key >> 4, r = key & 15, e = ((r >> 3) << 1) | (r & 1), t = (r & 7) >> 1;
  return half * 16 + 4 * t + e;
}
// The position of column `c` (any column counted from a step boundary) in the permuted layout.
FLAMIA_HD constexpr int permuted_position(int c) { return (c & ~(kKeyStep - 1)) + kappa_of_key(c & (kKeyStep - 1)); }

// Token slots per (head, feature) row of the transposed layout: every document padded to whole
// steps plus one step of slack per document (two documents may start inside the same step); the
// slot numbering of core/schedule.h with a unit of one step.
FLAMIA_HD constexpr int64_t transposed_tokens(int64_t total_tokens, int64_t num_docs) {
  return kKeyStep * slots::slot_count(total_tokens, num_docs, kKeyStep);
}
// The first slot of document `doc`, whose tokens begin at packed index doc_begin. Documents do not
// overlap: the next one starts at least kKeyStep * ceil(length / kKeyStep) slots later.
FLAMIA_HD constexpr int64_t transposed_document_start(int64_t doc_begin, int64_t doc) {
  return kKeyStep * slots::first_slot(doc_begin, doc, kKeyStep);
}

static_assert(permuted_key(kappa_of_key(13)) == 13 && permuted_key(kappa_of_key(22)) == 22, "inverse permutation");
static_assert(permuted_position(32 + 5) == 32 + kappa_of_key(5), "steps keep their place");

}  // namespace flamia::layout
