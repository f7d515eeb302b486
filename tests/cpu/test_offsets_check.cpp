// The cu_seqlens rule of core/offsets_check.h that the host and the device share: which entry is
// reported and with what values, the messages, and the C API's host check (flamia_validate_cu_seqlens),
// status word message (flamia_offsets_status_message) and documents checks. The device side runs the
// same rule (tests/gpu/test_offsets_validation_gpu.cu compares its records with check_cu_seqlens).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "capi/validate.h"
#include "core/documents.h"
#include "core/offsets_check.h"
#include "flamia/flamia.h"

namespace flamia {
namespace {

constexpr int32_t kMax = std::numeric_limits<int32_t>::max();

struct Case {
  std::vector<int32_t> cu;
  OffsetsError kind;
  int32_t index, value, bound;
};

// T = 300 throughout: the malformed offsets of every kind, 2^31 - 1 entries, negative ones, and
// several violations where the first bad entry must win.
const std::vector<Case> kCases = {
    {{0, 200, 100}, OffsetsError::kDecreasing, 2, 100, 200},           // non-monotone
    {{0, 100, 400}, OffsetsError::kOutOfRange, 2, 400, 300},           // past the end
    {{5, 100, 300}, OffsetsError::kFirstNotZero, 0, 5, 0},             // not starting at 0
    {{0, 100, 250}, OffsetsError::kLastNotTotal, 2, 250, 300},         // ending before T
    {{0, kMax, 300}, OffsetsError::kOutOfRange, 1, kMax, 300},         // 2^31 - 1 in the middle
    {{0, 100, kMax}, OffsetsError::kOutOfRange, 2, kMax, 300},         // 2^31 - 1 at the end
    {{kMax, 100, 300}, OffsetsError::kFirstNotZero, 0, kMax, 0},       // 2^31 - 1 first
    {{0, -5, 300}, OffsetsError::kOutOfRange, 1, -5, 300},             // a negative middle entry
    {{0, 100, -2147483647 - 1, 300}, OffsetsError::kOutOfRange, 2, -2147483647 - 1, 300},
    {{-1, 100, 300}, OffsetsError::kFirstNotZero, 0, -1, 0},
    {{0, 400, 100, 300}, OffsetsError::kOutOfRange, 1, 400, 300},      // named before the decrease after it
    {{0, 50, 40, 300, 10}, OffsetsError::kDecreasing, 2, 40, 50},      // the first of two violations
    {{0, 300, 300, 299}, OffsetsError::kDecreasing, 3, 299, 300},
    {{0, 0, 0, 0}, OffsetsError::kLastNotTotal, 3, 0, 300},            // every document empty, T tokens
};

TEST(OffsetsCheck, ReportsTheFirstBadEntryWithItsValues) {
  for (const Case& c : kCases) {
    const OffsetsRecord r = check_cu_seqlens(c.cu, 300);
    EXPECT_EQ(r.kind, int32_t(c.kind)) << ::testing::PrintToString(c.cu);
    EXPECT_EQ(r.index, c.index) << ::testing::PrintToString(c.cu);
    EXPECT_EQ(r.value, c.value) << ::testing::PrintToString(c.cu);
    EXPECT_EQ(r.bound, c.bound) << ::testing::PrintToString(c.cu);
  }
}

TEST(OffsetsCheck, ValidOffsetsHaveNoRecord) {
  for (const std::vector<int32_t>& cu : {std::vector<int32_t>{0, 300}, {0, 0, 300}, {0, 300, 300}, {0, 1, 2, 300},
                                         {0, 100, 100, 100, 300}}) {
    const OffsetsRecord r = check_cu_seqlens(cu, 300);
    EXPECT_EQ(r.kind, 0) << ::testing::PrintToString(cu);
    EXPECT_EQ(validate_cu_seqlens(cu, 300), "");
  }
  EXPECT_EQ(check_cu_seqlens(std::vector<int32_t>{0, kMax}, kMax).kind, 0) << "the largest T";
}

// The rule entry by entry is the whole-array rule: a random array's record is its first entry whose
// rule fails (the device evaluates entries in any order and keeps the smallest index).
TEST(OffsetsCheck, TheFirstFailingEntryIsTheRecord) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t T = 1 + rng() % 50;
    std::vector<int32_t> cu(1 + rng() % 6);
    cu[0] = pick(rng) == 0 ? int32_t(rng() % 3) - 1 : 0;
    for (size_t i = 1; i < cu.size(); ++i) {
      const int p = pick(rng);
      cu[i] = p == 0 ? -int32_t(rng() % 4) : p == 1 ? int32_t(T + rng() % 3) : p == 2 ? cu[i - 1] - 1
                                                                                          : cu[i - 1] + int32_t(rng() % 20);
    }
    if (pick(rng) < 5) cu.back() = int32_t(T);
    if (cu.size() < 2) cu.push_back(int32_t(T));
    const OffsetsRecord r = check_cu_seqlens(cu, T);
    int64_t first = -1;
    for (int64_t i = 0; i < int64_t(cu.size()) && first < 0; ++i)
      if (offsets_entry_error(i, cu[size_t(i)], i ? cu[size_t(i - 1)] : 0, int64_t(cu.size()) - 1, T) !=
          OffsetsError::kOk)
        first = i;
    const bool valid = cu[0] == 0 && cu.back() == T && [&] {
      for (size_t i = 1; i < cu.size(); ++i)
        if (cu[i] < cu[i - 1] || cu[i] < 0 || cu[i] > T) return false;
      return true;
    }();
    ASSERT_EQ(first < 0, valid) << ::testing::PrintToString(cu) << " T " << T;
    ASSERT_EQ(r.kind == 0, valid);
    if (!valid) ASSERT_EQ(r.index, first);
  }
}

