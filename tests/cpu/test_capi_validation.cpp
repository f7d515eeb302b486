// The C API's host-side validation and workspace layout (no GPU: the descriptors hold fake,
// 16-byte aligned pointers that validation never dereferences).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "capi/validate.h"
#include "core/schedule.h"
#include "flamia/flamia.h"

namespace flamia::capi {
namespace {

void* fake_pointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

flamia_tensor packed(uintptr_t address, int64_t tokens, int64_t heads, int64_t dim) {
  flamia_tensor t{};
  t.data = fake_pointer(address);
  t.dtype = FLAMIA_DTYPE_BF16;
  t.tokens = tokens;
  t.heads = heads;
  t.dim = dim;
  t.stride_token = heads * dim;
  t.stride_head = dim;
  return t;
}

// A workspace layout's regions in order: each aligned, at least need[i] bytes, after the one before
// it, and all inside total bytes.
template <size_t N>
void expect_regions_fit(const WorkspaceRegion (&regions)[N], const size_t (&need)[N], size_t total) {
  size_t end = 0;
  for (size_t i = 0; i < N; ++i) {
    EXPECT_EQ(regions[i].offset % kWorkspaceAlignment, 0u) << i;
    EXPECT_GE(regions[i].bytes, need[i]) << i;
    EXPECT_GE(regions[i].offset, end) << i << ": regions must not overlap";
    end = regions[i].offset + regions[i].bytes;
  }
  EXPECT_LE(end, total);
}

// A valid call: 3 documents of 5, 0 and 9 tokens, GQA 4 query heads over 2 K/V heads, D = 64.
struct Call {
  static constexpr int64_t T = 14, Hq = 4, Hkv = 2, D = 64;
  flamia_tensor q = packed(0x10000, T, Hq, D);
  flamia_tensor k = packed(0x20000, T, Hkv, D);
  flamia_tensor v = packed(0x30000, T, Hkv, D);
  flamia_tensor o = packed(0x40000, T, Hq, D);
  std::vector<int32_t> cu_host{0, 5, 5, 14};
  flamia_documents docs{};
  flamia_options options{};
  float* lse = static_cast<float*>(fake_pointer(0x50000));

  Call() {
    docs.cu_seqlens = static_cast<const int32_t*>(fake_pointer(0x60000));
    docs.cu_seqlens_host = cu_host.data();
    docs.num_docs = 3;
    docs.max_seqlen = 9;
    flamia_default_options(&options);
  }
  CallError validate() const { return validate_forward(&q, &k, &v, &docs, &options, &o, lse); }
  // Moves q, k, v, o and lse 2^40 bytes apart, so that huge shapes do not overlap each other.
  void spread() {
    for (auto [t, at] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&o, 4}}) t->data = fake_pointer(uintptr_t(at) << 40);
    lse = static_cast<float*>(fake_pointer(uintptr_t(5) << 40));
  }
};

struct BackwardCall : Call {
  flamia_tensor dout = packed(0x70000, T, Hq, D);
  flamia_tensor dq = packed(0x80000, T, Hq, D);
  flamia_tensor dk = packed(0x90000, T, Hkv, D);
  flamia_tensor dv = packed(0xA0000, T, Hkv, D);
  CallError validate() const { return validate_backward(&q, &k, &v, &o, lse, &dout, &docs, &options, &dq, &dk, &dv); }
};

::testing::AssertionResult Fails(const CallError& e, flamia_status status, const std::string& needle) {
  if (e.status != status) {
    return ::testing::AssertionFailure() << "status " << flamia_status_name(e.status) << ", expected "
                                         << flamia_status_name(status) << " (message: " << e.message << ")";
  }
  if (e.message.find(needle) == std::string::npos)
    return ::testing::AssertionFailure() << "message \"" << e.message << "\" does not name \"" << needle << "\"";
  return ::testing::AssertionSuccess();
}

constexpr flamia_status kInvalid = FLAMIA_ERROR_INVALID_ARGUMENT;
constexpr flamia_status kNotSupported = FLAMIA_ERROR_NOT_SUPPORTED;

TEST(CapiValidation, DefaultOptionsAndStatusNames) {
  flamia_options o;
  std::memset(&o, 0x7f, sizeof o);
  flamia_default_options(&o);
  EXPECT_EQ(o.causal, 1);
  EXPECT_EQ(o.softmax_scale, 0.0f);
  EXPECT_EQ(o.isolation, FLAMIA_ISOLATION_DOCUMENT);
  EXPECT_EQ(o.scale_geometry, FLAMIA_SCALE_BLOCK32);
  EXPECT_EQ(o.scale_rule, FLAMIA_SCALE_RULE_CEIL);
  EXPECT_EQ(o.p_boost_log2, 8);
  flamia_default_options(nullptr);  // no-op
  EXPECT_STREQ(flamia_status_name(FLAMIA_SUCCESS), "FLAMIA_SUCCESS");
  EXPECT_STREQ(flamia_status_name(FLAMIA_ERROR_INVALID_ARGUMENT), "FLAMIA_ERROR_INVALID_ARGUMENT");
  EXPECT_STREQ(flamia_status_name(FLAMIA_ERROR_NOT_SUPPORTED), "FLAMIA_ERROR_NOT_SUPPORTED");
  EXPECT_STREQ(flamia_status_name(FLAMIA_ERROR_WORKSPACE), "FLAMIA_ERROR_WORKSPACE");
  EXPECT_STREQ(flamia_status_name(FLAMIA_ERROR_CUDA), "FLAMIA_ERROR_CUDA");
  EXPECT_STREQ(flamia_status_name(static_cast<flamia_status>(42)), "FLAMIA_UNKNOWN_STATUS");
}

TEST(CapiValidation, ValidCallsPass) {
  Call c;
  EXPECT_TRUE(c.validate().ok()) << c.validate().message;

  Call d128;  // D = 128, MHA, non-causal, explicit scale, prefix isolation off, floor rule, token scales
  d128.q = packed(0x10000, Call::T, 2, 128);
  d128.k = packed(0x20000, Call::T, 2, 128);
  d128.v = packed(0x30000, Call::T, 2, 128);
  d128.o = packed(0x40000, Call::T, 2, 128);
  d128.options.causal = 0;
  d128.options.softmax_scale = 0.1f;
  d128.options.scale_rule = FLAMIA_SCALE_RULE_FLOOR;
  d128.options.scale_geometry = FLAMIA_SCALE_TOKEN;
  d128.options.p_boost_log2 = 0;
  EXPECT_TRUE(d128.validate().ok()) << d128.validate().message;

  Call prefix;
  prefix.options.isolation = FLAMIA_ISOLATION_PREFIX;
  EXPECT_TRUE(prefix.validate().ok()) << prefix.validate().message;

  Call no_host;  // without the host copy only the scalars are checked
  no_host.docs.cu_seqlens_host = nullptr;
  EXPECT_TRUE(no_host.validate().ok());

  Call padded;  // padded strides, a packed qkv-like layout, o in [H, T, D] order
  padded.q.stride_token = 3 * Call::Hq * Call::D;
  padded.k.stride_head = 2 * Call::D;
  padded.k.stride_token = 8 * Call::D;
  padded.o.stride_token = Call::D;
  padded.o.stride_head = Call::T * Call::D;
  EXPECT_TRUE(padded.validate().ok()) << padded.validate().message;

  Call max_seqlen_larger;  // max_seqlen only needs to bound the longest document
  max_seqlen_larger.docs.max_seqlen = Call::T;
  EXPECT_TRUE(max_seqlen_larger.validate().ok());
}

