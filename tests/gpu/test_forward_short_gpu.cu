// The short-document forward (core/short_documents.h, src/cuda/sm90/forward_short.cu) against the
// route it replaces (capi/forward_route.h's kUnfused: the quantization pass, then forward.cu's
// kernel): O and LSE bitwise the same, on documents of every length around the chunk, tile and
// short-document limits, alone and packed with longer documents (which still take the other
// route, next to short ones), for every option the short-document kernel takes, and on inputs
// whose scales jump far within a document, with NaN and Inf among them. That its work list holds
// exactly the short documents, longest first, is checked with the work order builder. (Against
// the emulation and the FP64 reference, the forward suites run it on their own shapes.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "capi/validate.h"
#include "core/short_documents.h"
#include "cuda/schedule/work_order.cuh"
#include "forward_harness.h"

namespace flamia::gpu_test {
namespace {

// Every length around the chunk (32), tile (128) and limit (512) edges; an empty document too.
const std::vector<int> kShortLengths = {1,   17,  31,  32,  33, 63,  64,  65,  127, 128, 129,
                                        200, 0,   255, 256, 257, 383, 384, 385, 500, 511, 512};
// Long documents next to short ones: each long one followed by short ones that its last key tile's
// loads run into (the quantization pass zeroes their transposed V steps), a 513 just over the limit.
const std::vector<int> kMixedLengths = {700, 5, 3, 1, 40, 513, 2, 600, 300, 4097, 64, 129};

struct RouteCase {
  const char* name;
  const std::vector<int>* lengths;
  int q_heads, kv_heads, dim;
  bool causal;
  Isolation isolation;
  ScaleGeometry geometry;
  ScaleRule rule;
  int p_boost_log2;
};

NumericsOptions options_of(const RouteCase& c) {
  NumericsOptions o;
  o.isolation = c.isolation;
  o.scale_geometry = c.geometry;
  o.scale_rule = c.rule;
  o.p_boost_log2 = c.p_boost_log2;
  return o;
}

analysis::ProbeOutputs run_route(const analysis::AttentionInputs& in, const NumericsOptions& opt, bool causal,
                                 capi::ShortDocuments route) {
  ForwardCall call(in, opt, causal);
  call.short_documents = route;
  return call.run();
}

uint64_t bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Bitwise, as the bits of the outputs (NaN included): the first differences, named.
void expect_bitwise(const analysis::ProbeOutputs& fused, const analysis::ProbeOutputs& unfused, const std::string& what) {
  const auto& o = fused.o;
  int reported = 0;
  for (int t = 0; t < o.tokens && reported < 5; ++t)
    for (int h = 0; h < o.heads && reported < 5; ++h)
      for (int f = 0; f < o.dim; ++f)
        if (bits(o.at(t, h, f)) != bits(unfused.o.at(t, h, f))) {
          ADD_FAILURE() << what << ": O differs at token " << t << " head " << h << " feature " << f << ": "
                        << o.at(t, h, f) << " vs " << unfused.o.at(t, h, f);
          ++reported;
          break;
        }
  for (int h = 0; h < fused.lse.heads && reported < 5; ++h)
    for (int t = 0; t < fused.lse.tokens; ++t)
      if (bits(fused.lse.at(h, t)) != bits(unfused.lse.at(h, t))) {
        ADD_FAILURE() << what << ": LSE differs at head " << h << " token " << t << ": " << fused.lse.at(h, t)
                      << " vs " << unfused.lse.at(h, t);
        ++reported;
        break;
      }
}

class ShortDocumentForward : public ::testing::TestWithParam<RouteCase> {};

TEST_P(ShortDocumentForward, IsBitwiseTheQuantizationPassAndForwardKernel) {
  FLAMIA_REQUIRE_GPU();
  const RouteCase c = GetParam();
  const auto in = analysis::random_inputs({*c.lengths, c.q_heads, c.kv_heads, c.dim}, 77);
  const NumericsOptions opt = options_of(c);
  const auto fused = run_route(in, opt, c.causal, capi::ShortDocuments::kFused);
  const auto unfused = run_route(in, opt, c.causal, capi::ShortDocuments::kUnfused);
  expect_bitwise(fused, unfused, c.name);
  for (double x : fused.o.data) ASSERT_TRUE(std::isfinite(x)) << "every output element is written and finite";
}

std::vector<RouteCase> route_cases() {
  using I = Isolation;
  using G = ScaleGeometry;
  using R = ScaleRule;
  return {
      {"mha_d128_causal", &kShortLengths, 4, 4, 128, true, I::kDocument, G::kBlock32, R::kCeil, 8},
      {"mha_d128_causal_mixed", &kMixedLengths, 4, 4, 128, true, I::kDocument, G::kBlock32, R::kCeil, 8},
      {"gqa_d128_token", &kShortLengths, 8, 2, 128, true, I::kDocument, G::kToken, R::kCeil, 8},
      {"mqa_d64_floor", &kShortLengths, 4, 1, 64, true, I::kDocument, G::kBlock32, R::kFloor, 8},
      {"mqa_d64_floor_mixed", &kMixedLengths, 4, 1, 64, true, I::kDocument, G::kBlock32, R::kFloor, 8},
      {"gqa_d64_full", &kShortLengths, 8, 2, 64, false, I::kDocument, G::kBlock32, R::kCeil, 8},
      {"mha_d128_full_token_floor_mixed", &kMixedLengths, 4, 4, 128, false, I::kDocument, G::kToken, R::kFloor, 8},
      {"prefix_token_d128", &kShortLengths, 4, 2, 128, true, I::kPrefix, G::kToken, R::kCeil, 8},
      {"boost4_d128", &kShortLengths, 4, 4, 128, true, I::kDocument, G::kBlock32, R::kCeil, 4},
  };
}

INSTANTIATE_TEST_SUITE_P(Routes, ShortDocumentForward, ::testing::ValuesIn(route_cases()),
                         [](const ::testing::TestParamInfo<RouteCase>& i) { return std::string(i.param.name); });

// Scales that jump far inside a document: every token's Q, K and V rows times its own 2^e (e in
// [-40, 40]), one V group of one document at 2^100 (past the masked tiles' split of the V fold, so
// they fold from the exponents), a NaN in V and an Inf in K of two others: bitwise as well.
TEST(ShortDocumentForward, IsBitwiseWhereScalesJumpAndInputsAreNotFinite) {
  FLAMIA_REQUIRE_GPU();
  const std::vector<int> lengths = {300, 77, 512, 129, 40, 450, 700, 250};
  for (ScaleGeometry geometry : {ScaleGeometry::kBlock32, ScaleGeometry::kToken}) {
    auto in = analysis::random_inputs({lengths, 4, 2, 128}, 31);
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> exponent(-40, 40);
    for (int t = 0; t < in.q.tokens; ++t) {
      const int eq = exponent(rng), ek = exponent(rng), ev = exponent(rng);
      for (int f = 0; f < 128; ++f) {
        for (int h = 0; h < 4; ++h) in.q.at(t, h, f) = std::ldexp(in.q.at(t, h, f), eq);
        for (int h = 0; h < 2; ++h) {
          in.k.at(t, h, f) = std::ldexp(in.k.at(t, h, f), ek);
          in.v.at(t, h, f) = std::ldexp(in.v.at(t, h, f), ev);
        }
      }
    }
    for (int t = 332; t < 364; ++t)  // document 1 (tokens 300 .. 376): its second group of V at 2^100
      for (int f = 0; f < 128; ++f) in.v.at(t, 0, f) = std::ldexp(in.v.at(t, 0, f), 100);
    in.v.at(400, 1, 3) = NAN;       // document 2 (377 .. 888)
    in.k.at(1030, 0, 9) = INFINITY;  // document 4 (1018 .. 1057)
    NumericsOptions opt;
    opt.scale_geometry = geometry;
    const auto fused = run_route(in, opt, true, capi::ShortDocuments::kFused);
    const auto unfused = run_route(in, opt, true, capi::ShortDocuments::kUnfused);
    expect_bitwise(fused, unfused, geometry == ScaleGeometry::kToken ? "token" : "block32");
    EXPECT_TRUE(std::isnan(fused.o.at(420, 2, 0))) << "V's NaN (KV head 1) reaches the rows after it";
  }
}

// Where every document is short (max_seqlen <= the limit) the quantization pass does not run at all:
// the workspace's code regions stay as they were (poisoned here), and the outputs are still bitwise.
TEST(ShortDocumentForward, RunsWithoutTheQuantizationPassWhereEveryDocumentIsShort) {
  FLAMIA_REQUIRE_GPU();
  const auto in = analysis::random_inputs({kShortLengths, 4, 4, 128}, 3);
  ForwardCall call(in, NumericsOptions{}, true);
  FLAMIA_CUDA_CHECK(cudaMemset(call.workspace.get(), 0xA5, call.workspace.bytes()));
  const auto fused = call.run();
  const capi::ForwardWorkspace layout = capi::forward_workspace_layout(
      in.q.tokens, in.q.heads, in.k.heads, in.q.dim, in.docs.count(), false);
  std::vector<uint8_t> codes(layout.q_codes.bytes);
  FLAMIA_CUDA_CHECK(cudaMemcpy(codes.data(), static_cast<uint8_t*>(call.workspace.get()) + layout.q_codes.offset,
                               codes.size(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t b) { return b == 0xA5; }))
      << "Q's codes were written: the quantization pass ran";
  expect_bitwise(fused, run_route(in, NumericsOptions{}, true, capi::ShortDocuments::kUnfused), "all short");
}

// The work order with a short-document list: the list holds exactly the documents of 1 .. limit
// tokens, longest first (by 32-token bucket), and the tile table exactly the others' tiles.
TEST(ShortDocumentForward, WorkListHoldsTheShortDocumentsLongestFirst) {
  FLAMIA_REQUIRE_GPU();
  std::vector<int> lens = kMixedLengths;
  lens.insert(lens.end(), kShortLengths.begin(), kShortLengths.end());
  std::vector<int32_t> cu{0};
  for (int len : lens) cu.push_back(cu.back() + len);
  const int docs = int(lens.size()), total = cu.back();
  const int64_t entries = order::table_entries(total, docs);
  DeviceBuffer d_cu(cu.size() * sizeof(int32_t)), d_table(size_t(entries) * sizeof(order::OrderedTile)),
      d_counters(size_t(order::cost_counters(total)) * sizeof(int)), d_list(size_t(docs) * sizeof(int32_t)),
      d_list_counters(size_t(short_docs::kCostBuckets) * sizeof(int));
  FLAMIA_CUDA_CHECK(cudaMemcpy(d_cu.get(), cu.data(), cu.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  FLAMIA_CUDA_CHECK(cudaMemset(d_list.get(), 0x5a, d_list.bytes()));
  FLAMIA_CUDA_CHECK(cudaMemset(d_list_counters.get(), 0x5a, d_list_counters.bytes()));
  const cuda::ShortDocumentList list{short_docs::kMaxTokens, static_cast<int32_t*>(d_list.get()),
                                     static_cast<int*>(d_list_counters.get())};
  FLAMIA_CUDA_CHECK(cuda::launch_build_work_order(static_cast<const int32_t*>(d_cu.get()), docs, total, true,
                                                  static_cast<order::OrderedTile*>(d_table.get()),
                                                  static_cast<int*>(d_counters.get()), nullptr, list));
  int count = -1, tiles = -1;
  FLAMIA_CUDA_CHECK(cudaMemcpy(&count, d_list_counters.get(), sizeof(int), cudaMemcpyDeviceToHost));
  FLAMIA_CUDA_CHECK(cudaMemcpy(&tiles, d_counters.get(), sizeof(int), cudaMemcpyDeviceToHost));
  std::vector<int32_t> got(static_cast<size_t>(docs));
  FLAMIA_CUDA_CHECK(cudaMemcpy(got.data(), d_list.get(), got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  std::vector<int32_t> expected_docs;
  int expected_tiles = 0;
  for (int d = 0; d < docs; ++d) {
    if (short_docs::is_short(lens[size_t(d)])) expected_docs.push_back(d);
    else expected_tiles += int(slots::ceil_div(lens[size_t(d)], order::kWorkTile));
  }
  ASSERT_EQ(count, int(expected_docs.size()));
  EXPECT_EQ(tiles, expected_tiles) << "the tile table holds the long documents' tiles only";
  got.resize(size_t(count));
  for (int i = 1; i < count; ++i)
    EXPECT_GE(short_docs::cost_bucket(lens[size_t(got[size_t(i) - 1])]), short_docs::cost_bucket(lens[size_t(got[size_t(i)])]))
        << "entry " << i << ": longest first";
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, expected_docs);
}

}  // namespace
}  // namespace flamia::gpu_test
