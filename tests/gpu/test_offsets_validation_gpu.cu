// Malformed device cu_seqlens through the C API (include/flamia/flamia.h, "Offsets found malformed
// on the device"): every call checks its offsets on the device, records the first bad entry in the
// caller's status word and makes every output NaN, forward and backward, both isolations, eagerly
// and replayed from a CUDA graph whose offsets tensor was overwritten after capture. Also: valid
// offsets leave the status word and the outputs alone and write every output element, the host
// copy's check refuses the same offsets at once with the same message, the device's record is the
// host rule's on random arrays, the status query reads and clears the word (device memory or mapped
// pinned host memory), and a max_seqlen below the longest document gives bitwise the same results.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/documents.h"
#include "core/offsets_check.h"
#include "core/schedule.h"
#include "cuda/schedule/work_order.cuh"
#include "cuda/sm90/backward.h"
#include "forward_harness.h"
#include "graph_capture.h"

namespace flamia::gpu_test {
namespace {

constexpr int32_t kMax = std::numeric_limits<int32_t>::max();

// A malformed cu_seqlens for the 300 tokens of two documents (100 + 200), and the record the device
// must write: the cases of issue #46 §1, 2^31 - 1 entries and a negative middle entry.
struct Malformed {
  const char* name;
  std::vector<int32_t> cu;
  flamia_offsets_status record;
};
const std::vector<Malformed> kMalformed = {
    {"NonMonotone", {0, 200, 100}, {FLAMIA_OFFSETS_DECREASING, 2, 100, 200}},
    {"PastTheEnd", {0, 100, 400}, {FLAMIA_OFFSETS_OUT_OF_RANGE, 2, 400, 300}},
    {"NotStartingAtZero", {5, 100, 300}, {FLAMIA_OFFSETS_FIRST_NOT_ZERO, 0, 5, 0}},
    {"EndingBeforeT", {0, 100, 250}, {FLAMIA_OFFSETS_LAST_NOT_TOTAL, 2, 250, 300}},
    {"Int32MaxInTheMiddle", {0, kMax, 300}, {FLAMIA_OFFSETS_OUT_OF_RANGE, 1, kMax, 300}},
    {"Int32MaxAtTheEnd", {0, 100, kMax}, {FLAMIA_OFFSETS_OUT_OF_RANGE, 2, kMax, 300}},
    {"Int32MaxFirst", {kMax, 100, 300}, {FLAMIA_OFFSETS_FIRST_NOT_ZERO, 0, kMax, 0}},
    {"NegativeMiddle", {0, -5, 300}, {FLAMIA_OFFSETS_OUT_OF_RANGE, 1, -5, 300}},
};
const std::vector<int> kLengths = {100, 200};

bool same_record(const flamia_offsets_status& a, const flamia_offsets_status& b) {
  return a.error == b.error && a.index == b.index && a.value == b.value && a.bound == b.bound;
}
std::string describe(const flamia_offsets_status& r) {
  return "{" + std::to_string(r.error) + ", " + std::to_string(r.index) + ", " + std::to_string(r.value) + ", " +
         std::to_string(r.bound) + "}";
}

// A status word in device memory, zeroed.
struct DeviceStatus {
  DeviceBuffer buffer{sizeof(flamia_offsets_status)};
  DeviceStatus() { clear(); }
  flamia_offsets_status* get() const { return static_cast<flamia_offsets_status*>(buffer.get()); }
  void clear() { FLAMIA_CUDA_CHECK(cudaMemset(buffer.get(), 0, buffer.bytes())); }
  flamia_offsets_status read() const {
    flamia_offsets_status r{};
    FLAMIA_CUDA_CHECK(cudaMemcpy(&r, buffer.get(), sizeof r, cudaMemcpyDeviceToHost));
    return r;
  }
};

// Every output of a call, filled with a finite byte pattern (BF16 0x3F3F, FP32 0x3F3F3F3F) so that
// a NaN afterwards was written by the call.
void fill_finite(const DeviceBuffer& b) { FLAMIA_CUDA_CHECK(cudaMemset(b.get(), 0x3F, b.bytes())); }
void fill_outputs(TrainingCall& c) {
  for (DeviceTensor* t : {&c.o, &c.dq, &c.dk, &c.dv}) fill_finite(t->buffer);
  fill_finite(c.lse);
}

// How many elements of a BF16 tensor (its [T, H, D] elements) or an FP32 buffer are / are not NaN.
struct NanCount {
  int64_t nan = 0, other = 0;
};
NanCount count_bf16(const DeviceTensor& t) {
  std::vector<uint16_t> host(t.buffer.bytes() / 2);
  FLAMIA_CUDA_CHECK(cudaMemcpy(host.data(), t.buffer.get(), t.buffer.bytes(), cudaMemcpyDeviceToHost));
  NanCount n;
  for (int64_t i = 0; i < t.desc.tokens; ++i)
    for (int64_t h = 0; h < t.desc.heads; ++h)
      for (int64_t f = 0; f < t.desc.dim; ++f) {
        const uint16_t x = host[size_t(i * t.desc.stride_token + h * t.desc.stride_head + f)];
        ((x & 0x7FFF) > 0x7F80 ? n.nan : n.other) += 1;
      }
  return n;
}
NanCount count_fp32(const DeviceBuffer& b) {
  std::vector<float> host(b.bytes() / sizeof(float));
  FLAMIA_CUDA_CHECK(cudaMemcpy(host.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  NanCount n;
  for (float x : host) (std::isnan(x) ? n.nan : n.other) += 1;
  return n;
}
::testing::AssertionResult all_nan(const NanCount& n, const char* what) {
  if (n.other == 0 && n.nan > 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << n.other << " of " << n.nan + n.other << " elements not NaN";
}
::testing::AssertionResult none_nan(const NanCount& n, const char* what) {
  if (n.nan == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << n.nan << " of " << n.nan + n.other << " elements NaN";
}

void upload_cu(const ForwardCall& c, const std::vector<int32_t>& cu) {
  ASSERT_EQ(cu.size() * sizeof(int32_t), c.cu_seqlens.bytes());
  FLAMIA_CUDA_CHECK(cudaMemcpy(c.cu_seqlens.get(), cu.data(), c.cu_seqlens.bytes(), cudaMemcpyHostToDevice));
}

// A training call on kLengths whose device offsets are replaced by `cu`, no host copy (so only the
// device can tell), recording into `status`.
TrainingCall malformed_call(const NumericsOptions& opt, QkvHandOver hand_over, const std::vector<int32_t>& cu,
                            flamia_offsets_status* status, int q_heads = 4, int kv_heads = 2) {
  TrainingCall c(analysis::random_inputs({kLengths, q_heads, kv_heads, 128}, 46), opt, true, hand_over);
  upload_cu(c, cu);
  c.docs.cu_seqlens_host = nullptr;
  c.docs.status = status;
  fill_outputs(c);
  return c;
}

NumericsOptions isolation_options(Isolation isolation) {
  NumericsOptions o;
  o.isolation = isolation;
  return o;
}

struct MalformedCase {
  Malformed offsets;
  Isolation isolation;
  QkvHandOver hand_over;
};

class OffsetsValidation : public ::testing::TestWithParam<MalformedCase> {};

// Forward, then backward, each on its own: the record names the first bad entry with its values,
// and every element of o and lse, then of dq, dk and dv, is NaN.
TEST_P(OffsetsValidation, ForwardAndBackwardRecordTheEntryAndPoisonEveryOutput) {
  FLAMIA_REQUIRE_GPU();
  const MalformedCase& c = GetParam();
  DeviceStatus status;
  TrainingCall call = malformed_call(isolation_options(c.isolation), c.hand_over, c.offsets.cu, status.get());
  flamia_error err{};
  ASSERT_EQ(call.launch(nullptr, &err), FLAMIA_SUCCESS) << err.message;  // the call cannot know yet
  FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_record(status.read(), c.offsets.record)) << describe(status.read());
  EXPECT_TRUE(all_nan(count_bf16(call.o), "o"));
  EXPECT_TRUE(all_nan(count_fp32(call.lse), "lse"));

  status.clear();
  ASSERT_EQ(call.launch_backward(nullptr, &err), FLAMIA_SUCCESS) << err.message;
  FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_record(status.read(), c.offsets.record)) << describe(status.read());
  EXPECT_TRUE(all_nan(count_bf16(call.dq), "dq"));
  EXPECT_TRUE(all_nan(count_bf16(call.dk), "dk"));
  EXPECT_TRUE(all_nan(count_bf16(call.dv), "dv"));

  // The status query gives the host check's message, and clears the word.
  flamia_error message{};
  EXPECT_EQ(flamia_check_offsets_status(status.get(), 1, nullptr, &message), FLAMIA_ERROR_INVALID_ARGUMENT);
  flamia_error host{};
  ASSERT_EQ(flamia_validate_cu_seqlens(c.offsets.cu.data(), int32_t(c.offsets.cu.size()) - 1, 300, 0, nullptr, &host),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(message.message, host.message);
  EXPECT_EQ(status.read().error, FLAMIA_OFFSETS_OK);
  EXPECT_EQ(flamia_check_offsets_status(status.get(), 0, nullptr, &message), FLAMIA_SUCCESS) << message.message;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

std::vector<MalformedCase> malformed_cases() {
  std::vector<MalformedCase> cases;
  for (const Malformed& m : kMalformed)
    for (Isolation iso : {Isolation::kDocument, Isolation::kPrefix})
      for (QkvHandOver h : {QkvHandOver::kRequantize, QkvHandOver::kSavedCodes}) cases.push_back({m, iso, h});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Offsets, OffsetsValidation, ::testing::ValuesIn(malformed_cases()),
                         [](const ::testing::TestParamInfo<MalformedCase>& info) {
                           return std::string(info.param.offsets.name) +
                                  (info.param.isolation == Isolation::kPrefix ? "_Prefix" : "_Document") +
                                  (info.param.hand_over == QkvHandOver::kSavedCodes ? "_SavedCodes" : "_Requantize");
                         });

// Without a status word nothing is recorded, and every output is NaN all the same.
TEST(OffsetsValidationMore, WithoutAStatusWordTheOutputsAreNaNAllTheSame) {
  FLAMIA_REQUIRE_GPU();
  TrainingCall call = malformed_call(NumericsOptions{}, QkvHandOver::kSavedCodes, {0, 200, 100}, nullptr);
  flamia_error err{};
  ASSERT_EQ(call.launch_training(nullptr, &err), FLAMIA_SUCCESS) << err.message;
  FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
  for (const auto& [t, name] : {std::pair{&call.o, "o"}, {&call.dq, "dq"}, {&call.dk, "dk"}, {&call.dv, "dv"}})
    EXPECT_TRUE(all_nan(count_bf16(*t), name));
  EXPECT_TRUE(all_nan(count_fp32(call.lse), "lse"));
}

// The backward whose dQ comes from FP16 partials (saved codes, document isolation, causal, D = 128,
// long documents): its prep pass initializes dq, which the finish pass rewrites, and both keep the
// NaN. MQA, so that dk and dv have one head of eight.
TEST(OffsetsValidationMore, TheFp16PartialsBackwardIsPoisonedToo) {
  FLAMIA_REQUIRE_GPU();
  const std::vector<int> lengths = {4096, 12288};
  ASSERT_TRUE(cuda::sm90::dq_partials_supported(128, true, false, 16384, 2)) << "the test must take the partials";
  for (const std::vector<int32_t>& cu : {std::vector<int32_t>{0, 12288, 4096}, {0, 4096, 16000}}) {
    DeviceStatus status;
    TrainingCall call(analysis::random_inputs({lengths, 8, 1, 128}, 7), NumericsOptions{}, true,
                      QkvHandOver::kSavedCodes);
    call.options.deterministic = 0;
    upload_cu(call, cu);
    call.docs.cu_seqlens_host = nullptr;
    call.docs.status = status.get();
    fill_outputs(call);
    flamia_error err{};
    ASSERT_EQ(call.launch_training(nullptr, &err), FLAMIA_SUCCESS) << err.message;
    FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
    const flamia_offsets_status want = cu[1] == 12288 ? flamia_offsets_status{FLAMIA_OFFSETS_DECREASING, 2, 4096, 12288}
                                                      : flamia_offsets_status{FLAMIA_OFFSETS_LAST_NOT_TOTAL, 2, 16000, 16384};
    EXPECT_TRUE(same_record(status.read(), want)) << describe(status.read());
    for (const auto& [t, name] : {std::pair{&call.o, "o"}, {&call.dq, "dq"}, {&call.dk, "dk"}, {&call.dv, "dv"}})
      EXPECT_TRUE(all_nan(count_bf16(*t), name));
  }
}

// The first record stays: a second malformed call does not overwrite it, a valid one neither.
TEST(OffsetsValidationMore, TheFirstRecordStaysUntilCleared) {
  FLAMIA_REQUIRE_GPU();
  DeviceStatus status;
  TrainingCall first = malformed_call(NumericsOptions{}, QkvHandOver::kRequantize, {0, 200, 100}, status.get());
  TrainingCall second = malformed_call(NumericsOptions{}, QkvHandOver::kRequantize, {5, 100, 300}, status.get());
  TrainingCall valid = malformed_call(NumericsOptions{}, QkvHandOver::kRequantize, {0, 100, 300}, status.get());
  flamia_error err{};
  for (TrainingCall* c : {&first, &second, &valid}) ASSERT_EQ(c->launch(nullptr, &err), FLAMIA_SUCCESS) << err.message;
  FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_record(status.read(), kMalformed[0].record)) << describe(status.read());
  EXPECT_TRUE(all_nan(count_bf16(second.o), "o of the second call"));
  EXPECT_TRUE(none_nan(count_bf16(valid.o), "o of the valid call"));
}

// A status word in mapped pinned host memory: the device writes it, the host reads it directly.
TEST(OffsetsValidationMore, AStatusWordInPinnedHostMemoryIsWrittenThroughItsMapping) {
  FLAMIA_REQUIRE_GPU();
  flamia_offsets_status* host = nullptr;
  FLAMIA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), sizeof *host, cudaHostAllocMapped));
  std::memset(host, 0, sizeof *host);
  {
    TrainingCall call = malformed_call(NumericsOptions{}, QkvHandOver::kSavedCodes, {0, 100, 250}, host);
    flamia_error err{};
    ASSERT_EQ(call.launch_training(nullptr, &err), FLAMIA_SUCCESS) << err.message;
    FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
    const volatile flamia_offsets_status* const mapped = host;  // read with plain loads, no CUDA call
    const flamia_offsets_status seen{mapped->error, mapped->index, mapped->value, mapped->bound};
    EXPECT_TRUE(same_record(seen, kMalformed[3].record)) << describe(seen);
    EXPECT_EQ(flamia_check_offsets_status(host, 1, nullptr, &err), FLAMIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err.message).find("cu_seqlens[2], the last entry"), std::string::npos) << err.message;
    EXPECT_EQ(host->error, 0) << "cleared";
  }
  FLAMIA_CUDA_CHECK(cudaFreeHost(host));
}

// With the host copy (the synchronous check) the same offsets are refused before anything is
// launched, with the same message naming the host copy; the outputs and the status word stay as
// they were.
TEST(OffsetsValidationMore, TheHostCopyRefusesTheSameOffsetsAtOnce) {
  FLAMIA_REQUIRE_GPU();
  for (const Malformed& m : kMalformed) {
    DeviceStatus status;
    TrainingCall call = malformed_call(NumericsOptions{}, QkvHandOver::kRequantize, m.cu, status.get());
    call.docs.cu_seqlens_host = m.cu.data();
    flamia_error err{};
    EXPECT_EQ(call.launch(nullptr, &err), FLAMIA_ERROR_INVALID_ARGUMENT) << m.name;
    OffsetsRecord r;
    r.kind = m.record.error, r.index = m.record.index, r.value = m.record.value, r.bound = m.record.bound;
    EXPECT_EQ(std::string(err.message), describe_offsets_error(r, "docs.cu_seqlens_host")) << m.name;
    EXPECT_EQ(call.launch_backward(nullptr, &err), FLAMIA_ERROR_INVALID_ARGUMENT) << m.name;
    FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(status.read().error, FLAMIA_OFFSETS_OK) << m.name;
    EXPECT_TRUE(none_nan(count_bf16(call.o), "o")) << m.name;
    EXPECT_TRUE(none_nan(count_bf16(call.dq), "dq")) << m.name;
  }
}

// The device's record is the host rule's (core/offsets_check.h) on random arrays of every kind,
// longer than one pass of the builder's threads, with violations anywhere and several at once.
TEST(OffsetsValidationMore, TheDevicesRecordIsTheHostRulesOnRandomOffsets) {
  FLAMIA_REQUIRE_GPU();
  std::mt19937 rng(46);
  const int num_docs = 3000, T = 6000;  // documents of 2 tokens on average, so a call stays small
  std::vector<int> lengths(num_docs, 2);
  TrainingCall call(analysis::random_inputs({lengths, 2, 1, 64}, 3), NumericsOptions{}, true);
  DeviceStatus status;
  call.docs.cu_seqlens_host = nullptr;
  call.docs.status = status.get();
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int32_t> cu(num_docs + 1);
    for (int i = 0; i <= num_docs; ++i) cu[size_t(i)] = 2 * i;
    const int breaks = 1 + int(rng() % 3);
    for (int b = 0; b < breaks; ++b) {
      const size_t at = rng() % cu.size();
      switch (rng() % 4) {
        case 0: cu[at] = -1 - int32_t(rng() % 1000); break;
        case 1: cu[at] = T + 1 + int32_t(rng() % 1000); break;
        case 2: cu[at] = at > 0 ? cu[at - 1] - 1 : 3; break;
        default: cu[at] = kMax; break;
      }
    }
    const OffsetsRecord want = check_cu_seqlens(cu, T);
    ASSERT_NE(want.kind, 0);
    upload_cu(call, cu);
    status.clear();
    flamia_error err{};
    ASSERT_EQ(call.launch(nullptr, &err), FLAMIA_SUCCESS) << err.message;
    FLAMIA_CUDA_CHECK(cudaDeviceSynchronize());
    const flamia_offsets_status got = status.read();
    EXPECT_TRUE(same_record(got, {want.kind, want.index, want.value, want.bound}))
        << "trial " << trial << ": device " << describe(got) << ", host {" << want.kind << ", " << want.index << ", "
        << want.value << ", " << want.bound << "}";
  }
  ASSERT_GT(num_docs + 1, 1024) << "more entries than the builder has threads";
}