TEST(CapiValidation, NullArguments) {
  Call c;
  EXPECT_TRUE(Fails(validate_forward(nullptr, &c.k, &c.v, &c.docs, &c.options, &c.o, c.lse), kInvalid, "q is NULL"));
  EXPECT_TRUE(Fails(validate_forward(&c.q, nullptr, &c.v, &c.docs, &c.options, &c.o, c.lse), kInvalid, "k is NULL"));
  EXPECT_TRUE(Fails(validate_forward(&c.q, &c.k, nullptr, &c.docs, &c.options, &c.o, c.lse), kInvalid, "v is NULL"));
  EXPECT_TRUE(Fails(validate_forward(&c.q, &c.k, &c.v, nullptr, &c.options, &c.o, c.lse), kInvalid, "docs is NULL"));
  EXPECT_TRUE(Fails(validate_forward(&c.q, &c.k, &c.v, &c.docs, nullptr, &c.o, c.lse), kInvalid, "options is NULL"));
  EXPECT_TRUE(Fails(validate_forward(&c.q, &c.k, &c.v, &c.docs, &c.options, nullptr, c.lse), kInvalid, "o is NULL"));
  EXPECT_TRUE(Fails(validate_forward(&c.q, &c.k, &c.v, &c.docs, &c.options, &c.o, nullptr), kInvalid, "lse is NULL"));
  for (flamia_tensor Call::*t : {&Call::q, &Call::k, &Call::v, &Call::o}) {
    Call b;
    (b.*t).data = nullptr;
    EXPECT_TRUE(Fails(b.validate(), kInvalid, ".data is NULL"));
  }
  Call d;
  d.docs.cu_seqlens = nullptr;
  EXPECT_TRUE(Fails(d.validate(), kInvalid, "docs.cu_seqlens"));
}

TEST(CapiValidation, Dtypes) {
  Call c;
  c.q.dtype = FLAMIA_DTYPE_FP16;
  EXPECT_TRUE(Fails(c.validate(), kInvalid, "q.dtype"));
  EXPECT_TRUE(Fails(c.validate(), kInvalid, "FLAMIA_DTYPE_FP16"));
  Call o;
  o.o.dtype = FLAMIA_DTYPE_FP32;
  EXPECT_TRUE(Fails(o.validate(), kInvalid, "o.dtype"));
  Call bogus;
  bogus.v.dtype = static_cast<flamia_dtype>(9);
  EXPECT_TRUE(Fails(bogus.validate(), kInvalid, "v.dtype"));
}

TEST(CapiValidation, Shapes) {
  {
    Call c;
    c.q.tokens = c.k.tokens = c.v.tokens = c.o.tokens = 0;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "q.tokens"));
  }
  {
    Call c;
    c.k.tokens = Call::T - 1;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "k.tokens"));
  }
  {
    Call c;
    c.v.tokens = Call::T + 1;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "v.tokens"));
  }
  {
    Call c;
    c.o.tokens = Call::T + 1;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o.tokens"));
  }
  {
    Call c;
    c.k.heads = 0;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "k.heads"));
  }
  {
    Call c;  // k and v must share heads
    c.v = packed(0x30000, Call::T, 1, Call::D);
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "v.heads"));
  }
  {
    Call c;  // 4 query heads over 3 K/V heads
    c.k = packed(0x20000, Call::T, 3, Call::D);
    c.v = packed(0x30000, Call::T, 3, Call::D);
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "k.heads"));
  }
  {
    Call c;
    c.o.heads = Call::Hkv;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o.heads"));
  }
  {
    Call c;
    c.k.dim = 128;
    c.k.stride_head = 128;
    c.k.stride_token = 256;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "k.dim"));
  }
  {
    Call c;
    c.o.dim = 32;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o.dim"));
  }
}

TEST(CapiValidation, UnsupportedHeadDimAndSizes) {
  for (int64_t d : {32, 96, 256, 80}) {
    Call c;
    c.q = packed(0x10000, Call::T, Call::Hq, d);
    c.k = packed(0x20000, Call::T, Call::Hkv, d);
    c.v = packed(0x30000, Call::T, Call::Hkv, d);
    c.o = packed(0x40000, Call::T, Call::Hq, d);
    EXPECT_TRUE(Fails(c.validate(), kNotSupported, "head_dim")) << d;
  }
  {
    // An invalid argument outranks an unsupported head dim.
    Call c;
    c.q = packed(0x10000, Call::T, Call::Hq, 96);
    c.k = packed(0x20000, Call::T, Call::Hkv, 96);
    c.v = packed(0x30000, Call::T, Call::Hkv, 96);
    c.o = packed(0x40000, Call::T, Call::Hq, 96);
    c.options.causal = 3;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "options.causal"));
  }
  {
    // 2^31 elements: T * H * D overflows the kernels' int32 indexing.
    Call c;
    const int64_t T = (int64_t(1) << 31) / (Call::Hq * Call::D);
    c.q.tokens = c.k.tokens = c.v.tokens = c.o.tokens = T;
    c.docs.cu_seqlens_host = nullptr;
    c.spread();
    EXPECT_TRUE(Fails(c.validate(), kNotSupported, "2^31 - 1")) << c.validate().message;
    EXPECT_TRUE(Fails(c.validate(), kNotSupported, "q has tokens * heads * dim"));
    c.q.tokens = c.k.tokens = c.v.tokens = c.o.tokens = T - 1;  // just fits
    EXPECT_TRUE(c.validate().ok()) << c.validate().message;
  }
  {
    // Absurd shapes overflow int64 and still fail cleanly.
    Call c;
    const int64_t huge = int64_t(1) << 60;
    c.q.tokens = c.k.tokens = c.v.tokens = c.o.tokens = huge;
    c.q.stride_token = c.o.stride_token = Call::Hq * Call::D;
    c.q.heads = c.o.heads = 4;
    c.docs.cu_seqlens_host = nullptr;
    // The call: q's stride x extent wraps int64 (an invalid descriptor); the size query reads
    // shapes only and finds them over the kernels' limits.
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "q spans")) << c.validate().message;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "wraps int64"));
    size_t bytes = 1;
    flamia_error err;
    EXPECT_EQ(flamia_forward_workspace_size(&c.q, &c.k, &c.v, &c.docs, &c.options, &bytes, &err), kNotSupported);
    EXPECT_EQ(bytes, 0u);
  }
  {
    Call c;
    c.q = packed(0x10000, Call::T, 65536, Call::D);
    c.o = packed(0x40000, Call::T, 65536, Call::D);
    c.spread();
    EXPECT_TRUE(Fails(c.validate(), kNotSupported, "q.heads"));
  }
}

TEST(CapiValidation, StridesAndAlignment) {
  {
    Call c;
    c.q.data = fake_pointer(0x10008);
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "q.data must be 16-byte aligned"));
  }
  {
    Call c;
    c.o.data = fake_pointer(0x40002);
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o.data"));
  }
  {
    Call c;
    c.k.stride_head = Call::D - 8;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "k.stride_head"));
  }
  {
    Call c;
    c.v.stride_token = 0;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "v.stride_token"));
  }
  {
    Call c;
    c.v.stride_token = -Call::Hkv * Call::D;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "v.stride_token"));
  }
  {
    Call c;  // 16-byte rows need strides that are multiples of 8 BF16 elements
    c.q.stride_token = Call::Hq * Call::D + 4;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "q.stride_token"));
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "multiple of 8"));
  }
  {
    Call c;  // inputs may overlap (read only): k and v both heads-interleaved with one token stride
    c.k.stride_token = Call::D;
    EXPECT_TRUE(c.validate().ok()) << c.validate().message;
  }
  {
    Call c;  // output rows must not overlap
    c.o.stride_token = Call::D;
    c.o.stride_head = Call::D;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o.stride_token"));
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "overlap"));
  }
  {
    Call c;
    c.o.stride_token = (Call::Hq - 1) * Call::D;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o.heads * o.stride_head"));
  }
  {
    Call c;
    c.lse = static_cast<float*>(fake_pointer(0x50002));
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "lse"));
  }
  {
    Call c;
    c.docs.cu_seqlens = static_cast<const int32_t*>(fake_pointer(0x60001));
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "docs.cu_seqlens must be 4-byte aligned"));
  }
}

