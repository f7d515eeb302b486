#include "core/documents.h"

#include <algorithm>
#include <stdexcept>

namespace flamia {

std::string validate_cu_seqlens(std::span<const int32_t> cu, int64_t total_tokens) {
  if (cu.size() < 2) return "cu_seqlens must hold at least 2 entries (one document), got " + std::to_string(cu.size());
  if (cu[0] != 0) return "cu_seqlens[0] must be 0, got " + std::to_string(cu[0]);
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) {
      return "cu_seqlens must be non-decreasing, but cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(cu[i]) +
             " < cu_seqlens[" + std::to_string(i - 1) + "] = " + std::to_string(cu[i - 1]);
    }
  }
  if (cu.back() != total_tokens) {
    return "cu_seqlens[-1] must equal the number of packed tokens " + std::to_string(total_tokens) + ", got " +
           std::to_string(cu.back());
  }
  return {};
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
  if (total > kMaxTokens) {
    throw std::invalid_argument("too many tokens: the " + std::to_string(lengths.size()) + " documents hold " +
                                std::to_string(total) + " tokens, more than " + std::to_string(kMaxTokens) +
                                " (INT32_MAX, the most that int32 cu_seqlens can index)");
  }
  return total;
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
