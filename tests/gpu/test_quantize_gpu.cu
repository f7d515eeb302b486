// The GPU quantization kernels against their spec, the CPU quantizer reference::quantize_mxfp8:
// codes and scales must be bitwise equal. Also the V fold reference (running max of the scale
// exponents) against a CPU loop. Every test skips when no sm_90 device is present.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/inputs.h"
#include "core/documents.h"
#include "core/options.h"
#include "core/operand_layout.h"
#include "cuda/quant/quantize_mxfp8.cuh"
#include "formats/minifloat.h"
#include "formats/scales.h"
#include "reference/quantize.h"

namespace flamia {
namespace {

using reference::Mxfp8Tensor;
using reference::PackedTensor;

// Any failing CUDA call throws; GoogleTest reports the message and fails the test.
void check_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                             cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}
#define CUDA_CHECK(expr) check_cuda((expr), #expr, __FILE__, __LINE__)

// Empty when the kernels can run here, otherwise why not.
std::string why_no_gpu() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error this probe just raised
    return std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(err) + ")";
  }
  if (count == 0) return "no CUDA device";
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (prop.major != 9 || prop.minor != 0) {
    return "the kernels are built for sm_90a only, but device " + std::to_string(device) + " (" + prop.name +
           ") is sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
  }
  return {};
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = why_no_gpu();
    if (!why.empty()) GTEST_SKIP() << "GPU test skipped: " << why;
  }
};

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (const cudaError_t err = cudaFree(ptr_); err != cudaSuccess) ADD_FAILURE() << "cudaFree: " << cudaGetErrorString(err);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw std::invalid_argument("upload: size mismatch");
    CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  void fill_bytes(int value) { CUDA_CHECK(cudaMemset(ptr_, value, n_ * sizeof(T))); }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

constexpr int kSentinel = 0xCD;  // output bytes before the kernel runs: a byte left unwritten shows up

// The BF16 value of a double that is exactly BF16 (NaN: the canonical quiet NaN of its sign).
__nv_bfloat16 to_bf16(double v) {
  __nv_bfloat16_raw raw;
  if (std::isnan(v)) {
    raw.x = std::signbit(v) ? 0xFFC0 : 0x7FC0;
    return __nv_bfloat16(raw);
  }
  const float f = float(v);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (double(f) != v || (bits & 0xFFFFu) != 0) throw std::invalid_argument("not a BF16 value: " + std::to_string(v));
  raw.x = uint16_t(bits >> 16);
  return __nv_bfloat16(raw);
}

// The double a BF16 bit pattern represents, on the host (exact: BF16 widens to float exactly).
double bf16_bits_value(uint16_t bits) {
  const uint32_t wide = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return double(f);
}

// x placed in a BF16 buffer of `size` elements at offset + t*token_stride + h*head_stride + f.
// Every other element is NaN, so a read outside the view would turn a scale into 0xFF.
std::vector<__nv_bfloat16> embed(const PackedTensor& x, size_t size, size_t offset, int64_t token_stride,
                                 int64_t head_stride) {
  std::vector<__nv_bfloat16> buf(size, to_bf16(NAN));
  for (int t = 0; t < x.tokens; ++t)
    for (int h = 0; h < x.heads; ++h)
      for (int f = 0; f < x.dim; ++f) buf.at(offset + t * token_stride + h * head_stride + f) = to_bf16(x.at(t, h, f));
  return buf;
}

std::vector<__nv_bfloat16> contiguous(const PackedTensor& x) {
  return embed(x, x.size(), 0, int64_t(x.heads) * x.dim, x.dim);
}

struct View {
  size_t offset = 0;
  int64_t token_stride = 0, head_stride = 0;  // 0: contiguous [T, H, D]
};

struct GpuQuantized {
  std::vector<uint8_t> codes, scales;
  std::vector<uint8_t> transposed;  // the transposed layout (core/operand_layout.h), sentinel where unwritten
  std::vector<uint8_t> transposed_alone;  // the same, from a launch that wrote no row-layout codes
  std::vector<int32_t> cu_seqlens;
};