// Outputs must not alias each other or an input; tensors interleaved in one buffer without
// sharing an element are fine.
TEST(CapiValidation, AliasingOutputsAreRefused) {
  {
    Call c;  // o is q
    c.o.data = c.q.data;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o and q share memory"));
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "an output must not overlap an input"));
  }
  {
    Call c;  // lse inside o
    c.lse = static_cast<float*>(fake_pointer(0x40000 + 1024));
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o and lse share memory"));
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "outputs must not alias each other"));
  }
  {
    Call c;  // lse just past o's last row: no overlap
    c.lse = static_cast<float*>(fake_pointer(0x40000 + Call::T * Call::Hq * Call::D * 2));
    EXPECT_TRUE(c.validate().ok()) << c.validate().message;
  }
  {
    Call c;  // o's last row reaches into v's first one
    c.o.data = fake_pointer(0x30000 - (Call::T * Call::Hq * Call::D * 2) + 16);
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o and v share memory"));
  }
  {
    // q, k, v interleaved in one [T, Hq + 2 Hkv, D] buffer and o interleaved with them in the gaps
    // of a wider one: no element is shared.
    Call c;
    const int64_t heads = Call::Hq + 2 * Call::Hkv + Call::Hq, row = heads * Call::D;
    for (auto [t, first_head] : {std::pair{&c.q, int64_t(0)}, {&c.k, Call::Hq}, {&c.v, Call::Hq + Call::Hkv},
                                 {&c.o, Call::Hq + 2 * Call::Hkv}}) {
      t->data = fake_pointer(0x100000 + first_head * Call::D * 2);
      t->stride_token = row;
    }
    EXPECT_TRUE(c.validate().ok()) << c.validate().message;
    c.o.data = fake_pointer(0x100000 + (Call::Hq + 2 * Call::Hkv - 1) * Call::D * 2);  // one head back: onto v
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o and v share memory")) << c.validate().message;
  }
  {
    BackwardCall b;  // dq == dk == dv
    b.dq = packed(0x80000, Call::T, Call::Hkv, Call::D);
    b.dq.heads = Call::Hq;
    b.dq.stride_token = Call::Hq * Call::D;
    b.dk.data = b.dv.data = b.dq.data;
    EXPECT_TRUE(Fails(b.validate(), kInvalid, "dq and dk share memory"));
  }
  {
    BackwardCall b;  // dk == dv
    b.dv.data = b.dk.data;
    EXPECT_TRUE(Fails(b.validate(), kInvalid, "dk and dv share memory"));
  }
  for (const char* input : {"o", "lse", "dout", "q", "k", "v"}) {
    BackwardCall b;  // dq written over an input
    const uintptr_t at = std::string(input) == "o"      ? 0x40000
                         : std::string(input) == "lse"  ? 0x50000
                         : std::string(input) == "dout" ? 0x70000
                         : std::string(input) == "q"    ? 0x10000
                         : std::string(input) == "k"    ? 0x20000
                                                        : 0x30000;
    b.dq.data = fake_pointer(at);
    EXPECT_TRUE(Fails(b.validate(), kInvalid, std::string("dq and ") + input + " share memory")) << input;
  }
  {
    // dq, dk, dv interleaved in one [T, Hq + 2 Hkv, D] gradient buffer: valid.
    BackwardCall b;
    const int64_t row = (Call::Hq + 2 * Call::Hkv) * Call::D;
    for (auto [t, first_head] : {std::pair{&b.dq, int64_t(0)}, {&b.dk, Call::Hq}, {&b.dv, Call::Hq + Call::Hkv}}) {
      t->data = fake_pointer(0x200000 + first_head * Call::D * 2);
      t->stride_token = row;
    }
    EXPECT_TRUE(b.validate().ok()) << b.validate().message;
  }
  {
    // From saved codes, q, k and v are shapes only: NULL data does not alias anything.
    BackwardCall b;
    b.q.data = b.k.data = b.v.data = nullptr;
    EXPECT_TRUE(validate_backward(&b.q, &b.k, &b.v, &b.o, b.lse, &b.dout, &b.docs, &b.options, &b.dq, &b.dk, &b.dv,
                                  QkvCodes::kSaved)
                    .ok());
  }
}

// A descriptor whose stride x extent wraps int64 (or the address space) is refused by name.
TEST(CapiValidation, StrideTimesExtentMustNotWrap) {
  {
    Call c;
    c.k.stride_token = int64_t(1) << 62;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "k spans")) << c.validate().message;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "wraps int64"));
  }
  {
    Call c;
    c.o.stride_token = int64_t(1) << 60;  // (14 - 1) * 2^60 wraps
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "o spans")) << c.validate().message;
  }
  {
    Call c;  // fits int64 but runs past the end of the address space
    c.q.data = fake_pointer(UINTPTR_MAX - 0xFFF);  // 4 KiB left, q spans 7 KiB
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "q spans")) << c.validate().message;
  }
}

TEST(CapiValidation, Documents) {
  {
    Call c;
    c.docs.num_docs = 0;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "num_docs"));
  }
  for (int32_t m : {0, -1, int32_t(Call::T) + 1}) {
    Call c;
    c.docs.max_seqlen = m;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "max_seqlen")) << m;
  }
  {
    Call c;  // shorter than the longest document (9 tokens, document 2)
    c.docs.max_seqlen = 8;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "max_seqlen"));
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "longest document (9"));
  }
  {
    Call c;  // non-monotone
    c.cu_host = {0, 5, 4, 14};
    c.docs.cu_seqlens_host = c.cu_host.data();
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "cu_seqlens_host[2]"));
  }
  {
    Call c;  // out of range in the middle: the entry past the end is named, not the decrease after it
    c.cu_host = {0, 20, 5, 14};
    c.docs.cu_seqlens_host = c.cu_host.data();
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "docs.cu_seqlens_host[1] = 20 lies past the end of the 14 packed tokens"));
  }
  {
    Call c;  // negative
    c.cu_host = {0, -3, 5, 14};
    c.docs.cu_seqlens_host = c.cu_host.data();
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "cu_seqlens_host[1]"));
  }
  {
    Call c;
    c.cu_host = {1, 5, 5, 14};
    c.docs.cu_seqlens_host = c.cu_host.data();
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "cu_seqlens_host[0]"));
  }
  {
    Call c;  // wrong end
    c.cu_host = {0, 5, 5, 13};
    c.docs.cu_seqlens_host = c.cu_host.data();
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "cu_seqlens_host[3]"));
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "14"));
  }
  {
    Call c;  // num_docs covers only the first two documents: the host copy then ends at 5, not 14
    c.docs.num_docs = 2;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "cu_seqlens_host[2]"));
  }
}