TEST(OffsetsCheck, MessagesNameTheEntryAndItsValues) {
  const auto message = [](std::vector<int32_t> cu) { return describe_offsets_error(check_cu_seqlens(cu, 300)); };
  EXPECT_EQ(message({0, 200, 100}), "cu_seqlens must be non-decreasing, but cu_seqlens[2] = 100 < cu_seqlens[1] = 200");
  EXPECT_EQ(message({0, 100, 400}),
            "cu_seqlens[2] = 400 lies past the end of the 300 packed tokens: every entry must lie in [0, 300]");
  EXPECT_EQ(message({0, -5, 300}), "cu_seqlens[1] = -5 is negative: every entry must lie in [0, 300]");
  EXPECT_EQ(message({5, 100, 300}), "cu_seqlens[0] must be 0, got 5");
  EXPECT_EQ(message({0, 100, 250}), "cu_seqlens[2], the last entry, must equal the number of packed tokens 300, got 250");
  EXPECT_EQ(describe_offsets_error(check_cu_seqlens(std::vector<int32_t>{0, 9}, 300), "docs.cu_seqlens_host"),
            "docs.cu_seqlens_host[1], the last entry, must equal the number of packed tokens 300, got 9");
  OffsetsRecord unknown;
  unknown.kind = 42, unknown.index = 3, unknown.value = 4, unknown.bound = 5;
  EXPECT_NE(describe_offsets_error(unknown).find("unknown offsets error 42 at entry 3"), std::string::npos);
  EXPECT_EQ(validate_cu_seqlens(std::vector<int32_t>{0, 200, 100}, 300), message({0, 200, 100}));
}

// ---- the C API's host functions ----