// Two training calls' o, lse, dq, dk and dv, expected bitwise equal.
void expect_same_results(const TrainingCall::Result& a, const TrainingCall::Result& b) {
  for (const auto& [name, x, y] : {std::tuple{"o", &a.forward.o.data, &b.forward.o.data},
                                   {"lse", &a.forward.lse.data, &b.forward.lse.data},
                                   {"dq", &a.forward.dq->data, &b.forward.dq->data},
                                   {"dk", &a.dk.data, &b.dk.data},
                                   {"dv", &a.dv.data, &b.dv.data}})
    EXPECT_EQ(*x, *y) << name;
}

// Valid offsets with a status word: the word stays zero, every output element is written (the
// outputs start as NaN), and the results are bitwise those of a call without the word. Empty
// documents first, in the middle and last: rows outside every document do not exist when the
// offsets are valid.
TEST(OffsetsValidationMore, ValidOffsetsLeaveTheWordAloneAndWriteEveryOutput) {
  FLAMIA_REQUIRE_GPU();
  const auto in = analysis::random_inputs({{0, 100, 0, 33, 200, 0}, 4, 2, 128}, 5);
  for (Isolation iso : {Isolation::kDocument, Isolation::kPrefix}) {
    DeviceStatus status;
    TrainingCall plain(in, isolation_options(iso), true, QkvHandOver::kSavedCodes);
    TrainingCall with(in, isolation_options(iso), true, QkvHandOver::kSavedCodes);
    plain.options.deterministic = with.options.deterministic = 1;
    with.docs.status = status.get();
    with.docs.cu_seqlens_host = nullptr;  // checked on the device only
    const auto a = plain.run_training(), b = with.run_training();
    EXPECT_EQ(status.read().error, FLAMIA_OFFSETS_OK);
    for (const auto& [t, name] : {std::pair{&with.o, "o"}, {&with.dq, "dq"}, {&with.dk, "dk"}, {&with.dv, "dv"}})
      EXPECT_TRUE(none_nan(count_bf16(*t), name));
    EXPECT_TRUE(none_nan(count_fp32(with.lse), "lse"));
    expect_same_results(a, b);
  }
}