TEST(CapiValidation, Options) {
  {
    Call c;
    c.options.causal = 2;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "options.causal"));
  }
  for (float s : {-1.0f, -0.0f, -1e-40f, std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    Call c;
    c.options.softmax_scale = s;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "options.softmax_scale")) << s;
  }
  for (float s : {0.0f, 1e-30f, 0.125f}) {  // +0 is the default; any positive finite value is taken as is
    Call c;
    c.options.softmax_scale = s;
    EXPECT_TRUE(c.validate().ok()) << s << ": " << c.validate().message;
  }
  {
    Call c;
    c.options.isolation = static_cast<flamia_isolation>(2);
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "options.isolation"));
  }
  {
    Call c;
    c.options.scale_geometry = static_cast<flamia_scale_geometry>(-1);
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "options.scale_geometry"));
  }
  {
    Call c;
    c.options.scale_rule = static_cast<flamia_scale_rule>(7);
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "options.scale_rule"));
  }
  for (int boost : {-1, 9}) {
    Call c;
    c.options.p_boost_log2 = boost;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "p_boost_log2")) << boost;
  }
  {
    Call c;  // prefix isolation needs the causal mask
    c.options.isolation = FLAMIA_ISOLATION_PREFIX;
    c.options.causal = 0;
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "isolation"));
    EXPECT_TRUE(Fails(c.validate(), kInvalid, "causal"));
  }
}

TEST(CapiValidation, AttentionOptionsMapping) {
  flamia_options o;
  flamia_default_options(&o);
  AttentionOptions a = attention_options(o);
  EXPECT_TRUE(a.shape.causal);
  EXPECT_EQ(a.shape.softmax_scale, 0.0);
  NumericsOptions n = a.numerics;
  EXPECT_EQ(n.isolation, Isolation::kDocument);
  EXPECT_EQ(n.effective_geometry(), ScaleGeometry::kBlock32);
  EXPECT_EQ(n.scale_rule, ScaleRule::kCeil);
  EXPECT_EQ(n.p_boost_log2, FLAMIA_P_BOOST_LOG2_DEFAULT);
  EXPECT_EQ(n.dq_reduction, DqReduction::kFp16Partials);
  o.isolation = FLAMIA_ISOLATION_PREFIX;
  o.scale_rule = FLAMIA_SCALE_RULE_FLOOR;
  o.p_boost_log2 = 3;
  o.causal = 0;
  o.softmax_scale = 0.25f;
  o.deterministic = 1;
  a = attention_options(o);
  n = a.numerics;
  EXPECT_FALSE(a.shape.causal);
  EXPECT_EQ(a.shape.softmax_scale, 0.25);
  EXPECT_EQ(n.isolation, Isolation::kPrefix);
  EXPECT_EQ(n.effective_geometry(), ScaleGeometry::kToken);  // prefix isolation forces per-token scales
  EXPECT_EQ(n.scale_rule, ScaleRule::kFloor);
  EXPECT_EQ(n.p_boost_log2, 3);
  EXPECT_EQ(n.dq_reduction, DqReduction::kDeterministic);
  o.isolation = FLAMIA_ISOLATION_DOCUMENT;
  o.scale_geometry = FLAMIA_SCALE_TOKEN;
  EXPECT_EQ(attention_options(o).numerics.effective_geometry(), ScaleGeometry::kToken);
}

// flamia_options has no field for the emulation-only numerics: every C combination converts with
// them at their defaults, so no C call can select the route, the U squares or the rotation.
TEST(CapiValidation, COptionsNeverSelectEmulationOnlyNumerics) {
  for (flamia_isolation iso : {FLAMIA_ISOLATION_DOCUMENT, FLAMIA_ISOLATION_PREFIX})
    for (flamia_scale_geometry geo : {FLAMIA_SCALE_BLOCK32, FLAMIA_SCALE_TOKEN})
      for (flamia_scale_rule rule : {FLAMIA_SCALE_RULE_CEIL, FLAMIA_SCALE_RULE_FLOOR})
        for (int flag : {0, 1}) {
          flamia_options o;
          flamia_default_options(&o);
          o.isolation = iso, o.scale_geometry = geo, o.scale_rule = rule, o.causal = flag, o.deterministic = flag;
          const NumericsOptions n = attention_options(o).numerics;
          EXPECT_FALSE(n.emulation_only());
          EXPECT_EQ(n.route, Route::kMxfp8);
          EXPECT_EQ(n.u_scale, UScaleGeometry::kRowCol);
          EXPECT_FALSE(n.hadamard);
        }
  NumericsOptions n;
  EXPECT_FALSE(n.emulation_only());
  n.hadamard = true;
  EXPECT_TRUE(n.emulation_only());
}

// The message for a bad C enum value lists the header's constants from the core table.
TEST(CapiValidation, BadEnumMessageListsTheConstants) {
  Call c;
  c.options.scale_geometry = static_cast<flamia_scale_geometry>(5);
  EXPECT_TRUE(Fails(c.validate(), kInvalid,
                    "options.scale_geometry must be FLAMIA_SCALE_BLOCK32 (0) or FLAMIA_SCALE_TOKEN (1), got 5"));
  Call d;
  d.options.isolation = static_cast<flamia_isolation>(-3);
  EXPECT_TRUE(Fails(d.validate(), kInvalid,
                    "options.isolation must be FLAMIA_ISOLATION_DOCUMENT (0) or FLAMIA_ISOLATION_PREFIX (1), got -3"));
}

TEST(CapiValidation, WorkspaceLayout) {
  for (const auto& [T, Hq, Hkv, D, docs] : std::vector<std::array<int64_t, 5>>{
           {1, 1, 1, 64, 1}, {14, 4, 2, 64, 3}, {1000, 32, 8, 128, 7}, {777, 6, 3, 128, 777}, {3, 65535, 1, 64, 2}}) {
    const ForwardWorkspace w = forward_workspace_layout(T, Hq, Hkv, D, docs, false);
    const ForwardWorkspace again = forward_workspace_layout(T, Hq, Hkv, D, docs, false);
    EXPECT_EQ(w.total, again.total);
    EXPECT_EQ(w.total % kWorkspaceAlignment, 0u);
    EXPECT_EQ(w.q_codes_t.bytes + w.k_codes_t.bytes + w.v_codes.bytes, 0u) << "layouts the forward does not read";
    const WorkspaceRegion regions[] = {w.q_codes,    w.k_codes,      w.v_codes_t,  w.q_scales,
                                       w.k_scales,   w.v_scales,     w.v_fold_ref, w.work_counter,
                                       w.work_order, w.work_order_counters, w.checked_cu_seqlens};
    // V's transposed codes: every document padded to whole 32-token steps, plus a step each.
    const size_t vt = size_t(Hkv * D) * size_t(32 * ((T + 31) / 32 + docs));
    // The work order: an entry per 128-token tile slot, a counter per cost 0 .. ceil(T / 128).
    const size_t order_entries = size_t((T + 127) / 128 + docs), costs = size_t((T + 127) / 128 + 1);
    const size_t need[] = {size_t(T * Hq * D), size_t(T * Hkv * D), vt,
                           size_t(T * Hq),     size_t(T * Hkv),     size_t(T * Hkv),
                           size_t(T * Hkv),    sizeof(int32_t),     order_entries * sizeof(order::OrderedTile),
                           costs * sizeof(int32_t), size_t(docs + 1) * sizeof(int32_t)};
    expect_regions_fit(regions, need, w.total);

    // The size query returns the same layout.
    flamia_tensor q = packed(0x10000, T, Hq, D), k = packed(0x20000, T, Hkv, D), v = packed(0x30000, T, Hkv, D);
    flamia_documents d{};
    d.num_docs = int32_t(docs);
    flamia_options opt;
    flamia_default_options(&opt);
    size_t bytes = 0;
    flamia_error err;
    ASSERT_EQ(flamia_forward_workspace_size(&q, &k, &v, &d, &opt, &bytes, &err), FLAMIA_SUCCESS) << err.message;
    EXPECT_STREQ(err.message, "");
    EXPECT_EQ(bytes, w.total);
    // The data pointers and cu_seqlens do not matter to the size query.
    q.data = k.data = v.data = nullptr;
    size_t bytes2 = 0;
    EXPECT_EQ(flamia_forward_workspace_size(&q, &k, &v, &d, &opt, &bytes2, nullptr), FLAMIA_SUCCESS);
    EXPECT_EQ(bytes2, bytes);
  }
}