TEST(OffsetsCheck, CApiHostCheckGivesTheRecordAndTheMessage) {
  for (const Case& c : kCases) {
    flamia_offsets_status record{};
    flamia_error err{};
    ASSERT_EQ(flamia_validate_cu_seqlens(c.cu.data(), int32_t(c.cu.size()) - 1, 300, 0, &record, &err),
              FLAMIA_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(record.error, int32_t(c.kind));
    EXPECT_EQ(record.index, c.index);
    EXPECT_EQ(record.value, c.value);
    EXPECT_EQ(record.bound, c.bound);
    EXPECT_EQ(std::string(err.message), describe_offsets_error(check_cu_seqlens(c.cu, 300)));
    // The status word's message is the same text.
    flamia_error from_record{};
    EXPECT_EQ(flamia_offsets_status_message(&record, &from_record), FLAMIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STREQ(from_record.message, err.message);
  }
  const std::vector<int32_t> good = {0, 100, 300};
  flamia_offsets_status record{1, 2, 3, 4};
  flamia_error err{};
  EXPECT_EQ(flamia_validate_cu_seqlens(good.data(), 2, 300, 200, &record, &err), FLAMIA_SUCCESS) << err.message;
  EXPECT_EQ(record.error, 0);
  EXPECT_EQ(record.index, 0);
  EXPECT_EQ(flamia_validate_cu_seqlens(good.data(), 2, 300, 0, nullptr, &err), FLAMIA_SUCCESS);
  EXPECT_EQ(flamia_offsets_status_message(&record, &err), FLAMIA_SUCCESS);
  EXPECT_STREQ(err.message, "");
}

TEST(OffsetsCheck, CApiHostCheckArgumentsAndTheMaxSeqlenBound) {
  const std::vector<int32_t> cu = {0, 100, 300};
  flamia_error err{};
  EXPECT_EQ(flamia_validate_cu_seqlens(cu.data(), 2, 300, 199, nullptr, &err), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("max_seqlen (199) is smaller than the longest document (200"),
            std::string::npos)
      << err.message;
  flamia_offsets_status record{};
  EXPECT_EQ(flamia_validate_cu_seqlens(cu.data(), 2, 300, 199, &record, &err), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(record.error, 0) << "the device does not check max_seqlen: no record";
  EXPECT_EQ(flamia_validate_cu_seqlens(nullptr, 2, 300, 0, nullptr, &err), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("cu_seqlens_host is NULL"), std::string::npos);
  EXPECT_EQ(flamia_validate_cu_seqlens(cu.data(), 0, 300, 0, nullptr, &err), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("num_docs"), std::string::npos);
  for (int64_t T : {int64_t(0), int64_t(-1), int64_t(kMax) + 1}) {
    EXPECT_EQ(flamia_validate_cu_seqlens(cu.data(), 2, T, 0, nullptr, &err), FLAMIA_ERROR_INVALID_ARGUMENT) << T;
    EXPECT_NE(std::string(err.message).find("total_tokens"), std::string::npos);
  }
  EXPECT_EQ(flamia_offsets_status_message(nullptr, &err), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flamia_offsets_status_message(&record, nullptr), FLAMIA_SUCCESS) << "error may be NULL";
}

// The calls' documents: the status word must be 16-byte aligned (the device writes it with one
// 16-byte store); NULL is allowed. Nothing else of it is read on the host.
TEST(OffsetsCheck, CallsCheckTheStatusWordsAlignment) {
  flamia_tensor q{reinterpret_cast<void*>(0x100000), FLAMIA_DTYPE_BF16, 300, 2, 64, 128, 64};
  flamia_tensor k{reinterpret_cast<void*>(0x200000), FLAMIA_DTYPE_BF16, 300, 2, 64, 128, 64};
  flamia_tensor v{reinterpret_cast<void*>(0x300000), FLAMIA_DTYPE_BF16, 300, 2, 64, 128, 64};
  flamia_tensor o{reinterpret_cast<void*>(0x400000), FLAMIA_DTYPE_BF16, 300, 2, 64, 128, 64};
  float* lse = reinterpret_cast<float*>(0x500000);
  flamia_documents docs{reinterpret_cast<const int32_t*>(0x600000), nullptr, 2, 200, nullptr};
  flamia_options options;
  flamia_default_options(&options);
  EXPECT_TRUE(capi::validate_forward(&q, &k, &v, &docs, &options, &o, lse).ok());
  docs.status = reinterpret_cast<flamia_offsets_status*>(0x70000);
  EXPECT_TRUE(capi::validate_forward(&q, &k, &v, &docs, &options, &o, lse).ok());
  docs.status = reinterpret_cast<flamia_offsets_status*>(0x70004);
  const capi::CallError e = capi::validate_forward(&q, &k, &v, &docs, &options, &o, lse);
  EXPECT_EQ(e.status, FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("docs.status must be 16-byte aligned"), std::string::npos) << e.message;
  // A host copy is checked with the device's rule, at once, and named as the host copy.
  const std::vector<int32_t> bad = {0, 200, 100};
  docs.status = nullptr;
  docs.cu_seqlens_host = bad.data();
  const capi::CallError h = capi::validate_forward(&q, &k, &v, &docs, &options, &o, lse);
  EXPECT_EQ(h.message,
            "docs.cu_seqlens_host must be non-decreasing, but docs.cu_seqlens_host[2] = 100 < "
            "docs.cu_seqlens_host[1] = 200");
}

TEST(OffsetsCheck, TheStatusWordIsTheDevicesRecord) {
  static_assert(sizeof(flamia_offsets_status) == 16 && sizeof(OffsetsRecord) == 16);
  EXPECT_EQ(alignof(OffsetsRecord), 16u);
  EXPECT_EQ(int(FLAMIA_OFFSETS_DECREASING), int(OffsetsError::kDecreasing));
  // The workspace holds the checked copy of cu_seqlens (num_docs + 1 entries) in both layouts.
  const capi::ForwardWorkspace f = capi::forward_workspace_layout(300, 2, 2, 64, 7, false);
  const capi::BackwardWorkspace b = capi::backward_workspace_layout(300, 2, 2, 64, 7, false);
  EXPECT_GE(f.checked_cu_seqlens.bytes, 8 * sizeof(int32_t));
  EXPECT_GE(b.checked_cu_seqlens.bytes, 8 * sizeof(int32_t));
  EXPECT_LE(f.checked_cu_seqlens.offset + f.checked_cu_seqlens.bytes, f.total);
  EXPECT_LE(b.checked_cu_seqlens.offset + b.checked_cu_seqlens.bytes, b.total);
}

}  // namespace
}  // namespace flamia
