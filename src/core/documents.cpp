#include "core/documents.h"

#include <algorithm>
#include <stdexcept>

namespace flamia {

OffsetsRecord check_cu_seqlens(std::span<const int32_t> cu, int64_t total_tokens) {
  const int64_t num_docs = int64_t(cu.size()) - 1;
  for (int64_t i = 0; i <= num_docs; ++i) {
    const int32_t previous = i > 0 ? cu[size_t(i - 1)] : 0;
    if (const OffsetsError e = offsets_entry_error(i, cu[size_t(i)], previous, num_docs, total_tokens);
        e != OffsetsError::kOk)
      return offsets_record(e, i, cu[size_t(i)], previous, total_tokens);
  }
  return {};
}

std::string describe_offsets_error(const OffsetsRecord& r, std::string_view name) {
  const std::string n(name), at = n + "[" + std::to_string(r.index) + "]", value = std::to_string(r.value);
  switch (OffsetsError(r.kind)) {
    case OffsetsError::kOk: return "";
    case OffsetsError::kFirstNotZero: return at + " must be 0, got " + value;
    case OffsetsError::kOutOfRange:
      return at + " = " + value +
             (r.value < 0 ? " is negative" : " lies past the end of the " + std::to_string(r.bound) + " packed tokens") +
             ": every entry must lie in [0, " + std::to_string(r.bound) + "]";
    case OffsetsError::kDecreasing:
      return n + " must be non-decreasing, but " + at + " = " + value + " < " + n + "[" + std::to_string(r.index - 1) +
             "] = " + std::to_string(r.bound);
    case OffsetsError::kLastNotTotal:
      return at + ", the last entry, must equal the number of packed tokens " + std::to_string(r.bound) + ", got " +
             value;
  }
  return n + ": unknown offsets error " + std::to_string(r.kind) + " at entry " + std::to_string(r.index) +
         " (value " + value + ", bound " + std::to_string(r.bound) + ")";
}

std::string validate_cu_seqlens(std::span<const int32_t> cu, int64_t total_tokens) {
  if (cu.size() < 2) return "cu_seqlens must hold at least 2 entries (one document), got " + std::to_string(cu.size());
  return describe_offsets_error(check_cu_seqlens(cu, total_tokens));
}

Documents::Documents(std::vector<int32_t> cu_seqlens, int64_t total_tokens) : cu_(std::move(cu_seqlens)) {
  if (auto err = validate_cu_seqlens(cu_, total_tokens); !err.empty()) throw std::invalid_argument(err);
  doc_of_token_.resize(size_t(total_tokens));
  for (int d = 0; d < count(); ++d) std::fill(doc_of_token_.begin() + begin(d), doc_of_token_.begin() + end(d), d);
}

int64_t total_tokens_of(std::span<const int> lengths) {
  int64_t total = 0;  // summed in 64 bits, so a sum past int32 is refused rather than wrapped
  for (int n : lengths) {
    if (n < 0) throw std::invalid_argument("document lengths must be >= 0, got " + std::to_string(n));
    total += n;
  }
  check_token_count(int64_t(lengths.size()), total);
  return total;
}

void check_token_count(int64_t documents, int64_t total) {
  if (total > kMaxTokens) {
    throw std::invalid_argument("too many tokens: the " + std::to_string(documents) + " documents hold " +
                                std::to_string(total) + " tokens, more than " + std::to_string(kMaxTokens) +
                                " (INT32_MAX, the most that int32 cu_seqlens can index)");
  }
}

Documents Documents::from_lengths(std::span<const int> lengths) {
  const int64_t total = total_tokens_of(lengths);
  std::vector<int32_t> cu{0};
  for (int n : lengths) cu.push_back(cu.back() + n);  // no overflow: the total fits
  return Documents(std::move(cu), total);
}

int Documents::max_length() const {
  int m = 0;
  for (int d = 0; d < count(); ++d) m = std::max(m, length(d));
  return m;
}

std::vector<RowBlock> row_blocks(const Documents& docs, int heads, int size) {
  std::vector<RowBlock> out;
  for (int doc = 0; doc < docs.count(); ++doc)
    for (int h = 0; h < heads; ++h)
      for (int p = 0; p < docs.length(doc); p += size) out.push_back({doc, h, p});
  return out;
}

}  // namespace flamia