TEST(CapiValidation, WorkspaceSizeQueryErrors) {
  Call c;
  size_t bytes = 0;
  flamia_error err;
  EXPECT_EQ(flamia_forward_workspace_size(&c.q, &c.k, &c.v, &c.docs, &c.options, nullptr, &err), kInvalid);
  EXPECT_NE(std::string(err.message).find("bytes"), std::string::npos);
  EXPECT_EQ(flamia_forward_workspace_size(nullptr, &c.k, &c.v, &c.docs, &c.options, &bytes, &err), kInvalid);
  EXPECT_NE(std::string(err.message).find("q is NULL"), std::string::npos);
  EXPECT_EQ(flamia_forward_workspace_size(&c.q, &c.k, &c.v, nullptr, &c.options, &bytes, &err), kInvalid);
  EXPECT_NE(std::string(err.message).find("docs is NULL"), std::string::npos);
  flamia_documents no_docs = c.docs;
  no_docs.num_docs = 0;
  EXPECT_EQ(flamia_forward_workspace_size(&c.q, &c.k, &c.v, &no_docs, &c.options, &bytes, &err), kInvalid);
  EXPECT_NE(std::string(err.message).find("docs.num_docs"), std::string::npos);
  EXPECT_EQ(flamia_backward_workspace_size(&c.q, &c.k, &c.v, &no_docs, &c.options, &bytes, &err), kInvalid);
  EXPECT_NE(std::string(err.message).find("docs.num_docs"), std::string::npos);
  c.q.dtype = FLAMIA_DTYPE_FP32;
  EXPECT_EQ(flamia_forward_workspace_size(&c.q, &c.k, &c.v, &c.docs, &c.options, &bytes, &err), kInvalid);
  EXPECT_NE(std::string(err.message).find("q.dtype"), std::string::npos);
  Call g;
  g.k = packed(0x20000, Call::T, 3, Call::D);
  g.v = packed(0x30000, Call::T, 3, Call::D);
  EXPECT_EQ(flamia_forward_workspace_size(&g.q, &g.k, &g.v, &g.docs, &g.options, &bytes, &err), kInvalid);
  EXPECT_NE(std::string(err.message).find("k.heads"), std::string::npos);
  Call d;
  d.q.dim = d.k.dim = d.v.dim = 96;
  EXPECT_EQ(flamia_forward_workspace_size(&d.q, &d.k, &d.v, &d.docs, &d.options, &bytes, &err), kNotSupported);
  EXPECT_NE(std::string(err.message).find("head_dim"), std::string::npos);
  // The size depends on the options (prefix isolation encodes K and V twice): they are checked too.
  Call o;
  EXPECT_EQ(flamia_forward_workspace_size(&o.q, &o.k, &o.v, &o.docs, nullptr, &bytes, &err), kInvalid);
  EXPECT_NE(std::string(err.message).find("options is NULL"), std::string::npos);
  flamia_options bad = o.options;
  bad.isolation = static_cast<flamia_isolation>(7);
  EXPECT_EQ(flamia_saved_codes_size(&o.q, &o.k, &o.v, &o.docs, &bad, &bytes, &err), kInvalid);
  EXPECT_NE(std::string(err.message).find("options.isolation"), std::string::npos);
}

