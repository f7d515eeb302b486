// Numbering the tiles of packed documents without knowing the document lengths on the host.
//
// Document d (tokens [begin_d, begin_d + len_d) of the packed buffer) is cut into tiles of `unit`
// tokens counted from its start. Its tiles take the slots [S_d, S_d + ceil(len_d / unit)) with
//   S_d = ceil(begin_d / unit) + d,
// a number every kernel can compute from cu_seqlens alone. Slots never overlap: S_{d+1} - S_d =
// ceil((begin_d + len_d) / unit) - ceil(begin_d / unit) + 1 >= ceil(len_d / unit), and the
// ceil(total_tokens / unit) + num_docs slots cover every document. A slot between two documents'
// ranges holds no tile (at most two per document), so a grid of slots wastes almost nothing where
// a grid of (max tiles per document) x (documents) would be mostly idle on skewed lengths.
// The same numbering, in tokens, places documents in the transposed code layout
// (core/operand_layout.h).
#pragma once

#include <cstdint>

#include "formats/host_device.h"

namespace flamia::slots {

FLAMIA_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// S_d: the first slot of document `doc`, which begins at packed token doc_begin (>= 0).
FLAMIA_HD constexpr int64_t first_slot(int64_t doc_begin, int64_t doc, int64_t unit) {
  return ceil_div(doc_begin, unit) + doc;
}
// Slots that cover every document of a packed buffer of total_tokens tokens.
FLAMIA_HD constexpr int64_t slot_count(int64_t total_tokens, int64_t num_docs, int64_t unit) {
  return ceil_div(total_tokens, unit) + num_docs;
}

}  // namespace flamia::slots