// max_seqlen is a bound the results do not depend on: 1 (below every document) gives bitwise the
// results of the true longest document, whose length (5000) picks the other launch shape of the
// fold reference's scan (one CTA per 4096-position chunk instead of one per document).
TEST(OffsetsValidationMore, ASmallMaxSeqlenNeverTruncatesADocument) {
  FLAMIA_REQUIRE_GPU();
  const auto in = analysis::random_inputs({{5000, 300, 0, 17}, 4, 2, 128}, 8);
  for (Isolation iso : {Isolation::kDocument, Isolation::kPrefix}) {
    TrainingCall right(in, isolation_options(iso), true), small(in, isolation_options(iso), true);
    small.docs.max_seqlen = 1;
    small.docs.cu_seqlens_host = nullptr;  // the host copy's check would refuse the bound
    ASSERT_EQ(right.docs.max_seqlen, 5000);
    const auto a = right.run_training(), b = small.run_training();
    expect_same_results(a, b);
  }
}

// A training call captured with good offsets and replayed after the offsets tensor is overwritten:
// each replay checks the offsets it finds, records them and poisons every output; with the good
// offsets back (and the word cleared) the replay gives the first results again, bitwise.
TEST(OffsetsValidationMore, GraphReplayChecksTheOffsetsItFinds) {
  FLAMIA_REQUIRE_GPU();
  for (Isolation iso : {Isolation::kDocument, Isolation::kPrefix}) {
    for (QkvHandOver hand_over : {QkvHandOver::kRequantize, QkvHandOver::kSavedCodes}) {
      DeviceStatus status;
      TrainingCall call = malformed_call(isolation_options(iso), hand_over, {0, 100, 300}, status.get());
      call.options.deterministic = 1;
      CapturedCall graph([&](cudaStream_t s, flamia_error* e) { return call.launch_training(s, e); });
      ASSERT_TRUE(graph.ok()) << graph.message();
      graph.replay();
      EXPECT_EQ(status.read().error, FLAMIA_OFFSETS_OK);
      const auto good_o = download_bf16(call.o), good_dq = download_bf16(call.dq), good_dk = download_bf16(call.dk),
                 good_dv = download_bf16(call.dv);
      for (DeviceTensor* t : {&call.o, &call.dq, &call.dk, &call.dv})
        EXPECT_TRUE(none_nan(count_bf16(*t), "a good replay's output"));

      for (const Malformed& m : kMalformed) {
        upload_cu(call, m.cu);  // the captured offsets tensor, overwritten
        status.clear();
        graph.replay();
        EXPECT_TRUE(same_record(status.read(), m.record)) << m.name << ": " << describe(status.read());
        for (const auto& [t, name] : {std::pair{&call.o, "o"}, {&call.dq, "dq"}, {&call.dk, "dk"}, {&call.dv, "dv"}})
          EXPECT_TRUE(all_nan(count_bf16(*t), name)) << m.name;
        EXPECT_TRUE(all_nan(count_fp32(call.lse), "lse")) << m.name;
      }

      upload_cu(call, {0, 100, 300});
      status.clear();
      graph.replay();
      EXPECT_EQ(status.read().error, FLAMIA_OFFSETS_OK);
      EXPECT_EQ(download_bf16(call.o).data, good_o.data);
      EXPECT_EQ(download_bf16(call.dq).data, good_dq.data);
      EXPECT_EQ(download_bf16(call.dk).data, good_dk.data);
      EXPECT_EQ(download_bf16(call.dv).data, good_dv.data);
    }
  }
}