// Prefix isolation with block32 geometry encodes K and V a second time (the interior codes): each
// layout gets their regions in the code layouts its call reads (the forward K rows and V
// transposed; the backward K and V rows and K transposed; the saved codes both), apart from the
// others, and the size queries take them from the options.
TEST(CapiValidation, InteriorCodesRegions) {
  const int64_t T = 1000, Hq = 8, Hkv = 2, D = 128, docs = 9;
  const size_t slots = size_t(32 * ((T + 31) / 32 + docs));
  const size_t rows = size_t(T * Hkv * D), transposed = size_t(Hkv * D) * slots, scales = size_t(T * Hkv);
  auto disjoint = [](std::vector<WorkspaceRegion> regions, size_t total) {
    std::sort(regions.begin(), regions.end(), [](auto& a, auto& b) { return a.offset < b.offset; });
    size_t end = 0;
    for (const auto& r : regions) {
      if (r.bytes == 0) continue;
      EXPECT_EQ(r.offset % kWorkspaceAlignment, 0u);
      EXPECT_GE(r.offset, end) << "regions must not overlap";
      end = r.offset + r.bytes;
    }
    EXPECT_LE(end, total);
  };
  const ForwardWorkspace f = forward_workspace_layout(T, Hq, Hkv, D, docs, true);
  const ForwardWorkspace f0 = forward_workspace_layout(T, Hq, Hkv, D, docs, false);
  EXPECT_GE(f.k_interior_codes.bytes, rows);
  EXPECT_GE(f.v_interior_codes_t.bytes, transposed);
  EXPECT_GE(f.k_interior_scales.bytes, scales);
  EXPECT_GE(f.v_interior_scales.bytes, scales);
  EXPECT_EQ(f.k_interior_codes_t.bytes + f.v_interior_codes.bytes, 0u) << "layouts the forward does not read";
  for (const auto& r : {f0.k_interior_codes, f0.v_interior_codes_t, f0.k_interior_scales, f0.v_interior_scales})
    EXPECT_EQ(r.bytes, 0u);
  EXPECT_GE(f.total, f0.total + rows + transposed + 2 * scales);
  disjoint({f.q_codes, f.k_codes, f.v_codes_t, f.q_scales, f.k_scales, f.v_scales, f.k_interior_codes,
            f.v_interior_codes_t, f.k_interior_scales, f.v_interior_scales, f.v_fold_ref, f.work_counter,
            f.work_order, f.work_order_counters, f.checked_cu_seqlens},
           f.total);
  const BackwardWorkspace b = backward_workspace_layout(T, Hq, Hkv, D, docs, true);
  EXPECT_GE(b.k_interior_codes.bytes, rows);
  EXPECT_GE(b.v_interior_codes.bytes, rows);
  EXPECT_GE(b.k_interior_codes_t.bytes, transposed);
  EXPECT_EQ(b.v_interior_codes_t.bytes, 0u) << "a layout the backward does not read";
  disjoint({b.q_codes, b.k_codes, b.v_codes, b.g_codes, b.q_codes_t, b.k_codes_t, b.g_codes_t, b.q_scales,
            b.k_scales, b.v_scales, b.g_scales, b.k_interior_codes, b.v_interior_codes, b.k_interior_codes_t,
            b.k_interior_scales, b.v_interior_scales, b.g_scale_prefix_max, b.delta, b.work_counter, b.work_order,
            b.work_order_counters, b.checked_cu_seqlens},
           b.total);
  const SavedCodes s = saved_codes_layout(T, Hq, Hkv, D, docs, true);
  const SavedCodes s0 = saved_codes_layout(T, Hq, Hkv, D, docs, false);
  EXPECT_GE(s.total, s0.total + 2 * rows + 2 * transposed + 2 * scales);
  disjoint({s.q_codes, s.k_codes, s.v_codes, s.q_codes_t, s.k_codes_t, s.v_codes_t, s.q_scales, s.k_scales,
            s.v_scales, s.k_interior_codes, s.v_interior_codes, s.k_interior_codes_t, s.v_interior_codes_t,
            s.k_interior_scales, s.v_interior_scales},
           s.total);
  // The kernels reach K's and V's interior scales with one shift from their other scales.
  auto one_shift = [](const auto& l) {
    const int64_t shift = interior_scales_shift(l);
    EXPECT_GT(shift, 0);
    EXPECT_EQ(int64_t(l.k_interior_scales.offset) - int64_t(l.k_scales.offset), shift);
    EXPECT_EQ(int64_t(l.v_interior_scales.offset) - int64_t(l.v_scales.offset), shift);
  };
  one_shift(f);
  one_shift(b);
  one_shift(s);
  EXPECT_EQ(interior_scales_shift(f0), 0);
  EXPECT_EQ(interior_scales_shift(s0), 0);
  // With saved codes the workspaces hold none of them.
  EXPECT_EQ(forward_workspace_layout(T, Hq, Hkv, D, docs, true, QkvCodes::kSaved).total,
            forward_workspace_layout(T, Hq, Hkv, D, docs, false, QkvCodes::kSaved).total);
  EXPECT_EQ(backward_workspace_layout(T, Hq, Hkv, D, docs, true, QkvCodes::kSaved).total,
            backward_workspace_layout(T, Hq, Hkv, D, docs, false, QkvCodes::kSaved).total);

  flamia_tensor q = packed(0x10000, T, Hq, D), k = packed(0x20000, T, Hkv, D), v = packed(0x30000, T, Hkv, D);
  flamia_documents d{};
  d.num_docs = int32_t(docs);
  flamia_options prefix, prefix_token;
  flamia_default_options(&prefix);
  prefix.isolation = FLAMIA_ISOLATION_PREFIX;
  prefix_token = prefix;
  prefix_token.scale_geometry = FLAMIA_SCALE_TOKEN;  // per-token codes on every pair: no second encoding
  size_t bytes = 0;
  ASSERT_EQ(flamia_forward_workspace_size(&q, &k, &v, &d, &prefix, &bytes, nullptr), FLAMIA_SUCCESS);
  EXPECT_EQ(bytes, f.total);
  ASSERT_EQ(flamia_forward_workspace_size(&q, &k, &v, &d, &prefix_token, &bytes, nullptr), FLAMIA_SUCCESS);
  EXPECT_EQ(bytes, f0.total);
  ASSERT_EQ(flamia_backward_workspace_size(&q, &k, &v, &d, &prefix, &bytes, nullptr), FLAMIA_SUCCESS);
  EXPECT_EQ(bytes, b.total);
  ASSERT_EQ(flamia_saved_codes_size(&q, &k, &v, &d, &prefix, &bytes, nullptr), FLAMIA_SUCCESS);
  EXPECT_EQ(bytes, s.total);
  ASSERT_EQ(flamia_saved_codes_size(&q, &k, &v, &d, &prefix_token, &bytes, nullptr), FLAMIA_SUCCESS);
  EXPECT_EQ(bytes, s0.total);
}

TEST(CapiValidation, WorkspaceCheck) {
  const ForwardWorkspace w = forward_workspace_layout(14, 4, 2, 64, 3, false);
  EXPECT_TRUE(check_workspace(w, fake_pointer(0x100000), w.total).ok());
  EXPECT_TRUE(check_workspace(w, fake_pointer(0x100000), w.total + 1000).ok());
  EXPECT_TRUE(Fails(check_workspace(w, nullptr, w.total), FLAMIA_ERROR_WORKSPACE, "workspace is NULL"));
  EXPECT_TRUE(Fails(check_workspace(w, fake_pointer(0x100000), w.total - 1), FLAMIA_ERROR_WORKSPACE, "workspace_bytes"));
  EXPECT_TRUE(Fails(check_workspace(w, fake_pointer(0x100080), w.total), FLAMIA_ERROR_WORKSPACE, "256-byte"));
}

// A valid backward call on top of Call: dout and dq like q, dk and dv like k.

TEST(CapiValidation, BackwardChecksEveryArgument) {
  BackwardCall c;
  EXPECT_TRUE(c.validate().ok()) << c.validate().message;
  {
    BackwardCall prefix;
    prefix.options.isolation = FLAMIA_ISOLATION_PREFIX;
    EXPECT_TRUE(prefix.validate().ok()) << prefix.validate().message;
  }
  const BackwardCall b;
  EXPECT_TRUE(Fails(validate_backward(&b.q, &b.k, &b.v, nullptr, b.lse, &b.dout, &b.docs, &b.options, &b.dq, &b.dk, &b.dv),
                    kInvalid, "o is NULL"));
  EXPECT_TRUE(Fails(validate_backward(&b.q, &b.k, &b.v, &b.o, nullptr, &b.dout, &b.docs, &b.options, &b.dq, &b.dk, &b.dv),
                    kInvalid, "lse is NULL"));
  EXPECT_TRUE(Fails(validate_backward(&b.q, &b.k, &b.v, &b.o, b.lse, nullptr, &b.docs, &b.options, &b.dq, &b.dk, &b.dv),
                    kInvalid, "dout is NULL"));
  EXPECT_TRUE(Fails(validate_backward(&b.q, &b.k, &b.v, &b.o, b.lse, &b.dout, &b.docs, &b.options, nullptr, &b.dk, &b.dv),
                    kInvalid, "dq is NULL"));
  EXPECT_TRUE(Fails(validate_backward(&b.q, &b.k, &b.v, &b.o, b.lse, &b.dout, &b.docs, &b.options, &b.dq, nullptr, &b.dv),
                    kInvalid, "dk is NULL"));
  EXPECT_TRUE(Fails(validate_backward(&b.q, &b.k, &b.v, &b.o, b.lse, &b.dout, &b.docs, &b.options, &b.dq, &b.dk, nullptr),
                    kInvalid, "dv is NULL"));

  BackwardCall shape;
  shape.dout.heads = Call::Hkv;
  EXPECT_TRUE(Fails(shape.validate(), kInvalid, "dout.heads"));
  BackwardCall dk_shape;
  dk_shape.dk.heads = Call::Hq;  // dK is per K/V head, summed over the group's query heads
  EXPECT_TRUE(Fails(dk_shape.validate(), kInvalid, "dk.heads"));
  BackwardCall dv_dim;
  dv_dim.dv.dim = 128;
  EXPECT_TRUE(Fails(dv_dim.validate(), kInvalid, "dv.dim"));
  BackwardCall dtype;
  dtype.dq.dtype = FLAMIA_DTYPE_FP32;
  EXPECT_TRUE(Fails(dtype.validate(), kInvalid, "dq.dtype"));
  BackwardCall misaligned;
  misaligned.dout.data = fake_pointer(0x70008);
  EXPECT_TRUE(Fails(misaligned.validate(), kInvalid, "dout.data"));
  BackwardCall overlapping;  // an output whose rows overlap
  overlapping.dk.stride_token = Call::D;
  EXPECT_TRUE(Fails(overlapping.validate(), kInvalid, "dk.stride_token"));
  BackwardCall non_causal_prefix;
  non_causal_prefix.options.causal = 0;
  non_causal_prefix.options.isolation = FLAMIA_ISOLATION_PREFIX;
  EXPECT_TRUE(Fails(non_causal_prefix.validate(), kInvalid, "causal"));
  BackwardCall bad_docs;
  bad_docs.cu_host = {0, 5, 4, 14};
  bad_docs.docs.cu_seqlens_host = bad_docs.cu_host.data();
  EXPECT_TRUE(Fails(bad_docs.validate(), kInvalid, "docs.cu_seqlens_host"));
  BackwardCall d96;
  for (flamia_tensor* t : {&d96.q, &d96.k, &d96.v, &d96.o, &d96.dout, &d96.dq, &d96.dk, &d96.dv})
    *t = packed(reinterpret_cast<uintptr_t>(t->data), t->tokens, t->heads, 96);
  EXPECT_TRUE(Fails(d96.validate(), kNotSupported, "head_dim"));
}

