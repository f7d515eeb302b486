// The physical layouts of core/operand_layout.h (the key permutation and the transposed, padded
// code layout that the quantizer writes and the kernels read) and the tile slots of
// core/schedule.h they and the kernels' grids are built on.
#include "core/operand_layout.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace flamia::layout {
namespace {

TEST(OperandLayout, KeyPermutationIsABijectionThatKeepsHalves) {
  std::vector<int> seen(kKeyStep, 0);
  for (int kappa = 0; kappa < kKeyStep; ++kappa) {
    const int key = permuted_key(kappa);
    ASSERT_GE(key, 0);
    ASSERT_LT(key, kKeyStep);
    ++seen[key];
    EXPECT_EQ(kappa_of_key(key), kappa);
    // A 16-byte chunk of the permuted layout holds the keys of one 16-key half.
    EXPECT_EQ(key / 16, kappa / 16) << kappa;
  }
  for (int key = 0; key < kKeyStep; ++key) EXPECT_EQ(seen[key], 1) << key;
  // What the wgmma A fragment needs: lane t's positions 4t..4t+3 hold the accumulator's columns
  // 2t, 2t+1 (first n8 block) and 8+2t, 8+2t+1 (second).
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(permuted_key(4 * t + 0), 2 * t);
    EXPECT_EQ(permuted_key(4 * t + 1), 2 * t + 1);
    EXPECT_EQ(permuted_key(4 * t + 2), 8 + 2 * t);
    EXPECT_EQ(permuted_key(4 * t + 3), 8 + 2 * t + 1);
  }
  for (int c = 0; c < 4 * kKeyStep; ++c) EXPECT_EQ(permuted_position(c) / kKeyStep, c / kKeyStep) << c;
}

// Random packings, many documents short or empty, so that several start inside one tile.
std::vector<int64_t> random_cu_seqlens(std::mt19937& rng) {
  const int docs = 1 + int(rng() % 40);
  std::vector<int64_t> cu{0};
  for (int d = 0; d < docs; ++d) cu.push_back(cu.back() + (rng() % 4 == 0 ? int64_t(rng() % 300) : int64_t(rng() % 5)));
  return cu;
}

// core/schedule.h: the tile slots of the documents never overlap and fit in slot_count, for
// the units the kernels use (32-token quantizer tiles and transposed steps, 128-row attention tiles).
TEST(DocumentSlots, TilesOfDocumentsAreDisjointAndInBounds) {
  std::mt19937 rng(11);
  for (const int64_t unit : {32, 64, 128}) {
    for (int trial = 0; trial < 300; ++trial) {
      const std::vector<int64_t> cu = random_cu_seqlens(rng);
      const int64_t docs = int64_t(cu.size()) - 1;
      const int64_t count = slots::slot_count(cu.back(), docs, unit);
      int64_t previous_end = 0;
      for (int64_t d = 0; d < docs; ++d) {
        const int64_t first = slots::first_slot(cu[d], d, unit);
        const int64_t end = first + slots::ceil_div(cu[d + 1] - cu[d], unit);
        EXPECT_GE(first, previous_end) << "unit " << unit << ", document " << d << " overlaps the one before";
        EXPECT_GT(first, d == 0 ? -1 : slots::first_slot(cu[d - 1], d - 1, unit)) << "first slots increase";
        EXPECT_LE(end, count) << "unit " << unit << ", document " << d;
        previous_end = end;
      }
    }
  }
}

TEST(OperandLayout, TransposedDocumentsAreAlignedDisjointAndInBounds) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const std::vector<int64_t> cu = random_cu_seqlens(rng);
    const int docs = int(cu.size()) - 1;
    const int64_t total = cu.back();
    const int64_t slots = transposed_tokens(total, docs);
    EXPECT_EQ(slots % kKeyStep, 0);
    int64_t previous_end = 0;
    for (int d = 0; d < docs; ++d) {
      const int64_t start = transposed_document_start(cu[d], d), length = cu[d + 1] - cu[d];
      const int64_t end = start + (length + kKeyStep - 1) / kKeyStep * kKeyStep;  // whole steps
      EXPECT_EQ(start % kKeyStep, 0) << "document " << d;
      EXPECT_GE(start, previous_end) << "document " << d << " overlaps the one before";
      EXPECT_LE(end, slots) << "document " << d;
      previous_end = end;
    }
  }
}

}  // namespace
}  // namespace flamia::layout
