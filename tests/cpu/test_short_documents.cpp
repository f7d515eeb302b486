// The short-document forward's host-side rules (core/short_documents.h): which documents it takes,
// how its work list is bucketed, and the order its producer streams an item's chunks in, which its
// consumers must take them in (a wrong use number is a wrong tile or a hang on the GPU).
#include "core/short_documents.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace flamia::short_docs {
namespace {

TEST(ShortDocuments, TakesDocumentsOfOneToTheLimitTokens) {
  EXPECT_FALSE(is_short(0)) << "an empty document has no work";
  EXPECT_TRUE(is_short(1));
  EXPECT_TRUE(is_short(kMaxTokens));
  EXPECT_FALSE(is_short(kMaxTokens + 1));
  EXPECT_FALSE(is_short(100, 0)) << "limit 0: no short documents";
  EXPECT_EQ(cost_bucket(1), 1);
  EXPECT_EQ(cost_bucket(32), 1);
  EXPECT_EQ(cost_bucket(33), 2);
  EXPECT_EQ(cost_bucket(kMaxTokens), kCostBuckets - 1);
}

// Every chunk of an item has exactly one use in [0, total), at() inverts the three use functions,
// and the stream holds, before each Q chunk, every K and V chunk its Q tile attends to (causal: tile
// j's and the tiles before it; not causal: all of them), with each Q tile's chunks after its key
// tile's in the order the consumers quantize them.
TEST(ShortDocuments, ChunkPlanNumbersEveryChunkOnceInAnOrderTheConsumersCanFollow) {
  for (bool causal : {true, false}) {
    for (int group : {1, 2, 4, 16}) {
      for (int len = 1; len <= kMaxTokens; ++len) {
        const ChunkPlan plan{len, group, causal};
        const int chunks = plan.chunks(), total = plan.total();
        ASSERT_EQ(chunks, (len + kChunkTokens - 1) / kChunkTokens);
        ASSERT_EQ(plan.tiles(), (len + kTileTokens - 1) / kTileTokens);
        ASSERT_EQ(total, (2 + group) * chunks);
        std::vector<int> owner(size_t(total), -1);
        auto claim = [&](int use, int who) {
          ASSERT_GE(use, 0) << "len " << len;
          ASSERT_LT(use, total) << "len " << len;
          ASSERT_EQ(owner[size_t(use)], -1) << "len " << len << ": use " << use << " twice";
          owner[size_t(use)] = who;
        };
        for (int c = 0; c < chunks; ++c) {
          claim(plan.k_use(c), c);
          claim(plan.v_use(c), c);
          const auto k = plan.at(plan.k_use(c)), v = plan.at(plan.v_use(c));
          EXPECT_EQ(k.operand, ChunkPlan::kKey);
          EXPECT_EQ(v.operand, ChunkPlan::kValue);
          EXPECT_EQ(k.chunk, c);
          EXPECT_EQ(v.chunk, c);
        }
        for (int g = 0; g < group; ++g)
          for (int c = 0; c < chunks; ++c) {
            const int use = plan.q_use(g, c);
            claim(use, c);
            const auto q = plan.at(use);
            EXPECT_EQ(q.operand, ChunkPlan::kQuery);
            EXPECT_EQ(q.head, g);
            EXPECT_EQ(q.chunk, c);
            const int j = c / kChunksPerTile, last_key_tile = causal ? j : plan.tiles() - 1;
            const int last_key_chunk = std::min(chunks, (last_key_tile + 1) * kChunksPerTile) - 1;
            EXPECT_GT(use, plan.v_use(last_key_chunk)) << "len " << len << ": a Q chunk before its key tiles";
            if (c % kChunksPerTile > 0) EXPECT_EQ(plan.q_use(g, c - 1), use - 1) << "a Q tile's chunks in order";
          }
        for (int c = 1; c < chunks; ++c) EXPECT_LT(plan.v_use(c - 1), plan.k_use(c)) << "K and V chunks in order";
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// The quantizers take an item's chunks in the order of forward_short.cu's loops (key tiles up to
// key_tiles_for(j), then Q tile j of every query head; K and V chunk by chunk), and refill each
// staging slot with the use kStagingSlots after the one just read: that order must be 0, 1, 2, ..
TEST(ShortDocuments, TheKernelsLoopsTakeTheChunksInUseOrder) {
  for (bool causal : {true, false})
    for (int group : {1, 4})
      for (int len = 1; len <= kMaxTokens; ++len) {
        const ChunkPlan plan{len, group, causal};
        int expected = 0;
        auto take = [&](int use) { ASSERT_EQ(use, expected++) << "len " << len << " causal " << causal; };
        for (int j = 0; j < plan.tiles(); ++j) {
          for (int k = j == 0 ? 0 : plan.key_tiles_for(j - 1); k < plan.key_tiles_for(j); ++k)
            for (int c = k * kChunksPerTile; c < k * kChunksPerTile + plan.tile_chunks(k); ++c) {
              take(plan.k_use(c));
              take(plan.v_use(c));
            }
          for (int g = 0; g < group; ++g)
            for (int c = j * kChunksPerTile; c < j * kChunksPerTile + plan.tile_chunks(j); ++c) take(plan.q_use(g, c));
        }
        ASSERT_EQ(expected, plan.total());
      }
}

// The producer's cursor gives every chunk in use order, as at() numbers them.
TEST(ShortDocuments, TheCursorWalksTheChunksInUseOrder) {
  for (bool causal : {true, false})
    for (int group : {1, 3, 16})
      for (int len = 1; len <= kMaxTokens; ++len) {
        const ChunkPlan plan{len, group, causal};
        ChunkCursor cursor;
        for (int use = 0; use < plan.total(); ++use) {
          const auto got = cursor.step(plan), want = plan.at(use);
          ASSERT_EQ(got.operand, want.operand) << "len " << len << " use " << use;
          ASSERT_EQ(got.head, want.head) << "len " << len << " use " << use;
          ASSERT_EQ(got.chunk, want.chunk) << "len " << len << " use " << use;
        }
      }
}

}  // namespace
}  // namespace flamia::short_docs