TEST(CapiValidation, BackwardWorkspaceLayout) {
  for (const auto& [T, Hq, Hkv, D, docs] : std::vector<std::array<int64_t, 5>>{
           {1, 1, 1, 64, 1}, {14, 4, 2, 64, 3}, {1000, 32, 8, 128, 9}, {777, 6, 3, 128, 700}}) {
    const BackwardWorkspace w = backward_workspace_layout(T, Hq, Hkv, D, docs, false);
    EXPECT_EQ(w.total % kWorkspaceAlignment, 0u);
    EXPECT_EQ(w.v_codes_t.bytes, 0u) << "a layout the backward does not read";
    const size_t slots = size_t(32 * ((T + 31) / 32 + docs));
    const WorkspaceRegion regions[] = {w.q_codes,  w.k_codes,   w.v_codes,   w.g_codes,  w.q_codes_t,
                                       w.k_codes_t, w.g_codes_t, w.q_scales,  w.k_scales, w.v_scales,
                                       w.g_scales, w.g_scale_prefix_max, w.delta, w.work_counter,
                                       w.work_order, w.work_order_counters, w.checked_cu_seqlens};
    const size_t order_entries = size_t((T + 127) / 128 + docs), costs = size_t((T + 127) / 128 + 1);
    const size_t need[] = {size_t(T * Hq * D), size_t(T * Hkv * D), size_t(T * Hkv * D), size_t(T * Hq * D),
                           size_t(Hq * D) * slots, size_t(Hkv * D) * slots, size_t(Hq * D) * slots,
                           size_t(T * Hq),     size_t(T * Hkv),     size_t(T * Hkv),     size_t(T * Hq),
                           size_t(T * Hq),     size_t(T * Hq) * sizeof(float), sizeof(int32_t),
                           order_entries * sizeof(order::OrderedTile), costs * sizeof(int32_t),
                           size_t(docs + 1) * sizeof(int32_t)};
    expect_regions_fit(regions, need, w.total);
    flamia_tensor q = packed(0x10000, T, Hq, D), k = packed(0x20000, T, Hkv, D), v = packed(0x30000, T, Hkv, D);
    flamia_documents d{};
    d.num_docs = int32_t(docs);
    flamia_options opt;
    flamia_default_options(&opt);
    size_t bytes = 0;
    flamia_error err;
    ASSERT_EQ(flamia_backward_workspace_size(&q, &k, &v, &d, &opt, &bytes, &err), FLAMIA_SUCCESS) << err.message;
    EXPECT_EQ(bytes, w.total);
  }
  size_t bytes = 0;
  Call d;
  d.q.dim = d.k.dim = d.v.dim = 96;
  EXPECT_EQ(flamia_backward_workspace_size(&d.q, &d.k, &d.v, &d.docs, &d.options, &bytes, nullptr), kNotSupported);
  EXPECT_EQ(flamia_backward_workspace_size(&d.q, &d.k, &d.v, &d.docs, &d.options, nullptr, nullptr), kInvalid);

  const BackwardWorkspace w = backward_workspace_layout(14, 4, 2, 64, 3, false);
  EXPECT_TRUE(check_workspace(w, fake_pointer(0x100000), w.total).ok());
  EXPECT_TRUE(Fails(check_workspace(w, fake_pointer(0x100000), w.total - 1), FLAMIA_ERROR_WORKSPACE,
                    "flamia_backward_workspace_size"));
}

