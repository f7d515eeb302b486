// Packed variable-length documents: cu_seqlens validation and document-local indexing.
// Shared by the CPU emulation, the work-item scheduler and the C API's validation, so every
// layer agrees on what a document is and where its groups and tiles start.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/offsets_check.h"
#include "core/options.h"
#include "core/tiling.h"
#include "formats/host_device.h"

namespace flamia {

// An empty string when cu_seqlens describes `total_tokens` packed tokens (at least 2 entries, and
// core/offsets_check.h's rule: starts at 0, every entry in [0, total_tokens], never decreases, ends
// at total_tokens); otherwise a message that names the first bad entry and its values
// (describe_offsets_error of check_cu_seqlens).
std::string validate_cu_seqlens(std::span<const int32_t> cu_seqlens, int64_t total_tokens);

// The first entry of cu_seqlens (num_docs + 1 >= 1 entries) that breaks core/offsets_check.h's
// rule, as the device check records it; kind kOk when none does.
OffsetsRecord check_cu_seqlens(std::span<const int32_t> cu_seqlens, int64_t total_tokens);

// What a record (kind != kOk) says, naming the array `name`, e.g. "cu_seqlens must be non-decreasing,
// but cu_seqlens[2] = 100 < cu_seqlens[1] = 200". Any record is described (an unknown kind too), so a
// record read back from the device can always be reported.
std::string describe_offsets_error(const OffsetsRecord& record, std::string_view name = "cu_seqlens");

// The most packed tokens a call can hold: cu_seqlens entries are int32.
inline constexpr int64_t kMaxTokens = 2147483647;
// The sum of `lengths` (in 64 bits). Throws std::invalid_argument for a negative length or a sum
// over kMaxTokens ("too many tokens").
int64_t total_tokens_of(std::span<const int> lengths);
// Throws total_tokens_of's "too many tokens" error when `documents` documents holding `total`
// tokens in all (counted in 64 bits by the caller) are more than kMaxTokens.
void check_token_count(int64_t documents, int64_t total);

class Documents {
 public:
  // Throws std::invalid_argument with validate_cu_seqlens' message on bad input.
  Documents(std::vector<int32_t> cu_seqlens, int64_t total_tokens);
  // Throws std::invalid_argument for a negative length or more than kMaxTokens tokens in all.
  static Documents from_lengths(std::span<const int> lengths);

  int count() const { return int(cu_.size()) - 1; }
  int total_tokens() const { return cu_.back(); }
  int begin(int doc) const { return cu_[doc]; }
  int end(int doc) const { return cu_[doc + 1]; }
  int length(int doc) const { return cu_[doc + 1] - cu_[doc]; }
  int max_length() const;
  int document_of(int token) const { return doc_of_token_[token]; }
  const std::vector<int32_t>& cu_seqlens() const { return cu_; }

 private:
  std::vector<int32_t> cu_;
  std::vector<int32_t> doc_of_token_;
};

// A block of query rows [begin, begin + size) of one document and head: the unit the CPU
// reference and emulation hand to a thread, so long documents spread over every core.
struct RowBlock {
  int doc, head, begin;
};
// Every (document, head, row block of `size` rows) of `docs`, in document, head, row order.
std::vector<RowBlock> row_blocks(const Documents& docs, int heads, int size);

// First document-local position of the scale group holding document-local position `pos`.
FLAMIA_HD int scale_group_begin(int pos, ScaleGeometry geometry) {
  return geometry == ScaleGeometry::kToken ? pos : pos - pos % tiling::kScaleBlock;
}
// One past the last position of that group, clipped to the document length.
FLAMIA_HD int scale_group_end(int pos, ScaleGeometry geometry, int doc_length) {
  const int end = geometry == ScaleGeometry::kToken ? pos + 1 : scale_group_begin(pos, geometry) + tiling::kScaleBlock;
  return end < doc_length ? end : doc_length;
}

}  // namespace flamia
