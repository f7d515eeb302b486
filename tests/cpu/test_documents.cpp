#include <gtest/gtest.h>

#include <stdexcept>

#include "analysis/probe.h"
#include "core/documents.h"

namespace flamia {
namespace {

TEST(Documents, ValidatesCuSeqlens) {
  EXPECT_EQ(validate_cu_seqlens(std::vector<int32_t>{0, 3, 7}, 7), "");
  EXPECT_NE(validate_cu_seqlens(std::vector<int32_t>{0}, 0).find("at least 2"), std::string::npos);
  EXPECT_NE(validate_cu_seqlens(std::vector<int32_t>{1, 7}, 7).find("cu_seqlens[0]"), std::string::npos);
  EXPECT_NE(validate_cu_seqlens(std::vector<int32_t>{0, 5, 3, 7}, 7).find("cu_seqlens[2]"), std::string::npos);
  EXPECT_NE(validate_cu_seqlens(std::vector<int32_t>{0, 3, 6}, 7).find("packed tokens 7"), std::string::npos);
  EXPECT_THROW(Documents({0, 4, 2}, 2), std::invalid_argument);
}

TEST(Documents, IndexesTokensAndGroupsFromTheDocumentStart) {
  const int lengths[] = {5, 0, 40};
  const Documents docs = Documents::from_lengths(lengths);
  EXPECT_EQ(docs.count(), 3);
  EXPECT_EQ(docs.total_tokens(), 45);
  EXPECT_EQ(docs.document_of(4), 0);
  EXPECT_EQ(docs.document_of(5), 2);  // the empty document holds no token
  EXPECT_EQ(docs.max_length(), 40);
  // Document 2 starts at the unaligned offset 5; its groups are counted from there.
  EXPECT_EQ(scale_group_begin(33, ScaleGeometry::kBlock32), 32);
  EXPECT_EQ(scale_group_end(33, ScaleGeometry::kBlock32, 40), 40);  // the last group is short
  EXPECT_EQ(scale_group_end(3, ScaleGeometry::kBlock32, 40), 32);
  EXPECT_EQ(scale_group_begin(33, ScaleGeometry::kToken), 33);
  EXPECT_EQ(scale_group_end(33, ScaleGeometry::kToken, 40), 34);
}

// Lengths whose sum passes INT32_MAX are refused by name (not wrapped into a negative cu_seqlens).
TEST(Documents, RefusesLengthsThatSumPastInt32) {
  for (const std::vector<int> lengths : {std::vector<int>{2147483647, 1}, std::vector<int>(3000, 1000000)}) {
    try {
      Documents::from_lengths(lengths);
      FAIL() << "no exception for " << lengths.size() << " documents";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("too many tokens"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("2147483647"), std::string::npos) << e.what();
    }
  }
}

// A count of equal documents is checked from its 64-bit product, with the same message.
TEST(Documents, ChecksATokenCountWithoutTheLengths) {
  EXPECT_NO_THROW(check_token_count(2147483647, 2147483647));
  try {
    check_token_count(1000000000, int64_t(1000000000) * 1024);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("too many tokens: the 1000000000 documents hold 1024000000000 tokens"),
              std::string::npos)
        << e.what();
  }
}

// A probed position near INT_MAX is refused by the range check (position + 1 would overflow).
TEST(ProbeOptions, RefusesPositionsPastTheProbedDocument) {
  analysis::ProbeOptions o;
  for (int position : {2147483647, 2147483646, 419, -1}) {
    o.position = position;
    EXPECT_THROW(analysis::check_probe_options(o), std::invalid_argument) << position;
  }
  o.position = 418;  // len(B) - 2
  EXPECT_NO_THROW(analysis::check_probe_options(o));
  o.lengths = {2147483647 - 30, 2, 1};  // the moved document adds 37 tokens: past INT32_MAX
  o.position = 0;
  EXPECT_THROW(analysis::check_probe_options(o), std::invalid_argument);
}

}  // namespace
}  // namespace flamia