// The training pair's buffers: the saved codes hold q, k and v in both code layouts and their
// scales; the forward's and the backward's workspaces then hold no q, k, v region, the rest as
// before; each size query returns its layout's total.
TEST(CapiValidation, SavedCodesLayouts) {
  for (const auto& [T, Hq, Hkv, D, docs] : std::vector<std::array<int64_t, 5>>{
           {1, 1, 1, 64, 1}, {14, 4, 2, 64, 3}, {1000, 32, 8, 128, 9}, {777, 6, 3, 128, 700}}) {
    const size_t slots = size_t(32 * ((T + 31) / 32 + docs));
    const SavedCodes s = saved_codes_layout(T, Hq, Hkv, D, docs, false);
    EXPECT_EQ(s.total % kWorkspaceAlignment, 0u);
    const WorkspaceRegion regions[] = {s.q_codes,   s.k_codes,   s.v_codes,  s.q_codes_t, s.k_codes_t,
                                       s.v_codes_t, s.q_scales, s.k_scales, s.v_scales, s.row_max_prob};
    const size_t need[] = {size_t(T * Hq * D),     size_t(T * Hkv * D),     size_t(T * Hkv * D),
                           size_t(Hq * D) * slots, size_t(Hkv * D) * slots, size_t(Hkv * D) * slots,
                           size_t(T * Hq),         size_t(T * Hkv),         size_t(T * Hkv),
                           size_t(T * Hq) * sizeof(float)};
    expect_regions_fit(regions, need, s.total);

    // Without q, k, v's regions the workspaces keep the rest, in the same sizes.
    const ForwardWorkspace f = forward_workspace_layout(T, Hq, Hkv, D, docs, false, QkvCodes::kSaved);
    const ForwardWorkspace f_own = forward_workspace_layout(T, Hq, Hkv, D, docs, false);
    for (const WorkspaceRegion& r : {f.q_codes, f.k_codes, f.v_codes_t, f.q_scales, f.k_scales, f.v_scales})
      EXPECT_EQ(r.bytes, 0u);
    EXPECT_EQ(f.v_fold_ref.bytes, f_own.v_fold_ref.bytes);
    EXPECT_EQ(f.work_counter.bytes, f_own.work_counter.bytes);
    EXPECT_LT(f.total, f_own.total);
    const BackwardWorkspace b = backward_workspace_layout(T, Hq, Hkv, D, docs, false, QkvCodes::kSaved);
    const BackwardWorkspace b_own = backward_workspace_layout(T, Hq, Hkv, D, docs, false);
    for (const WorkspaceRegion& r : {b.q_codes, b.k_codes, b.v_codes, b.q_codes_t, b.k_codes_t, b.q_scales,
                                     b.k_scales, b.v_scales})
      EXPECT_EQ(r.bytes, 0u);
    const WorkspaceRegion kept[] = {b.g_codes, b.g_codes_t, b.g_scales, b.g_scale_prefix_max, b.delta,
                                    b.work_counter};
    const WorkspaceRegion kept_own[] = {b_own.g_codes, b_own.g_codes_t, b_own.g_scales, b_own.g_scale_prefix_max,
                                        b_own.delta,   b_own.work_counter};
    size_t end = 0;
    for (size_t i = 0; i < std::size(kept); ++i) {
      EXPECT_EQ(kept[i].bytes, kept_own[i].bytes) << i;
      EXPECT_GE(kept[i].offset, end) << i << ": regions must not overlap";
      end = kept[i].offset + kept[i].bytes;
    }
    EXPECT_LE(end, b.total);
    // The saved codes plus the smaller backward workspace take what the backward's own workspace
    // took, plus V's transposed codes (which the forward reads), the rows' largest probabilities
    // (which the forward keeps for the FP16 dQ partials) and alignment.
    EXPECT_LE(b.total + s.total,
              b_own.total + s.v_codes_t.bytes + s.row_max_prob.bytes + 16 * kWorkspaceAlignment);

    flamia_tensor q = packed(0x10000, T, Hq, D), k = packed(0x20000, T, Hkv, D), v = packed(0x30000, T, Hkv, D);
    flamia_documents d{};
    d.num_docs = int32_t(docs);
    flamia_options opt;
    flamia_default_options(&opt);
    flamia_error err;
    const std::pair<flamia_status (*)(const flamia_tensor*, const flamia_tensor*, const flamia_tensor*,
                                      const flamia_documents*, const flamia_options*, size_t*, flamia_error*),
                    size_t>
        queries[] = {{flamia_saved_codes_size, s.total},
                     {flamia_forward_train_workspace_size, f.total},
                     {flamia_backward_saved_workspace_size, b.total}};
    for (const auto& [query, total] : queries) {
      size_t bytes = 0;
      ASSERT_EQ(query(&q, &k, &v, &d, &opt, &bytes, &err), FLAMIA_SUCCESS) << err.message;
      EXPECT_EQ(bytes, total);
    }
  }
  Call d;
  d.q.dim = d.k.dim = d.v.dim = 96;
  size_t bytes = 0;
  for (auto query : {flamia_saved_codes_size, flamia_forward_train_workspace_size, flamia_backward_saved_workspace_size}) {
    EXPECT_EQ(query(&d.q, &d.k, &d.v, &d.docs, &d.options, &bytes, nullptr), kNotSupported);
    EXPECT_EQ(query(&d.q, &d.k, &d.v, &d.docs, &d.options, nullptr, nullptr), kInvalid);
  }

  const SavedCodes s = saved_codes_layout(14, 4, 2, 64, 3, false);
  EXPECT_TRUE(check_saved_codes(s, fake_pointer(0x100000), s.total).ok());
  EXPECT_TRUE(Fails(check_saved_codes(s, nullptr, s.total), FLAMIA_ERROR_WORKSPACE, "saved_codes is NULL"));
  EXPECT_TRUE(Fails(check_saved_codes(s, fake_pointer(0x100000), s.total - 1), FLAMIA_ERROR_WORKSPACE,
                    "flamia_saved_codes_size"));
  EXPECT_TRUE(Fails(check_saved_codes(s, fake_pointer(0x100080), s.total), FLAMIA_ERROR_WORKSPACE, "256-byte"));
  const ForwardWorkspace f = forward_workspace_layout(14, 4, 2, 64, 3, false, QkvCodes::kSaved);
  EXPECT_TRUE(Fails(check_workspace(f, fake_pointer(0x100000), f.total - 1, "flamia_forward_train_workspace_size"),
                    FLAMIA_ERROR_WORKSPACE, "flamia_forward_train_workspace_size"));
}

// flamia_backward_saved reads only q, k and v's shapes: NULL data and odd strides pass, shapes
// are still checked.
TEST(CapiValidation, BackwardFromSavedCodesReadsOnlyTheShapesOfQkv) {
  BackwardCall c;
  c.q.data = c.k.data = c.v.data = nullptr;
  c.k.stride_token = 3;
  auto validate_saved = [](const BackwardCall& b) {
    return validate_backward(&b.q, &b.k, &b.v, &b.o, b.lse, &b.dout, &b.docs, &b.options, &b.dq, &b.dk, &b.dv,
                             QkvCodes::kSaved);
  };
  EXPECT_TRUE(validate_saved(c).ok()) << validate_saved(c).message;
  EXPECT_TRUE(Fails(c.validate(), kInvalid, "q.data"));
  BackwardCall heads = c;
  heads.v.heads = 3;
  EXPECT_TRUE(Fails(validate_saved(heads), kInvalid, "v.heads"));
  BackwardCall no_dout = c;
  no_dout.dout.data = nullptr;
  EXPECT_TRUE(Fails(validate_saved(no_dout), kInvalid, "dout.data"));
}

TEST(CapiValidation, ReportTruncatesAndTerminates) {
  flamia_error err;
  std::memset(err.message, 'x', sizeof err.message);
  const CallError long_error{kInvalid, std::string(2000, 'a')};
  EXPECT_EQ(report(long_error, &err), kInvalid);
  EXPECT_EQ(std::strlen(err.message), sizeof err.message - 1);
  EXPECT_EQ(report(CallError::success(), &err), FLAMIA_SUCCESS);
  EXPECT_STREQ(err.message, "");
  EXPECT_EQ(report(long_error, nullptr), kInvalid);  // no error struct: status only
}

// The backward's one decision of its dQ reduction (plan_backward): the FP16 partials only where the
// saving forward kept 1 / l_i, the options allow them, the kernels have the instance and dq's rows can
// take TMA's reduce; the deterministic pass everywhere else.
TEST(BackwardPlan, Fp16PartialsOnlyWhereEveryConditionHolds) {
  const int64_t T = 4 * 8192;
  flamia_tensor q = packed(0x10000, T, 8, 128), dq = packed(0x80000, T, 8, 128);
  std::vector<int32_t> cu{0, 8192, 16384, 24576, 32768};
  flamia_documents docs{};
  docs.cu_seqlens_host = cu.data();
  docs.num_docs = 4;
  docs.max_seqlen = 8192;
  flamia_options options{};
  flamia_default_options(&options);
  auto partials = [&](QkvCodes codes = QkvCodes::kSaved) {
    const BackwardPlan plan = plan_backward(q, dq, docs, options, codes);
    EXPECT_EQ(plan.codes, codes);
    return plan.dq_partials;
  };
  EXPECT_TRUE(partials()) << "the default: saved codes, causal, document isolation, D = 128, long documents";
  EXPECT_FALSE(partials(QkvCodes::kInWorkspace)) << "flamia_backward: no 1 / l_i from the forward";
  options.deterministic = 1;
  EXPECT_FALSE(partials());
  options.deterministic = 0, options.isolation = FLAMIA_ISOLATION_PREFIX;
  EXPECT_FALSE(partials());
  options.isolation = FLAMIA_ISOLATION_DOCUMENT, options.causal = 0;
  EXPECT_FALSE(partials());
  options.causal = 1;
  docs.num_docs = 8;  // a mean document below kDqPartialsFromMeanDocument
  EXPECT_FALSE(partials());
  docs.num_docs = 4;
  dq.stride_head = 132;  // not a multiple of 8 elements: no TMA reduce target
  EXPECT_FALSE(partials());
  dq.stride_head = 128, dq.data = fake_pointer(0x80008);
  EXPECT_FALSE(partials()) << "dq's base 16-byte aligned";
  dq.data = fake_pointer(0x80000), q.dim = 64;
  EXPECT_FALSE(partials()) << "the instance is D = 128's";
  q.dim = 128;
  EXPECT_TRUE(partials());
}

}  // namespace
}  // namespace flamia::capi