// The builder on its own (cuda/schedule/work_order.cuh): malformed offsets order no tile, its
// checked copy is all zeros, and valid ones are copied as they are.
TEST(OffsetsValidationMore, TheBuilderOrdersNoTileForMalformedOffsets) {
  FLAMIA_REQUIRE_GPU();
  for (const Malformed& m : kMalformed) {
    const int T = 300, docs = int(m.cu.size()) - 1;
    const int64_t entries = order::table_entries(T, docs);
    DeviceBuffer d_cu(m.cu.size() * sizeof(int32_t)), table(size_t(entries) * sizeof(order::OrderedTile)),
        counters(size_t(order::cost_counters(T)) * sizeof(int)), copy(m.cu.size() * sizeof(int32_t));
    FLAMIA_CUDA_CHECK(cudaMemcpy(d_cu.get(), m.cu.data(), d_cu.bytes(), cudaMemcpyHostToDevice));
    FLAMIA_CUDA_CHECK(cudaMemset(counters.get(), 0x5a, counters.bytes()));
    FLAMIA_CUDA_CHECK(cudaMemset(copy.get(), 0x5a, copy.bytes()));
    cuda::OffsetsCheck check;
    check.checked_cu_seqlens = static_cast<int32_t*>(copy.get());
    FLAMIA_CUDA_CHECK(cuda::launch_build_work_order(static_cast<const int32_t*>(d_cu.get()), docs, T, true,
                                                    static_cast<order::OrderedTile*>(table.get()),
                                                    static_cast<int*>(counters.get()), nullptr, check));
    int tiles = -1;
    FLAMIA_CUDA_CHECK(cudaMemcpy(&tiles, counters.get(), sizeof tiles, cudaMemcpyDeviceToHost));
    EXPECT_EQ(tiles, 0) << m.name;
    std::vector<int32_t> got(m.cu.size());
    FLAMIA_CUDA_CHECK(cudaMemcpy(got.data(), copy.get(), copy.bytes(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, std::vector<int32_t>(m.cu.size(), 0)) << m.name;
    std::vector<order::OrderedTile> t(static_cast<size_t>(entries));
    FLAMIA_CUDA_CHECK(cudaMemcpy(t.data(), table.get(), table.bytes(), cudaMemcpyDeviceToHost));
    for (const auto& e : t) EXPECT_LT(e.doc, 0) << m.name;
  }
  const std::vector<int32_t> good = {0, 100, 300};
  DeviceBuffer d_cu(12), table(size_t(order::table_entries(300, 2)) * 8), counters(size_t(order::cost_counters(300)) * 4),
      copy(12);
  FLAMIA_CUDA_CHECK(cudaMemcpy(d_cu.get(), good.data(), 12, cudaMemcpyHostToDevice));
  cuda::OffsetsCheck check;
  check.checked_cu_seqlens = static_cast<int32_t*>(copy.get());
  FLAMIA_CUDA_CHECK(cuda::launch_build_work_order(static_cast<const int32_t*>(d_cu.get()), 2, 300, true,
                                                  static_cast<order::OrderedTile*>(table.get()),
                                                  static_cast<int*>(counters.get()), nullptr, check));
  std::vector<int32_t> got(3);
  int tiles = -1;
  FLAMIA_CUDA_CHECK(cudaMemcpy(got.data(), copy.get(), 12, cudaMemcpyDeviceToHost));
  FLAMIA_CUDA_CHECK(cudaMemcpy(&tiles, counters.get(), sizeof tiles, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, good);
  EXPECT_EQ(tiles, 1 + 2) << "one 128-token tile of 100 tokens, two of 200";
}

}  // namespace
}  // namespace flamia::gpu_test