// Runs launch_quantize_mxfp8 on `buffer` viewed as x [T, H, D]. codes_offset > 0 misaligns the
// codes pointer (byte-store path). Both code layouts are written, then the transposed one again
// alone.
GpuQuantized gpu_quantize(const std::vector<__nv_bfloat16>& buffer, View view, const Documents& docs, int heads, int dim,
                          ScaleGeometry geometry, ScaleRule rule, size_t codes_offset = 0) {
  const int T = docs.total_tokens();
  if (view.token_stride == 0) view.token_stride = int64_t(heads) * dim, view.head_stride = dim;
  DeviceBuffer<__nv_bfloat16> x(buffer);
  DeviceBuffer<int32_t> cu(docs.cu_seqlens());
  const size_t n_codes = size_t(T) * heads * dim, n_scales = size_t(T) * heads;
  DeviceBuffer<uint8_t> codes(codes_offset + n_codes), scales(n_scales);
  codes.fill_bytes(kSentinel);
  scales.fill_bytes(kSentinel);
  const size_t n_transposed = size_t(heads) * dim * size_t(layout::transposed_tokens(T, docs.count()));
  DeviceBuffer<uint8_t> transposed(n_transposed), transposed_alone(n_transposed);
  transposed.fill_bytes(kSentinel);
  transposed_alone.fill_bytes(kSentinel);
  CUDA_CHECK(cuda::launch_quantize_mxfp8(x.get() + view.offset, view.token_stride, view.head_stride, T, heads, dim,
                                         cu.get(), docs.count(), geometry, rule,
                                         codes.get() + codes_offset, transposed.get(), scales.get(), nullptr));
  CUDA_CHECK(cuda::launch_quantize_mxfp8(x.get() + view.offset, view.token_stride, view.head_stride, T, heads, dim,
                                         cu.get(), docs.count(), geometry, rule, nullptr,
                                         transposed_alone.get(), scales.get(), nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  GpuQuantized out;
  const std::vector<uint8_t> all_codes = codes.download();
  out.codes.assign(all_codes.begin() + std::ptrdiff_t(codes_offset), all_codes.end());
  out.scales = scales.download();
  out.transposed = transposed.download();
  out.transposed_alone = transposed_alone.download();
  out.cu_seqlens = docs.cu_seqlens();
  return out;
}

std::string hex(unsigned v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// Bitwise comparison with the CPU quantizer, naming the first mismatches.
::testing::AssertionResult matches_reference(const GpuQuantized& gpu, const Mxfp8Tensor& ref, const PackedTensor& x) {
  if (gpu.codes.size() != ref.codes.size() || gpu.scales.size() != ref.scales.size())
    return ::testing::AssertionFailure() << "size mismatch";
  size_t bad_scales = 0, bad_codes = 0;
  std::ostringstream first;
  for (int t = 0; t < ref.tokens; ++t) {
    for (int h = 0; h < ref.heads; ++h) {
      const size_t i = size_t(t) * ref.heads + h;
      if (gpu.scales[i] != ref.scales[i] && bad_scales++ < 5)
        first << "\n  scale (t=" << t << ", h=" << h << "): gpu " << hex(gpu.scales[i]) << ", cpu " << hex(ref.scales[i]);
      for (int f = 0; f < ref.dim; ++f) {
        const size_t j = i * ref.dim + f;
        if (gpu.codes[j] != ref.codes[j] && bad_codes++ < 5) {
          first << "\n  code (t=" << t << ", h=" << h << ", f=" << f << ") of x=" << x.at(t, h, f) << " at scale "
                << hex(ref.scales[i]) << ": gpu " << hex(gpu.codes[j]) << ", cpu " << hex(ref.codes[j]);
        }
      }
    }
  }
  // The transposed layout: the same codes at each document's permuted slots and zeros in every
  // other slot (the rest of a document's last step, the idle slots between documents and after
  // the last): the whole buffer is written, so that the attention kernels' tile loads, which run
  // past a document's end, only ever meet finite codes.
  size_t bad_transposed = 0;
  const int docs = int(gpu.cu_seqlens.size()) - 1;
  const int64_t pitch = layout::transposed_tokens(ref.tokens, docs);
  std::vector<uint8_t> expected(gpu.transposed.size(), uint8_t(0));
  for (int d = 0; d < docs; ++d) {
    const int begin = gpu.cu_seqlens[d], len = gpu.cu_seqlens[d + 1] - begin;
    const int64_t start = layout::transposed_document_start(begin, d);
    for (int pos = 0; pos < (len + layout::kKeyStep - 1) / layout::kKeyStep * layout::kKeyStep; ++pos)
      for (int h = 0; h < ref.heads; ++h)
        for (int f = 0; f < ref.dim; ++f)
          expected[size_t((int64_t(h) * ref.dim + f) * pitch + start + layout::permuted_position(pos))] =
              pos < len ? ref.codes[(size_t(begin + pos) * ref.heads + h) * ref.dim + f] : uint8_t(0);
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (gpu.transposed[i] != expected[i] && bad_transposed++ < 5)
      first << "\n  transposed slot " << i << " (row " << i / size_t(pitch) << ", slot " << i % size_t(pitch)
            << "): gpu " << hex(gpu.transposed[i]) << ", expected " << hex(expected[i]);
  }
  const bool alone_same = gpu.transposed_alone == gpu.transposed;
  if (!alone_same) first << "\n  the transposed-only launch wrote different bytes";
  if (bad_scales == 0 && bad_codes == 0 && bad_transposed == 0 && alone_same) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad_scales << " of " << ref.scales.size() << " scales, " << bad_codes << " of "
                                       << ref.codes.size() << " codes and " << bad_transposed << " of "
                                       << expected.size() << " transposed slots differ; first ones:" << first.str();
}

// Quantizes x on both sides and compares.
::testing::AssertionResult gpu_matches_cpu(const PackedTensor& x, const Documents& docs, ScaleGeometry geometry,
                                           ScaleRule rule) {
  const Mxfp8Tensor ref = reference::quantize_mxfp8(x, docs, geometry, rule);
  return matches_reference(gpu_quantize(contiguous(x), {}, docs, x.heads, x.dim, geometry, rule), ref, x);
}

std::string name_of(ScaleGeometry g, ScaleRule r) { return std::string(to_string(g)) + "_" + std::string(to_string(r)); }

// Documents packed back to back, so most of them start off the 32-token grid.
const std::vector<int> kLengths = {33, 1, 127, 4097, 31, 1000, 129, 32};

const auto kGeometries = ::testing::Values(ScaleGeometry::kBlock32, ScaleGeometry::kToken);
const auto kRules = ::testing::Values(ScaleRule::kCeil, ScaleRule::kFloor);

// ---- the per-element device steps, exhaustively on the host (runs without a GPU) ------------

// detail::scale_for_bf16_amax is the one per-group step of the kernel that the host does not take
// the same way (the CPU quantizer applies formats::scale_for_amax to the amax's double): it must
// give the same scale code for every BF16 amax pattern (sign cleared, so 0 .. 0x7FFF: zero,
// subnormals, normals, Inf and NaN) under both rules. Runs without a GPU.
TEST(DeviceCodecs, Bf16ScaleMatchesTheDoubleRuleExhaustively) {
  size_t bad = 0;
  for (uint32_t b = 0; b < 0x8000; ++b) {
    for (ScaleRule rule : {ScaleRule::kCeil, ScaleRule::kFloor}) {
      const uint8_t host = formats::scale_for_amax(bf16_bits_value(uint16_t(b)), rule);
      const uint8_t dev = cuda::detail::scale_for_bf16_amax(b, rule);
      if (host != dev && bad++ < 5)
        ADD_FAILURE() << "bf16 " << hex(b) << " rule " << int(rule) << ": host " << hex(host) << ", device path "
                      << hex(dev);
    }
  }
  EXPECT_EQ(bad, 0u);
}

// The kernel's codes come from the hardware conversion detail::encode_scaled_e4m3x4; it must equal
// the shared codec formats::encode_scaled_e4m3 on its whole domain: every finite BF16 value under
// every UE8M0 scale code (NaN included), in each of the four places of a chunk's word.
// out[scale * 65536 + pattern].
__global__ void encode_every_pattern_under_every_scale(uint8_t* out) {
  const uint32_t scale = blockIdx.y;
  const uint32_t first = 4 * (blockIdx.x * blockDim.x + threadIdx.x);  // patterns first .. first + 3
  if (first >= 0x10000u) return;
  const uint32_t codes =
      cuda::detail::encode_scaled_e4m3x4(first | ((first + 1) << 16), (first + 2) | ((first + 3) << 16), uint8_t(scale));
  for (uint32_t i = 0; i < 4; ++i) out[scale * 0x10000u + first + i] = uint8_t(codes >> (8 * i));
}

TEST_F(Gpu, E4m3ConversionMatchesTheSharedCodecExhaustively) {
  DeviceBuffer<uint8_t> out(size_t(256) * 0x10000);
  out.fill_bytes(kSentinel);
  encode_every_pattern_under_every_scale<<<dim3(0x10000 / 4 / 256, 256), 256>>>(out.get());
  CUDA_CHECK(cudaGetLastError());
  const std::vector<uint8_t> got = out.download();
  size_t bad = 0, checked = 0;
  for (uint32_t scale = 0; scale < 256; ++scale) {
    for (uint32_t b = 0; b < 0x10000; ++b) {
      if (((b >> 7) & 0xFF) == 0xFF) continue;  // NaN and Inf: their group's scale is NaN (codes 0)
      const uint8_t want = formats::encode_scaled_e4m3(bf16_bits_value(uint16_t(b)), uint8_t(scale));
      const uint8_t have = got[scale * 0x10000u + b];
      ++checked;
      if (have != want && bad++ < 5)
        ADD_FAILURE() << "bf16 " << hex(b) << " scale " << hex(scale) << ": device " << hex(have) << ", codec "
                      << hex(want);
    }
  }
  EXPECT_EQ(checked, size_t(256) * 65280);
  EXPECT_EQ(bad, 0u);
}

// ---- random normal inputs over the shapes of the brief ----------------------------------------

using RandomParam = std::tuple<int, int, ScaleGeometry, ScaleRule, bool>;  // heads, dim, geometry, rule, spread
class RandomShapes : public Gpu, public ::testing::WithParamInterface<RandomParam> {};
std::string random_param_name(const ::testing::TestParamInfo<RandomParam>& info) {
  const auto [h, d, g, r, spread] = info.param;
  return "h" + std::to_string(h) + "_d" + std::to_string(d) + "_" + name_of(g, r) + (spread ? "_spread" : "_normal");
}

TEST_P(RandomShapes, BitwiseEqualToCpu) {
  const auto [heads, dim, geometry, rule, spread] = GetParam();
  analysis::InputShape shape;
  shape.lengths = kLengths;
  shape.q_heads = heads, shape.kv_heads = 1, shape.head_dim = dim;
  analysis::AttentionInputs in = analysis::random_inputs(shape, 1234 + 17 * heads + dim);
  PackedTensor& x = in.q;
  if (spread) {
    // Rows scaled by 2^k, k in [-24, 24] (exact): groups with wide dynamic range, so many codes
    // land on E4M3 subnormals and zero, and scales vary from group to group.
    for (int t = 0; t < x.tokens; ++t)
      for (int h = 0; h < heads; ++h)
        for (int f = 0; f < dim; ++f) x.at(t, h, f) = std::ldexp(x.at(t, h, f), (t * 131 + h * 17) % 49 - 24);
  }
  EXPECT_TRUE(gpu_matches_cpu(x, in.docs, geometry, rule));
}

INSTANTIATE_TEST_SUITE_P(Quantize, RandomShapes,
                         ::testing::Combine(::testing::Values(1, 4, 16), ::testing::Values(64, 128), kGeometries, kRules,
                                            ::testing::Bool()),
                         random_param_name);

// ---- planted NaN/Inf, zero groups, and amax values at the 448/480/512 boundaries -------------

using RuleParam = std::tuple<ScaleGeometry, ScaleRule>;
std::string rule_param_name(const ::testing::TestParamInfo<RuleParam>& info) {
  return name_of(std::get<0>(info.param), std::get<1>(info.param));
}

class SpecialValues : public Gpu, public ::testing::WithParamInterface<RuleParam> {};

TEST_P(SpecialValues, BitwiseEqualToCpu) {
  const auto [geometry, rule] = GetParam();
  const std::vector<int> lengths = {5, 40, 0, 33, 64, 1, 70, 32, 3};
  analysis::InputShape shape;
  shape.lengths = lengths;
  shape.q_heads = 4, shape.kv_heads = 1, shape.head_dim = 64;
  analysis::AttentionInputs in = analysis::random_inputs(shape, 99);
  const Documents& docs = in.docs;
  PackedTensor& x = in.q;
  const int H = x.heads, D = x.dim;
  auto at = [&](int doc, int pos, int h, int f) -> double& { return x.at(docs.begin(doc) + pos, h, f); };

  // Document 6 (70 tokens, groups [0,32) [32,64) [64,70)) and document 4: every row gets one
  // planted element whose magnitude sits at or next to a scale boundary (448 = 0.875 * 2^9 is
  // the ceil rule's threshold, floor clips between 448 and 512), scaled by 2^-3 .. 2^3.
  const double boundary[] = {448, 446, 450, 480, 478, 482, 496, 510, 512, 464, 224, 225, 256, 1, 0.875, 0.9375};
  const int n_boundary = int(std::size(boundary));
  for (int doc : {4, 6}) {
    for (int p = 0; p < docs.length(doc); ++p) {
      for (int h = 0; h < H; ++h) {
        const double v = std::ldexp(boundary[(p * H + h) % n_boundary], (p % 7) - 3);
        at(doc, p, h, (p * 5 + h) % D) = (p + h) % 2 ? -v : v;
      }
    }
  }
  // Ties of the E4M3 lattice: with per-token scales this row's amax 448 gives the scale 2^0 under
  // both rules, so these values are exact midpoints (normal and subnormal) that round to even.
  for (int f = 0; f < D; ++f) at(6, 10, 0, f) = 0;
  at(6, 10, 0, 0) = 448;
  const double ties[] = {1.0625, 17, 9.5, 0x1p-10, 3 * 0x1p-10, 5 * 0x1p-10, 0x1p-11, 0.0068359375, 104, 440, -1.0625, -0x1p-10};
  for (int i = 0; i < int(std::size(ties)); ++i) at(6, 10, 0, 1 + i) = ties[i];

  // Non-finite values: each poisons its group (block32) or token (token), nothing else.
  at(1, 35, 2, 7) = NAN;
  at(1, 36, 1, 0) = -NAN;
  at(3, 3, 0, 0) = INFINITY;
  at(4, 63, 3, 63) = -INFINITY;
  at(8, 0, 3, 5) = INFINITY;
  at(8, 0, 3, 6) = NAN;

  // Zero groups: document 4's first group on head 1 (with negative zeros), all of document 7 on
  // head 2, and the 1-token document 5 on every head.
  for (int p = 0; p < 32; ++p)
    for (int f = 0; f < D; ++f) at(4, p, 1, f) = (p + f) % 3 ? 0.0 : -0.0;
  for (int p = 0; p < 32; ++p)
    for (int f = 0; f < D; ++f) at(7, p, 2, f) = 0.0;
  for (int h = 0; h < H; ++h)
    for (int f = 0; f < D; ++f) at(5, 0, h, f) = 0.0;

  // Extremes of BF16: the largest finite value, and rows of subnormals whose exponent clamps to
  // UE8M0's -127 (document 0 head 0: only subnormals; head 1: the smallest normal as amax).
  at(0, 1, 3, 9) = -bf16_bits_value(0x7F7F);
  for (int p = 0; p < docs.length(0); ++p) {
    for (int f = 0; f < D; ++f) {
      at(0, p, 0, f) = bf16_bits_value(uint16_t((p * 64 + f) % 128)) * ((f % 2) ? -1 : 1);
      at(0, p, 1, f) = std::ldexp(double((f + p) % 16), -130);
    }
    at(0, p, 1, 0) = std::ldexp(1.0, -126);
  }

  EXPECT_TRUE(gpu_matches_cpu(x, docs, geometry, rule));
}

INSTANTIATE_TEST_SUITE_P(Quantize, SpecialValues, ::testing::Combine(kGeometries, kRules), rule_param_name);

// ---- every finite BF16 value, once -------------------------------------------------------------

using PatternParam = std::tuple<ScaleGeometry, ScaleRule, bool>;  // geometry, rule, shuffled
class AllFiniteBf16 : public Gpu, public ::testing::WithParamInterface<PatternParam> {};

TEST_P(AllFiniteBf16, BitwiseEqualToCpu) {
  const auto [geometry, rule, shuffled] = GetParam();
  std::vector<double> values;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if (((b >> 7) & 0xFF) != 0xFF) values.push_back(bf16_bits_value(uint16_t(b)));
  }
  ASSERT_EQ(values.size(), 65280u);  // 1020 tokens x 64 features
  if (shuffled) {
    std::mt19937_64 rng(7);
    for (size_t i = values.size() - 1; i > 0; --i) std::swap(values[i], values[size_t(rng() % (i + 1))]);
  }
  const std::vector<int> lengths = {1, 31, 32, 33, 127, 129, 667};
  const Documents docs = Documents::from_lengths(lengths);
  PackedTensor x(1020, 1, 64);
  x.data = values;
  EXPECT_TRUE(gpu_matches_cpu(x, docs, geometry, rule));
}

std::string pattern_param_name(const ::testing::TestParamInfo<PatternParam>& info) {
  const auto [g, r, shuffled] = info.param;
  return name_of(g, r) + (shuffled ? "_shuffled" : "_sorted");
}
INSTANTIATE_TEST_SUITE_P(Quantize, AllFiniteBf16, ::testing::Combine(kGeometries, kRules, ::testing::Bool()),
                         pattern_param_name);

// ---- other head dims, strided views, grid edge cases ----------------------------------------

class QuantizeEdges : public Gpu, public ::testing::WithParamInterface<RuleParam> {};

TEST_P(QuantizeEdges, OtherHeadDims) {
  const auto [geometry, rule] = GetParam();
  for (int dim : {8, 72, 200, 256}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    analysis::InputShape shape;
    shape.lengths = {1, 31, 32, 33, 100};
    shape.q_heads = 3, shape.kv_heads = 1, shape.head_dim = dim;
    const analysis::AttentionInputs in = analysis::random_inputs(shape, 5 + dim);
    EXPECT_TRUE(gpu_matches_cpu(in.q, in.docs, geometry, rule));
  }
}

// q viewed inside a packed QKV buffer [T, 3, H, D] (16-byte loads), and inside a buffer with a
// misaligned base and strides that are no multiple of 8 elements (scalar loads), with the codes
// pointer misaligned too (byte stores). Elements outside the view are NaN.
TEST_P(QuantizeEdges, StridedViews) {
  const auto [geometry, rule] = GetParam();
  analysis::InputShape shape;
  shape.lengths = kLengths;
  shape.q_heads = 4, shape.kv_heads = 1, shape.head_dim = 64;
  const analysis::AttentionInputs in = analysis::random_inputs(shape, 77);
  const PackedTensor& x = in.q;
  const int T = x.tokens, H = x.heads, D = x.dim;
  const Mxfp8Tensor ref = reference::quantize_mxfp8(x, in.docs, geometry, rule);
  {
    SCOPED_TRACE("qkv-packed view, 16-byte loads");
    const View view{0, int64_t(3) * H * D, D};
    const auto buf = embed(x, size_t(T) * 3 * H * D, view.offset, view.token_stride, view.head_stride);
    EXPECT_TRUE(matches_reference(gpu_quantize(buf, view, in.docs, H, D, geometry, rule), ref, x));
  }
  {
    SCOPED_TRACE("misaligned view, scalar loads, byte stores");
    const View view{1, int64_t(H) * (D + 3) + 5, D + 3};
    const auto buf = embed(x, 1 + size_t(T) * size_t(view.token_stride), view.offset, view.token_stride, view.head_stride);
    EXPECT_TRUE(matches_reference(gpu_quantize(buf, view, in.docs, H, D, geometry, rule, 3), ref, x));
  }
}

// Skewed lengths with empty documents at the ends and in between: every tile slot
// (core/schedule.h) finds its document, idle slots write nothing.
TEST_P(QuantizeEdges, SkewedAndEmptyDocuments) {
  const auto [geometry, rule] = GetParam();
  analysis::InputShape shape;
  shape.lengths = {0, 5000, 0, 0, 1, 31, 0, 33, 64, 0};
  shape.q_heads = 2, shape.kv_heads = 1, shape.head_dim = 128;
  const analysis::AttentionInputs in = analysis::random_inputs(shape, 3);
  EXPECT_TRUE(gpu_matches_cpu(in.q, in.docs, geometry, rule));
}

// More documents (70001, many empty) than a grid's y dimension would hold: one tile slot each.
TEST_P(QuantizeEdges, ManyDocuments) {
  const auto [geometry, rule] = GetParam();
  std::vector<int> lengths(70001);
  for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = int((i * 7919) % 4);  // 0..3 tokens
  analysis::InputShape shape;
  shape.lengths = lengths;
  shape.q_heads = 2, shape.kv_heads = 1, shape.head_dim = 8;
  const analysis::AttentionInputs in = analysis::random_inputs(shape, 11);
  EXPECT_TRUE(gpu_matches_cpu(in.q, in.docs, geometry, rule));
}

INSTANTIATE_TEST_SUITE_P(Quantize, QuantizeEdges, ::testing::Combine(kGeometries, kRules), rule_param_name);

TEST_F(Gpu, QuantizeRejectsBadShapes) {
  const auto bad = [](int heads, int dim) {
    return cuda::launch_quantize_mxfp8(nullptr, 0, 0, 1, heads, dim, nullptr, 1, ScaleGeometry::kBlock32,
                                       ScaleRule::kCeil, nullptr, nullptr, nullptr, nullptr);
  };
  EXPECT_EQ(bad(1, 0), cudaErrorInvalidValue);
  EXPECT_EQ(bad(1, 12), cudaErrorInvalidValue);
  EXPECT_EQ(bad(1, 264), cudaErrorInvalidValue);
  EXPECT_EQ(bad(0, 64), cudaErrorInvalidValue);
  EXPECT_EQ(bad(1, 64), cudaErrorInvalidValue);  // null pointers with work to do
}

// Malformed cu_seqlens (decreasing, negative, past the end) are clamped: the kernels finish
// without error and write nothing outside their outputs (guard bytes around them stay intact).
TEST_F(Gpu, MalformedCuSeqlensStayInBounds) {
  const int T = 64, H = 2, D = 64, kGuard = 4096;
  const std::vector<int32_t> cu = {0, 50, 10, -5, 1000, 64, 2000000000, -2000000000};
  const int num_docs = int(cu.size()) - 1;
  DeviceBuffer<__nv_bfloat16> x(std::vector<__nv_bfloat16>(size_t(T) * H * D, to_bf16(1.5)));
  DeviceBuffer<int32_t> dcu(cu);
  DeviceBuffer<uint8_t> codes(size_t(T) * H * D + 2 * kGuard), scales(size_t(T) * H + 2 * kGuard),
      prefix(size_t(T) * H + 2 * kGuard);
  codes.fill_bytes(kSentinel);
  scales.fill_bytes(kSentinel);
  prefix.fill_bytes(kSentinel);
  for (ScaleGeometry g : {ScaleGeometry::kBlock32, ScaleGeometry::kToken}) {
    CUDA_CHECK(cuda::launch_quantize_mxfp8(x.get(), int64_t(H) * D, D, T, H, D, dcu.get(), num_docs, g,
                                           ScaleRule::kCeil, codes.get() + kGuard, nullptr, scales.get() + kGuard, nullptr));
  }
  // The scan per head byte (H) and per four-head word (the same bytes as T * H / 4 tokens of 4 heads).
  for (int heads : {H, 4})
    for (int max_doc_len : {1, std::numeric_limits<int>::max()})  // both grids: per document, per chunk
      CUDA_CHECK(cuda::launch_prefix_max_scales(scales.get() + kGuard, T * H / heads, heads, dcu.get(), num_docs,
                                                max_doc_len, prefix.get() + kGuard, nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  for (const auto* buf : {&codes, &scales, &prefix}) {
    const std::vector<uint8_t> host = buf->download();
    for (int i = 0; i < kGuard; ++i) {
      ASSERT_EQ(host[size_t(i)], kSentinel) << "write before the output at " << i - kGuard;
      ASSERT_EQ(host[host.size() - 1 - size_t(i)], kSentinel) << "write after the output at +" << kGuard - 1 - i;
    }
  }
}

// A second, block32 encoding in the per-token pass (prefix isolation's interior codes of K and V):
// the per-token outputs are bitwise those of a per-token launch alone, the second ones those of a
// block32 launch alone, except each document's last skip_tiles tiles, whose second codes, scales
// and transposed slots stay untouched (no pair reads them). Documents shorter than, equal to and
// longer than the skipped tiles, at unaligned starts, both code layouts, and a launch without the
// second's row layout.
TEST_F(Gpu, SecondBlock32EncodingMatchesItsOwnLaunch) {
  constexpr int kTile = 128, kTiles = 2, H = 3, D = 64;
  analysis::InputShape shape;
  shape.lengths = {5, 128, 129, 300, 0, 1000, 256, 257, 33, 385};
  shape.q_heads = H, shape.kv_heads = H, shape.head_dim = D;
  const analysis::AttentionInputs in = analysis::random_inputs(shape, 21);
  const Documents& docs = in.docs;
  const int T = docs.total_tokens();
  DeviceBuffer<__nv_bfloat16> x(contiguous(in.q));
  DeviceBuffer<int32_t> cu(docs.cu_seqlens());
  const size_t pitch = size_t(layout::transposed_tokens(T, docs.count()));
  struct Outputs {
    DeviceBuffer<uint8_t> codes, scales, transposed;
    Outputs(size_t n_codes, size_t n_scales, size_t n_transposed)
        : codes(n_codes), scales(n_scales), transposed(n_transposed) {
      codes.fill_bytes(kSentinel);
      scales.fill_bytes(kSentinel);
      transposed.fill_bytes(kSentinel);
    }
  };
  auto outputs = [&] { return Outputs(size_t(T) * H * D, size_t(T) * H, size_t(H) * D * pitch); };
  auto launch = [&](ScaleGeometry g, Outputs& o, const cuda::BlockCodes* second) {
    return cuda::launch_quantize_mxfp8(x.get(), int64_t(H) * D, D, T, H, D, cu.get(), docs.count(), g, ScaleRule::kCeil,
                                       o.codes.get(), o.transposed.get(), o.scales.get(), nullptr, second);
  };
  Outputs token = outputs(), block = outputs(), first = outputs(), second = outputs(), second_t = outputs();
  CUDA_CHECK(launch(ScaleGeometry::kToken, token, nullptr));
  CUDA_CHECK(launch(ScaleGeometry::kBlock32, block, nullptr));
  const cuda::BlockCodes both{second.codes.get(), second.transposed.get(), second.scales.get(), kTile, kTiles};
  CUDA_CHECK(launch(ScaleGeometry::kToken, first, &both));
  Outputs first_again = outputs();
  const cuda::BlockCodes transposed_only{nullptr, second_t.transposed.get(), second_t.scales.get(), kTile, kTiles};
  CUDA_CHECK(launch(ScaleGeometry::kToken, first_again, &transposed_only));
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(launch(ScaleGeometry::kBlock32, first_again, &both), cudaErrorInvalidValue)
      << "the first must be per token";
  cuda::BlockCodes odd = both;
  odd.skip_tile = 48;
  EXPECT_EQ(launch(ScaleGeometry::kToken, first_again, &odd), cudaErrorInvalidValue) << "whole 32-token steps";

  EXPECT_EQ(first.codes.download(), token.codes.download());
  EXPECT_EQ(first.scales.download(), token.scales.download());
  EXPECT_EQ(first.transposed.download(), token.transposed.download());
  const auto ref_codes = block.codes.download(), ref_scales = block.scales.download();
  const auto ref_transposed = block.transposed.download();
  const auto got_codes = second.codes.download(), got_scales = second.scales.download();
  const auto got_transposed = second.transposed.download(), got_transposed_only = second_t.transposed.download();
  const auto got_scales_only = second_t.scales.download();
  int64_t encoded = 0, skipped = 0;
  for (int doc = 0; doc < docs.count(); ++doc) {
    const int len = docs.length(doc), last_tile = std::max(0, ((len + kTile - 1) / kTile - kTiles) * kTile);
    const int64_t first_slot = layout::transposed_document_start(docs.begin(doc), doc);
    for (int p = 0; p < len; ++p) {
      const bool skip = p >= last_tile;
      (skip ? skipped : encoded) += 1;
      for (int h = 0; h < H; ++h) {
        const size_t si = size_t(docs.begin(doc) + p) * H + h;
        ASSERT_EQ(got_scales[si], skip ? kSentinel : ref_scales[si]) << "doc " << doc << " position " << p;
        ASSERT_EQ(got_scales_only[si], got_scales[si]) << "doc " << doc << " position " << p;
        for (int f = 0; f < D; ++f) {
          const size_t c = si * D + f, tc = (size_t(h) * D + f) * pitch + size_t(first_slot + p);
          ASSERT_EQ(got_codes[c], skip ? kSentinel : ref_codes[c]) << "doc " << doc << " position " << p;
          ASSERT_EQ(got_transposed[tc], skip ? kSentinel : ref_transposed[tc]) << "doc " << doc << " slot " << p;
          ASSERT_EQ(got_transposed_only[tc], got_transposed[tc]) << "doc " << doc << " slot " << p;
        }
      }
    }
  }
  EXPECT_GT(encoded, 0);
  EXPECT_GT(skipped, 0);
}

// D_i beside dO's codes (row_delta, the backward's deterministic passes): the codes, scales and
// transposed layout are bitwise those of a launch without it, and every row's D_i is the host's sum
// in cuda/gradient_row_dot.cuh's order (per lane of D / 8, 8 fused multiply-adds in feature order,
// then a butterfly over the row's lanes) times 2^e of the row's scale: bitwise, NaN where the row's
// group holds a NaN. Both head dims and geometries, 5 heads (a partial head group), unaligned and
// empty documents, dO strided inside a wider buffer. Views that need scalar loads are refused.
TEST_F(Gpu, RowDeltaBesideTheCodesMatchesTheHostSum) {
  for (const int D : {64, 128})
    for (const ScaleGeometry g : {ScaleGeometry::kBlock32, ScaleGeometry::kToken})
      for (const bool strided : {false, true}) {
        SCOPED_TRACE("D " + std::to_string(D) + (g == ScaleGeometry::kToken ? " token" : " block32") +
                     (strided ? " strided" : ""));
        constexpr int H = 5;
        analysis::InputShape shape;
        shape.lengths = {5, 128, 0, 129, 300, 31, 257};
        shape.q_heads = H, shape.kv_heads = H, shape.head_dim = D;
        analysis::AttentionInputs in = analysis::random_inputs(shape, 40 + D);
        const Documents& docs = in.docs;
        const int T = docs.total_tokens();
        in.q.at(140, 2, 7) = NAN;  // one group of dO holds a NaN: its rows' D_i are NaN
        const View view = strided ? View{8, int64_t(H) * (D + 8) + 16, D + 8} : View{0, int64_t(H) * D, D};
        const size_t size = view.offset + size_t(T) * view.token_stride + 8;
        DeviceBuffer<__nv_bfloat16> x(embed(in.q, size, view.offset, view.token_stride, view.head_stride));
        DeviceBuffer<__nv_bfloat16> o(contiguous(in.k));
        DeviceBuffer<int32_t> cu(docs.cu_seqlens());
        const size_t pitch = size_t(layout::transposed_tokens(T, docs.count()));
        DeviceBuffer<uint8_t> codes(size_t(T) * H * D), scales(size_t(T) * H), transposed(size_t(H) * D * pitch);
        DeviceBuffer<uint8_t> codes_alone(size_t(T) * H * D), scales_alone(size_t(T) * H),
            transposed_alone(size_t(H) * D * pitch);
        DeviceBuffer<float> delta(size_t(H) * T);
        for (auto* b : {&codes, &scales, &transposed, &codes_alone, &scales_alone, &transposed_alone})
          b->fill_bytes(kSentinel);
        delta.fill_bytes(kSentinel);
        const cuda::RowDelta row_delta{o.get(), int64_t(H) * D, D, delta.get()};
        auto launch = [&](DeviceBuffer<uint8_t>& c, DeviceBuffer<uint8_t>& t, DeviceBuffer<uint8_t>& s,
                          const cuda::RowDelta* rd) {
          return cuda::launch_quantize_mxfp8(x.get() + view.offset, view.token_stride, view.head_stride, T, H, D,
                                             cu.get(), docs.count(), g, ScaleRule::kCeil, c.get(), t.get(), s.get(),
                                             nullptr, nullptr, rd);
        };
        CUDA_CHECK(launch(codes, transposed, scales, &row_delta));
        CUDA_CHECK(launch(codes_alone, transposed_alone, scales_alone, nullptr));
        CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_EQ(codes.download(), codes_alone.download());
        ASSERT_EQ(scales.download(), scales_alone.download());
        ASSERT_EQ(transposed.download(), transposed_alone.download());

        const std::vector<uint8_t> c = codes.download(), s = scales.download();
        const std::vector<float> got = delta.download();
        const int lanes = D / 8;
        int nan_rows = 0;
        for (int t = 0; t < T; ++t)
          for (int h = 0; h < H; ++h) {
            std::vector<float> lane_sum(size_t(lanes), 0.f);
            for (int j = 0; j < lanes; ++j)
              for (int f = 8 * j; f < 8 * j + 8; ++f)
                lane_sum[j] = std::fmaf(float(formats::decode_e4m3(c[(size_t(t) * H + h) * D + f])),
                                        float(in.k.at(t, h, f)), lane_sum[j]);
            for (int m = lanes / 2; m > 0; m >>= 1) {
              std::vector<float> next(lane_sum);
              for (int j = 0; j < lanes; ++j) next[j] = lane_sum[j] + lane_sum[j ^ m];
              lane_sum = next;
            }
            const uint8_t scale = s[size_t(t) * H + h];
            const float want = scale == formats::kUe8m0NaN ? NAN : lane_sum[0] * std::ldexp(1.f, int(scale) - 127);
            const float have = got[size_t(h) * T + t];
            if (std::isnan(want)) {
              ++nan_rows;
              ASSERT_TRUE(std::isnan(have)) << "token " << t << " head " << h;
            } else {
              ASSERT_EQ(std::bit_cast<uint32_t>(have), std::bit_cast<uint32_t>(want))
                  << "token " << t << " head " << h << ": " << have << " vs " << want;
            }
          }
        EXPECT_GT(nan_rows, 0) << "the planted NaN must reach D_i";
        cuda::RowDelta bad = row_delta;
        bad.o = o.get() + 1;  // O's rows must be 16-byte aligned
        EXPECT_EQ(launch(codes, transposed, scales, &bad), cudaErrorInvalidValue);
        EXPECT_EQ(cuda::launch_quantize_mxfp8(x.get() + 1, view.token_stride, view.head_stride, T, H, D, cu.get(),
                                              docs.count(), g, ScaleRule::kCeil, codes.get(), transposed.get(),
                                              scales.get(), nullptr, nullptr, &row_delta),
                  cudaErrorInvalidValue)
            << "dO must take 16-byte loads";
      }
}

// ---- the V fold reference: running max of the scale exponents ------------------------------

// The CPU loop, written on exponents as the route does (NaN wins), then encoded back to UE8M0.
std::vector<uint8_t> cpu_prefix_max(const std::vector<uint8_t>& scales, const Documents& docs, int heads) {
  std::vector<uint8_t> out(scales.size(), uint8_t(kSentinel));
  for (int d = 0; d < docs.count(); ++d) {
    for (int h = 0; h < heads; ++h) {
      double running = -INFINITY;
      for (int t = docs.begin(d); t < docs.end(d); ++t) {
        const uint8_t s = scales[size_t(t) * heads + h];
        const double e = formats::ue8m0_is_nan(s) ? double(NAN) : double(formats::ue8m0_exponent(s));
        running = (std::isnan(running) || std::isnan(e)) ? double(NAN) : std::max(running, e);
        out[size_t(t) * heads + h] = std::isnan(running) ? formats::kUe8m0NaN : formats::encode_ue8m0(int(running));
      }
    }
  }
  return out;
}

// max_doc_len picks the grid: the longest document's length (one CTA per chunk when it exceeds a
// chunk) or 1 (one CTA per document, whatever its length).
std::vector<uint8_t> gpu_prefix_max(const std::vector<uint8_t>& scales, const Documents& docs, int heads,
                                    int max_doc_len) {
  DeviceBuffer<uint8_t> in(scales), out(scales.size());
  DeviceBuffer<int32_t> cu(docs.cu_seqlens());
  out.fill_bytes(kSentinel);
  CUDA_CHECK(cuda::launch_prefix_max_scales(in.get(), docs.total_tokens(), heads, cu.get(), docs.count(), max_doc_len,
                                            out.get(), nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}
int longest(const Documents& docs) {
  int n = 0;
  for (int d = 0; d < docs.count(); ++d) n = std::max(n, docs.end(d) - docs.begin(d));
  return n;
}

::testing::AssertionResult same_bytes(const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu, int heads) {
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (gpu[i] != cpu[i] && bad++ < 5)
      first << "\n  (t=" << i / heads << ", h=" << i % heads << "): gpu " << hex(gpu[i]) << ", cpu " << hex(cpu[i]);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << cpu.size() << " bytes differ; first ones:" << first.str();
}

TEST_F(Gpu, PrefixMaxOfRandomScales) {
  std::vector<int> lengths = kLengths;
  lengths.insert(lengths.begin() + 3, 0);
  const Documents docs = Documents::from_lengths(lengths);
  for (int heads : {1, 4, 12, 16}) {
    SCOPED_TRACE("heads " + std::to_string(heads));
    std::mt19937_64 rng{uint64_t(heads)};
    std::vector<uint8_t> scales(size_t(docs.total_tokens()) * heads);
    for (auto& s : scales) {
      const uint64_t r = rng();
      // Mostly exponents in a narrow band (so the max keeps changing), sometimes anywhere in
      // [0x00, 0xFE], rarely NaN.
      s = r % 1000 == 0 ? formats::kUe8m0NaN : r % 10 == 0 ? uint8_t((r >> 16) % 255) : uint8_t(120 + (r >> 16) % 8);
    }
    // Document 0: its first token is NaN, so all of it stays NaN; document 1 starts clean again.
    for (int h = 0; h < heads; ++h) scales[size_t(docs.begin(0)) * heads + h] = formats::kUe8m0NaN;
    for (int bound : {longest(docs), 1})
      EXPECT_TRUE(same_bytes(gpu_prefix_max(scales, docs, heads, bound), cpu_prefix_max(scales, docs, heads), heads))
          << "max_doc_len " << bound;
  }
}

// Long documents take one CTA per chunk of 1024 positions, each carrying the max of the positions
// before it (with max_doc_len 1, one CTA the whole document): scales that climb slowly (each
// chunk's first tokens below the carry, new maxima inside chunks), a NaN inside a later chunk of
// one head, a short document after them.
TEST_F(Gpu, PrefixMaxCarriesAcrossChunks) {
  const std::vector<int> lengths = {5000, 3 * 1024 + 1, 7, 2048};
  const Documents docs = Documents::from_lengths(lengths);
  const int heads = 3;
  std::mt19937_64 rng{7};
  std::vector<uint8_t> scales(size_t(docs.total_tokens()) * heads);
  for (int d = 0; d < docs.count(); ++d)
    for (int t = docs.begin(d); t < docs.end(d); ++t)
      for (int h = 0; h < heads; ++h)
        scales[size_t(t) * heads + h] = uint8_t(100 + (t - docs.begin(d)) / 300 + h - int(rng() % 4));
  scales[size_t(docs.begin(0) + 2500) * heads + 1] = formats::kUe8m0NaN;
  for (int bound : {longest(docs), 1})
    EXPECT_TRUE(same_bytes(gpu_prefix_max(scales, docs, heads, bound), cpu_prefix_max(scales, docs, heads), heads))
        << "max_doc_len " << bound;
}

// End to end: V quantized on the GPU with per-token scales (planted NaN, zero rows), then the
// fold reference, against the CPU quantizer's exponents.
TEST_F(Gpu, PrefixMaxOfQuantizedV) {
  analysis::InputShape shape;
  shape.lengths = kLengths;
  shape.q_heads = 1, shape.kv_heads = 4, shape.head_dim = 128;
  analysis::AttentionInputs in = analysis::random_inputs(shape, 21);
  PackedTensor& v = in.v;
  for (int t = 0; t < v.tokens; ++t)  // exponents drift up and down along each document
    for (int h = 0; h < v.heads; ++h)
      for (int f = 0; f < v.dim; ++f) v.at(t, h, f) = std::ldexp(v.at(t, h, f), (t % 37) / 3 - 6 + h);
  v.at(in.docs.begin(3) + 2000, 1, 5) = NAN;
  for (int f = 0; f < v.dim; ++f) v.at(in.docs.begin(5) + 10, 2, f) = 0.0;
  const Mxfp8Tensor ref = reference::quantize_mxfp8(v, in.docs, ScaleGeometry::kToken, ScaleRule::kCeil);
  const GpuQuantized gpu = gpu_quantize(contiguous(v), {}, in.docs, v.heads, v.dim, ScaleGeometry::kToken, ScaleRule::kCeil);
  ASSERT_TRUE(matches_reference(gpu, ref, v));
  EXPECT_TRUE(same_bytes(gpu_prefix_max(gpu.scales, in.docs, v.heads, longest(in.docs)),
                         cpu_prefix_max(ref.scales, in.docs, v.heads), v.heads));
}

}  // namespace
}  // namespace flamia
