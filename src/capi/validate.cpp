#include "capi/validate.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "core/documents.h"
#include "core/offsets_check.h"
#include "core/operand_layout.h"
#include "core/schedule.h"
#include "cuda/sm90/backward.h"

namespace flamia::capi {
namespace {

CallError invalid(std::string message) { return {FLAMIA_ERROR_INVALID_ARGUMENT, std::move(message)}; }
CallError unsupported(std::string message) { return {FLAMIA_ERROR_NOT_SUPPORTED, std::move(message)}; }

std::string str(int64_t v) { return std::to_string(v); }

constexpr int64_t kBf16Bytes = 2;

std::string address(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// The raw integer behind a C enum field. A C caller can store any int there; reading it as the
// enum type first would let the C++ compiler assume the value is in range.
template <typename E>
int raw_enum(const E& field) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized on the supported ABIs");
  int raw;
  std::memcpy(&raw, &field, sizeof raw);
  return raw;
}

std::string dtype_name(int dtype) {
  switch (dtype) {
    case FLAMIA_DTYPE_BF16: return "FLAMIA_DTYPE_BF16";
    case FLAMIA_DTYPE_FP16: return "FLAMIA_DTYPE_FP16";
    case FLAMIA_DTYPE_FP32: return "FLAMIA_DTYPE_FP32";
    default: return "unknown dtype " + std::to_string(dtype);
  }
}

// Per-tensor shape fields: BF16 and every extent >= 1.
CallError check_tensor_shape(const flamia_tensor& t, std::string_view name) {
  const std::string n(name);
  if (const int dtype = raw_enum(t.dtype); dtype != FLAMIA_DTYPE_BF16)
    return invalid(n + ".dtype must be FLAMIA_DTYPE_BF16, got " + dtype_name(dtype));
  if (t.tokens < 1) return invalid(n + ".tokens (T) must be >= 1, got " + str(t.tokens));
  if (t.heads < 1) return invalid(n + ".heads must be >= 1, got " + str(t.heads));
  if (t.dim < 1) return invalid(n + ".dim must be >= 1, got " + str(t.dim));
  return CallError::success();
}

CallError check_equal(std::string_view a_name, int64_t a, std::string_view b_name, int64_t b) {
  if (a == b) return CallError::success();
  return invalid(std::string(a_name) + " (" + str(a) + ") must equal " + std::string(b_name) + " (" + str(b) + ")");
}

#define FLAMIA_RETURN_IF_ERROR(expr)  \
  do {                                \
    CallError flamia_err_ = (expr);   \
    if (!flamia_err_.ok()) return flamia_err_; \
  } while (0)

// Shapes of q, k, v and (when not NULL) o, each alone and against each other. INVALID_ARGUMENT only.
CallError check_shapes(const flamia_tensor& q, const flamia_tensor& k, const flamia_tensor& v, const flamia_tensor* o) {
  FLAMIA_RETURN_IF_ERROR(check_tensor_shape(q, "q"));
  FLAMIA_RETURN_IF_ERROR(check_tensor_shape(k, "k"));
  FLAMIA_RETURN_IF_ERROR(check_tensor_shape(v, "v"));
  if (o) FLAMIA_RETURN_IF_ERROR(check_tensor_shape(*o, "o"));
  FLAMIA_RETURN_IF_ERROR(check_equal("k.tokens", k.tokens, "q.tokens", q.tokens));
  FLAMIA_RETURN_IF_ERROR(check_equal("v.tokens", v.tokens, "q.tokens", q.tokens));
  FLAMIA_RETURN_IF_ERROR(check_equal("k.dim", k.dim, "q.dim", q.dim));
  FLAMIA_RETURN_IF_ERROR(check_equal("v.dim", v.dim, "q.dim", q.dim));
  FLAMIA_RETURN_IF_ERROR(check_equal("v.heads", v.heads, "k.heads", k.heads));
  if (q.heads % k.heads != 0) {
    return invalid("q.heads (" + str(q.heads) + ") must be a multiple of k.heads (" + str(k.heads) +
                   "): each K/V head serves q.heads / k.heads query heads");
  }
  if (o) {
    FLAMIA_RETURN_IF_ERROR(check_equal("o.tokens", o->tokens, "q.tokens", q.tokens));
    FLAMIA_RETURN_IF_ERROR(check_equal("o.heads", o->heads, "q.heads", q.heads));
    FLAMIA_RETURN_IF_ERROR(check_equal("o.dim", o->dim, "q.dim", q.dim));
  }
  return CallError::success();
}

// t shaped exactly like ref (a gradient like its tensor). INVALID_ARGUMENT only.
CallError check_like(const flamia_tensor& t, std::string_view name, const flamia_tensor& ref, std::string_view ref_name) {
  FLAMIA_RETURN_IF_ERROR(check_tensor_shape(t, name));
  const std::string n(name), r(ref_name);
  FLAMIA_RETURN_IF_ERROR(check_equal(n + ".tokens", t.tokens, r + ".tokens", ref.tokens));
  FLAMIA_RETURN_IF_ERROR(check_equal(n + ".heads", t.heads, r + ".heads", ref.heads));
  return check_equal(n + ".dim", t.dim, r + ".dim", ref.dim);
}

// What the kernels of this build support (run after every INVALID_ARGUMENT check).
CallError check_limits(const flamia_tensor& q, const flamia_tensor& k) {
  if (!head_dim_supported(q.dim)) {
    return unsupported("head_dim (q.dim) " + str(q.dim) +
                       " is not supported: this build has kernels for head_dim 64 and 128");
  }
  if (q.heads > kMaxHeads)
    return unsupported("q.heads (" + str(q.heads) + ") exceeds " + str(kMaxHeads) + ", the most heads the kernels launch");
  for (const auto& [t, name] : {std::pair<const flamia_tensor&, const char*>{q, "q"}, {k, "k"}}) {
    int64_t th = 0, thd = 0;
    const bool overflow = __builtin_mul_overflow(t.tokens, t.heads, &th) || __builtin_mul_overflow(th, t.dim, &thd);
    if (overflow || thd > kMaxElements) {
      return unsupported(std::string(name) + " has tokens * heads * dim = " + str(t.tokens) + " * " + str(t.heads) +
                         " * " + str(t.dim) + (overflow ? " (overflows int64)" : " = " + str(thd)) +
                         " elements, more than the 2^31 - 1 that the kernels' int32 indexing allows");
    }
  }
  return CallError::success();
}

// Data pointer and strides of one tensor. Outputs must also not overlap themselves.
CallError check_layout(const flamia_tensor& t, std::string_view name, bool output) {
  const std::string n(name);
  if (t.data == nullptr) return invalid(n + ".data is NULL");
  if (reinterpret_cast<uintptr_t>(t.data) % kDataAlignment != 0)
    return invalid(n + ".data must be 16-byte aligned, got address " + address(t.data));
  for (const auto& [stride, sname] : {std::pair<int64_t, const char*>{t.stride_token, "stride_token"},
                                      {t.stride_head, "stride_head"}}) {
    if (stride < t.dim) {
      return invalid(n + "." + sname + " (" + str(stride) + ") must be >= " + n + ".dim (" + str(t.dim) +
                     "): the dim axis is contiguous and rows must not overlap");
    }
    if (stride % kStrideMultiple != 0) {
      return invalid(n + "." + sname + " (" + str(stride) +
                     ") must be a multiple of 8 elements, so that every row is 16-byte aligned");
    }
  }
  // The last element's offset in bytes must fit int64 and the address space (no wrap-around).
  int64_t last = 0, term = 0, bytes = 0;
  const bool wraps = __builtin_mul_overflow(t.tokens - 1, t.stride_token, &last) ||
                     __builtin_mul_overflow(t.heads - 1, t.stride_head, &term) ||
                     __builtin_add_overflow(last, term, &last) || __builtin_add_overflow(last, t.dim, &last) ||
                     __builtin_mul_overflow(last, int64_t(kBf16Bytes), &bytes) ||
                     uint64_t(bytes) > UINTPTR_MAX - reinterpret_cast<uintptr_t>(t.data);
  if (wraps) {
    return invalid(n + " spans (tokens - 1) * stride_token + (heads - 1) * stride_head + dim = (" + str(t.tokens) +
                   " - 1) * " + str(t.stride_token) + " + (" + str(t.heads) + " - 1) * " + str(t.stride_head) + " + " +
                   str(t.dim) + " elements from " + n + ".data, which wraps int64 or the address space");
  }
  if (output && t.tokens > 1 && t.heads > 1) {
    // Rows of an output must be distinct: the axis with the larger stride has to step over the
    // whole extent of the other one ([T, H, D] or [H, T, D] order, padding allowed).
    const bool token_outer = t.stride_token >= t.stride_head;
    const int64_t outer = token_outer ? t.stride_token : t.stride_head;
    const int64_t inner = token_outer ? t.stride_head : t.stride_token;
    const int64_t inner_extent = token_outer ? t.heads : t.tokens;
    int64_t span = 0;
    if (__builtin_mul_overflow(inner_extent, inner, &span) || outer < span) {
      const std::string outer_name = n + (token_outer ? ".stride_token" : ".stride_head");
      const std::string inner_name = token_outer ? n + ".heads * " + n + ".stride_head" : n + ".tokens * " + n + ".stride_token";
      return invalid(outer_name + " (" + str(outer) + ") must be >= " + inner_name + " (" + str(inner_extent) + " * " +
                     str(inner) + "): rows of the output would overlap");
    }
  }
  return CallError::success();
}

// Where a tensor's rows lie, in bytes from address 0: n_outer x n_inner rows of row_bytes, row (i, j)
// at begin + i * outer + j * inner. An output's rows are disjoint and in (i, j) order (check_layout:
// inner >= row_bytes, outer >= n_inner * inner), so its footprint can be searched; an input's rows
// need not be.
struct Footprint {
  std::string name;
  uint64_t begin = 0, outer = 0, inner = 0, row_bytes = 0;
  int64_t n_outer = 1, n_inner = 1;
  uint64_t end() const { return begin + uint64_t(n_outer - 1) * outer + uint64_t(n_inner - 1) * inner + row_bytes; }
  int64_t rows() const { return n_outer * n_inner; }
};

// A tensor that passed check_layout (its span fits the address space), the larger stride outer.
Footprint footprint(const flamia_tensor& t, std::string name) {
  Footprint f;
  f.name = std::move(name);
  f.begin = reinterpret_cast<uintptr_t>(t.data);
  f.row_bytes = uint64_t(t.dim) * kBf16Bytes;
  const bool token_outer = t.stride_token >= t.stride_head;
  f.n_outer = token_outer ? t.tokens : t.heads;
  f.n_inner = token_outer ? t.heads : t.tokens;
  f.outer = uint64_t(token_outer ? t.stride_token : t.stride_head) * kBf16Bytes;
  f.inner = uint64_t(token_outer ? t.stride_head : t.stride_token) * kBf16Bytes;
  return f;
}

// lse: FP32 [Hq, T], contiguous.
Footprint lse_footprint(const float* lse, int64_t q_heads, int64_t tokens) {
  Footprint f;
  f.name = "lse";
  f.begin = reinterpret_cast<uintptr_t>(lse);
  f.row_bytes = uint64_t(q_heads) * uint64_t(tokens) * sizeof(float);
  return f;
}

// Whether some row of the ordered footprint `o` (an output's) overlaps the bytes [lo, hi).
bool ordered_rows_hit(const Footprint& o, uint64_t lo, uint64_t hi) {
  if (hi <= o.begin || lo >= o.end()) return false;
  // The last row that starts before hi ends furthest of those that do (rows are disjoint, sorted).
  const uint64_t at = hi - 1 - o.begin;
  const int64_t i = o.n_outer == 1 ? 0 : std::min<int64_t>(int64_t(at / o.outer), o.n_outer - 1);
  const uint64_t in_outer = at - uint64_t(i) * o.outer;
  const int64_t j = o.n_inner == 1 ? 0 : std::min<int64_t>(int64_t(in_outer / o.inner), o.n_inner - 1);
  const uint64_t row_end = o.begin + uint64_t(i) * o.outer + uint64_t(j) * o.inner + o.row_bytes;
  return row_end > lo;
}

// Whether the ordered footprint `o` shares a byte with `x` (any footprint): their spans first, then
// row by row through x (only when the spans meet, e.g. tensors interleaved in one buffer).
bool overlaps(const Footprint& o, const Footprint& x) {
  if (x.end() <= o.begin || o.end() <= x.begin) return false;
  for (int64_t i = 0; i < x.n_outer; ++i) {
    for (int64_t j = 0; j < x.n_inner; ++j) {
      const uint64_t lo = x.begin + uint64_t(i) * x.outer + uint64_t(j) * x.inner;
      if (ordered_rows_hit(o, lo, lo + x.row_bytes)) return true;
    }
  }
  return false;
}

// No output shares memory with another output or with an input (the kernels read inputs while
// they write outputs, and write every output once). Outputs come first in `footprints`.
CallError check_no_aliasing(const std::vector<Footprint>& footprints, size_t outputs) {
  for (size_t a = 0; a < outputs; ++a) {
    for (size_t b = 0; b < footprints.size(); ++b) {
      if (b == a || (b < outputs && b < a)) continue;  // each pair of outputs once
      const Footprint& o = footprints[a];
      const Footprint& x = footprints[b];
      if (!overlaps(o, x)) continue;
      return invalid(o.name + " and " + x.name + " share memory (" + o.name + " spans [" +
                     address(reinterpret_cast<const void*>(o.begin)) + ", " +
                     address(reinterpret_cast<const void*>(o.end())) + "), " + x.name + " [" +
                     address(reinterpret_cast<const void*>(x.begin)) + ", " +
                     address(reinterpret_cast<const void*>(x.end())) + ")): " +
                     (b < outputs ? "outputs must not alias each other" : "an output must not overlap an input"));
    }
  }
  return CallError::success();
}

// A host copy of cu_seqlens: the device check's rule and message (core/offsets_check.h), then,
// when max_seqlen > 0, the bound max_seqlen >= the longest document. name and max_name: how the
// messages call the array and the bound. record (when not null) receives the device's record.
CallError check_offsets_on_host(std::span<const int32_t> cu, int64_t total_tokens, int32_t max_seqlen,
                                const std::string& name, const std::string& max_name, OffsetsRecord* record) {
  const OffsetsRecord r = check_cu_seqlens(cu, total_tokens);
  if (record) *record = r;
  if (r.kind != int32_t(OffsetsError::kOk)) return invalid(describe_offsets_error(r, name));
  if (max_seqlen <= 0) return CallError::success();
  int longest = 0;
  size_t longest_doc = 0;
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    if (const int len = cu[d + 1] - cu[d]; len > longest) longest = len, longest_doc = d;
  }
  if (max_seqlen < longest) {
    return invalid(max_name + " (" + str(max_seqlen) + ") is smaller than the longest document (" + str(longest) +
                   " tokens: document " + std::to_string(longest_doc) + " of " + name + ")");
  }
  return CallError::success();
}

CallError check_documents(const flamia_documents& docs, int64_t total_tokens) {
  if (docs.cu_seqlens == nullptr) return invalid("docs.cu_seqlens (the device copy) is NULL");
  if (reinterpret_cast<uintptr_t>(docs.cu_seqlens) % alignof(int32_t) != 0)
    return invalid("docs.cu_seqlens must be 4-byte aligned (int32), got address " + address(docs.cu_seqlens));
  if (docs.num_docs < 1) return invalid("docs.num_docs must be >= 1, got " + str(docs.num_docs));
  if (docs.max_seqlen < 1 || docs.max_seqlen > total_tokens) {
    return invalid("docs.max_seqlen must lie in [1, T = " + str(total_tokens) + "], got " + str(docs.max_seqlen));
  }
  if (docs.status != nullptr && reinterpret_cast<uintptr_t>(docs.status) % alignof(OffsetsRecord) != 0)
    return invalid("docs.status must be 16-byte aligned, got address " + address(docs.status));
  if (docs.cu_seqlens_host == nullptr) return CallError::success();
  return check_offsets_on_host({docs.cu_seqlens_host, size_t(docs.num_docs) + 1}, total_tokens, docs.max_seqlen,
                               "docs.cu_seqlens_host", "docs.max_seqlen", nullptr);
}

// A C enum field against its core table (core/options.h): valid when an entry with a C constant
// has the raw value; else a message listing those constants and their values.
template <OptionEnum E>
CallError check_c_enum(int raw, std::string_view field) {
  std::string valid;
  for (const EnumName<E>& e : enum_names<E>()) {
    if (e.c_name.empty()) continue;
    if (int(e.value) == raw) return CallError::success();
    valid += (valid.empty() ? "" : " or ") + std::string(e.c_name) + " (" + str(int(e.value)) + ")";
  }
  return invalid(std::string(field) + " must be " + valid + ", got " + str(raw));
}

// Whether a flamia.h constant has the value of `value` and is the c_name of its table entry, so that
// the table's names, check_c_enum's messages and attention_options' casts agree with the header.
template <OptionEnum E>
constexpr bool c_constant_matches(int constant, E value, std::string_view c_name) {
  for (const EnumName<E>& e : enum_names<E>())
    if (e.value == value) return constant == int(value) && e.c_name == c_name;
  return false;
}
template <OptionEnum E>
constexpr int c_constants() {
  int n = 0;
  for (const EnumName<E>& e : enum_names<E>()) n += e.c_name.empty() ? 0 : 1;
  return n;
}
#define FLAMIA_C_CONSTANT(constant, value) \
  static_assert(c_constant_matches(constant, value, #constant), #constant " must spell " #value " in core/options.h")
FLAMIA_C_CONSTANT(FLAMIA_ISOLATION_DOCUMENT, Isolation::kDocument);
FLAMIA_C_CONSTANT(FLAMIA_ISOLATION_PREFIX, Isolation::kPrefix);
FLAMIA_C_CONSTANT(FLAMIA_SCALE_BLOCK32, ScaleGeometry::kBlock32);
FLAMIA_C_CONSTANT(FLAMIA_SCALE_TOKEN, ScaleGeometry::kToken);
FLAMIA_C_CONSTANT(FLAMIA_SCALE_RULE_CEIL, ScaleRule::kCeil);
FLAMIA_C_CONSTANT(FLAMIA_SCALE_RULE_FLOOR, ScaleRule::kFloor);
#undef FLAMIA_C_CONSTANT
static_assert(c_constants<Isolation>() == 2 && c_constants<ScaleGeometry>() == 2 && c_constants<ScaleRule>() == 2,
              "every C constant of an option table is checked above");
static_assert(c_constants<Route>() == 0 && c_constants<UScaleGeometry>() == 0 && c_constants<DqReduction>() == 0,
              "emulation-only enums have no C constants");
static_assert(FLAMIA_P_BOOST_LOG2_DEFAULT == kPBoostLog2Default && FLAMIA_P_BOOST_LOG2_MAX == kPBoostLog2Max,
              "flamia.h spells core/options.h's P boost default and range");

CallError check_options(const flamia_options& options, int64_t head_dim) {
  if (options.causal != 0 && options.causal != 1)
    return invalid("options.causal must be 0 or 1, got " + str(options.causal));
  // +0 is the C API's "default" (1/sqrt(head_dim)); -0, like any negative value, is refused.
  if (!std::isfinite(options.softmax_scale) || std::signbit(options.softmax_scale)) {
    char value[48];
    std::snprintf(value, sizeof value, "%g", double(options.softmax_scale));
    return invalid(std::string("options.softmax_scale must be finite and > 0, or +0 for the default 1/sqrt(head_dim); got ") +
                   value);
  }
  FLAMIA_RETURN_IF_ERROR(check_c_enum<Isolation>(raw_enum(options.isolation), "options.isolation"));
  FLAMIA_RETURN_IF_ERROR(check_c_enum<ScaleGeometry>(raw_enum(options.scale_geometry), "options.scale_geometry"));
  FLAMIA_RETURN_IF_ERROR(check_c_enum<ScaleRule>(raw_enum(options.scale_rule), "options.scale_rule"));
  if (options.deterministic != 0 && options.deterministic != 1)
    return invalid("options.deterministic must be 0 or 1, got " + str(options.deterministic));
  // The combination rules are the core's (core/options.h), which the emulation applies too, so the
  // CPU spec and the C API refuse exactly the same options.
  if (const std::optional<std::string> e = options_error(attention_options(options), int(head_dim))) {
    return invalid("options: " + *e + " (options.p_boost_log2 = " + str(options.p_boost_log2) +
                   ", options.causal = " + str(options.causal) + ")");
  }
  return CallError::success();
}

size_t align_up(size_t n) { return (n + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment; }

}  // namespace

CallError validate_shapes(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v) {
  if (q == nullptr) return invalid("q is NULL");
  if (k == nullptr) return invalid("k is NULL");
  if (v == nullptr) return invalid("v is NULL");
  FLAMIA_RETURN_IF_ERROR(check_shapes(*q, *k, *v, nullptr));
  return check_limits(*q, *k);
}

CallError validate_forward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                           const flamia_documents* docs, const flamia_options* options, const flamia_tensor* o,
                           const float* lse) {
  if (q == nullptr) return invalid("q is NULL");
  if (k == nullptr) return invalid("k is NULL");
  if (v == nullptr) return invalid("v is NULL");
  if (docs == nullptr) return invalid("docs is NULL");
  if (options == nullptr) return invalid("options is NULL (flamia_default_options fills the defaults)");
  if (o == nullptr) return invalid("o is NULL");
  if (lse == nullptr) return invalid("lse is NULL");

  FLAMIA_RETURN_IF_ERROR(check_shapes(*q, *k, *v, o));
  FLAMIA_RETURN_IF_ERROR(check_layout(*q, "q", false));
  FLAMIA_RETURN_IF_ERROR(check_layout(*k, "k", false));
  FLAMIA_RETURN_IF_ERROR(check_layout(*v, "v", false));
  FLAMIA_RETURN_IF_ERROR(check_layout(*o, "o", true));
  if (reinterpret_cast<uintptr_t>(lse) % alignof(float) != 0)
    return invalid("lse must be 4-byte aligned (FP32), got address " + address(lse));
  FLAMIA_RETURN_IF_ERROR(check_no_aliasing(
      {footprint(*o, "o"), lse_footprint(lse, q->heads, q->tokens), footprint(*q, "q"), footprint(*k, "k"),
       footprint(*v, "v")},
      2));
  FLAMIA_RETURN_IF_ERROR(check_documents(*docs, q->tokens));
  FLAMIA_RETURN_IF_ERROR(check_options(*options, q->dim));
  return check_limits(*q, *k);
}

CallError validate_backward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                            const flamia_tensor* o, const float* lse, const flamia_tensor* dout,
                            const flamia_documents* docs, const flamia_options* options, const flamia_tensor* dq,
                            const flamia_tensor* dk, const flamia_tensor* dv, QkvCodes codes) {
  const std::pair<const void*, const char*> required[] = {
      {q, "q is NULL"},       {k, "k is NULL"},   {v, "v is NULL"},   {o, "o is NULL (the forward's output)"},
      {lse, "lse is NULL (the forward's lse)"}, {dout, "dout is NULL"}, {docs, "docs is NULL"},
      {options, "options is NULL (flamia_default_options fills the defaults)"},
      {dq, "dq is NULL"},     {dk, "dk is NULL"}, {dv, "dv is NULL"}};
  for (const auto& [ptr, message] : required)
    if (ptr == nullptr) return invalid(message);

  FLAMIA_RETURN_IF_ERROR(check_shapes(*q, *k, *v, o));
  FLAMIA_RETURN_IF_ERROR(check_like(*dout, "dout", *q, "q"));
  FLAMIA_RETURN_IF_ERROR(check_like(*dq, "dq", *q, "q"));
  FLAMIA_RETURN_IF_ERROR(check_like(*dk, "dk", *k, "k"));
  FLAMIA_RETURN_IF_ERROR(check_like(*dv, "dv", *k, "k"));
  if (codes == QkvCodes::kInWorkspace) {  // else their codes come from the saved buffer
    FLAMIA_RETURN_IF_ERROR(check_layout(*q, "q", false));
    FLAMIA_RETURN_IF_ERROR(check_layout(*k, "k", false));
    FLAMIA_RETURN_IF_ERROR(check_layout(*v, "v", false));
  }
  FLAMIA_RETURN_IF_ERROR(check_layout(*o, "o", false));
  FLAMIA_RETURN_IF_ERROR(check_layout(*dout, "dout", false));
  FLAMIA_RETURN_IF_ERROR(check_layout(*dq, "dq", true));
  FLAMIA_RETURN_IF_ERROR(check_layout(*dk, "dk", true));
  FLAMIA_RETURN_IF_ERROR(check_layout(*dv, "dv", true));
  if (reinterpret_cast<uintptr_t>(lse) % alignof(float) != 0)
    return invalid("lse must be 4-byte aligned (FP32), got address " + address(lse));
  std::vector<Footprint> footprints{footprint(*dq, "dq"), footprint(*dk, "dk"), footprint(*dv, "dv"),
                                    footprint(*o, "o"), lse_footprint(lse, q->heads, q->tokens),
                                    footprint(*dout, "dout")};
  if (codes == QkvCodes::kInWorkspace) {  // else q, k and v give shapes only
    for (const auto& [t, name] : {std::pair<const flamia_tensor*, const char*>{q, "q"}, {k, "k"}, {v, "v"}})
      footprints.push_back(footprint(*t, name));
  }
  FLAMIA_RETURN_IF_ERROR(check_no_aliasing(footprints, 3));
  FLAMIA_RETURN_IF_ERROR(check_documents(*docs, q->tokens));
  FLAMIA_RETURN_IF_ERROR(check_options(*options, q->dim));
  return check_limits(*q, *k);
}

CallError offsets_status_error(const flamia_offsets_status& record) {
  if (record.error == FLAMIA_OFFSETS_OK) return CallError::success();
  OffsetsRecord r;
  r.kind = record.error, r.index = record.index, r.value = record.value, r.bound = record.bound;
  return invalid(describe_offsets_error(r, "cu_seqlens"));
}

AttentionOptions attention_options(const flamia_options& options) {
  AttentionOptions a;  // the emulation-only numerics keep their defaults: flamia_options has no field for them
  a.shape.causal = options.causal == 1;
  a.shape.softmax_scale = options.softmax_scale;
  // The enums' values are the core's (the static_asserts above).
  a.numerics.isolation = Isolation(raw_enum(options.isolation));
  a.numerics.scale_geometry = ScaleGeometry(raw_enum(options.scale_geometry));
  a.numerics.scale_rule = ScaleRule(raw_enum(options.scale_rule));
  a.numerics.p_boost_log2 = options.p_boost_log2;
  a.numerics.dq_reduction = options.deterministic == 1 ? DqReduction::kDeterministic : DqReduction::kFp16Partials;
  return a;
}

BackwardPlan plan_backward(const flamia_tensor& q, const flamia_tensor& dq, const flamia_documents& docs,
                           const flamia_options& options, QkvCodes codes) {
  const NumericsOptions numerics = attention_options(options).numerics;
  const bool causal = options.causal == 1;
  const bool dq_partials =
      codes == QkvCodes::kSaved && numerics.uses_fp16_partials(causal) &&
      cuda::sm90::dq_partials_supported(int(q.dim), causal, numerics.interior_codes(), q.tokens, docs.num_docs) &&
      dq.stride_token % 8 == 0 && dq.stride_head % 8 == 0 && reinterpret_cast<uintptr_t>(dq.data) % 16 == 0;
  return {codes, numerics, dq_partials};
}

namespace {

// Hands out consecutive workspace regions, each starting kWorkspaceAlignment-aligned.
class RegionCarver {
 public:
  WorkspaceRegion take(size_t bytes) {
    const WorkspaceRegion r{at_, bytes};
    at_ = align_up(at_ + bytes);
    return r;
  }
  // take(bytes) when the layout has the buffer, else the empty region (no bytes, no pointer).
  WorkspaceRegion take_if(bool present, size_t bytes) { return present ? take(bytes) : WorkspaceRegion{}; }
  size_t total() const { return at_; }

 private:
  size_t at_ = 0;
};

// The work order's table, its builder's scratch (core/schedule.h) and the cu_seqlens it checked,
// in either workspace.
template <class Workspace>
void take_work_order(RegionCarver& c, int64_t tokens, int64_t num_docs, Workspace& w) {
  w.work_order = c.take(size_t(order::table_entries(tokens, num_docs)) * sizeof(order::OrderedTile));
  w.work_order_counters = c.take(size_t(order::cost_counters(tokens)) * sizeof(int32_t));
  w.checked_cu_seqlens = c.take(size_t(num_docs + 1) * sizeof(int32_t));
}

}  // namespace

ForwardWorkspace forward_workspace_layout(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                          int64_t num_docs, bool interior_codes, QkvCodes codes) {
  ForwardWorkspace w;
  RegionCarver c;
  const size_t t = size_t(tokens), hq = size_t(q_heads), hkv = size_t(kv_heads), d = size_t(head_dim);
  const bool own = codes == QkvCodes::kInWorkspace;  // else they live in the saved codes buffer
  w.q_codes = c.take_if(own, t * hq * d);
  w.k_codes = c.take_if(own, t * hkv * d);
  w.v_codes_t = c.take_if(own, hkv * d * size_t(layout::transposed_tokens(tokens, num_docs)));
  w.q_scales = c.take_if(own, t * hq);
  w.k_scales = c.take_if(own, t * hkv);
  w.v_scales = c.take_if(own, t * hkv);
  const bool interior = own && interior_codes;
  w.k_interior_codes = c.take_if(interior, t * hkv * d);
  w.v_interior_codes_t = c.take_if(interior, hkv * d * size_t(layout::transposed_tokens(tokens, num_docs)));
  w.k_interior_scales = c.take_if(interior, t * hkv);
  w.v_interior_scales = c.take_if(interior, t * hkv);
  w.v_fold_ref = c.take(t * hkv);
  w.work_counter = c.take(sizeof(int32_t));
  take_work_order(c, tokens, num_docs, w);
  w.total = c.total();
  return w;
}

SavedCodes saved_codes_layout(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t num_docs,
                              bool interior_codes) {
  SavedCodes w;
  RegionCarver c;
  const size_t t = size_t(tokens), hq = size_t(q_heads), hkv = size_t(kv_heads), d = size_t(head_dim);
  const size_t slots = size_t(layout::transposed_tokens(tokens, num_docs));
  w.q_codes = c.take(t * hq * d);
  w.k_codes = c.take(t * hkv * d);
  w.v_codes = c.take(t * hkv * d);
  w.q_codes_t = c.take(hq * d * slots);
  w.k_codes_t = c.take(hkv * d * slots);
  w.v_codes_t = c.take(hkv * d * slots);
  w.q_scales = c.take(t * hq);
  w.k_scales = c.take(t * hkv);
  w.v_scales = c.take(t * hkv);
  w.k_interior_codes = c.take_if(interior_codes, t * hkv * d);
  w.v_interior_codes = c.take_if(interior_codes, t * hkv * d);
  w.k_interior_codes_t = c.take_if(interior_codes, hkv * d * slots);
  w.v_interior_codes_t = c.take_if(interior_codes, hkv * d * slots);
  w.k_interior_scales = c.take_if(interior_codes, t * hkv);
  w.v_interior_scales = c.take_if(interior_codes, t * hkv);
  w.row_max_prob = c.take(t * hq * sizeof(float));
  w.total = c.total();
  return w;
}

BackwardWorkspace backward_workspace_layout(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                            int64_t num_docs, bool interior_codes, QkvCodes codes) {
  BackwardWorkspace w;
  RegionCarver c;
  const size_t t = size_t(tokens), hq = size_t(q_heads), hkv = size_t(kv_heads), d = size_t(head_dim);
  const size_t slots = size_t(layout::transposed_tokens(tokens, num_docs));
  const bool own = codes == QkvCodes::kInWorkspace;  // else they live in the saved codes buffer
  w.q_codes = c.take_if(own, t * hq * d);
  w.k_codes = c.take_if(own, t * hkv * d);
  w.v_codes = c.take_if(own, t * hkv * d);
  w.g_codes = c.take(t * hq * d);
  w.q_codes_t = c.take_if(own, hq * d * slots);
  w.k_codes_t = c.take_if(own, hkv * d * slots);
  w.g_codes_t = c.take(hq * d * slots);
  w.q_scales = c.take_if(own, t * hq);
  w.k_scales = c.take_if(own, t * hkv);
  w.v_scales = c.take_if(own, t * hkv);
  w.g_scales = c.take(t * hq);
  const bool interior = own && interior_codes;
  w.k_interior_codes = c.take_if(interior, t * hkv * d);
  w.v_interior_codes = c.take_if(interior, t * hkv * d);
  w.k_interior_codes_t = c.take_if(interior, hkv * d * slots);
  w.k_interior_scales = c.take_if(interior, t * hkv);
  w.v_interior_scales = c.take_if(interior, t * hkv);
  w.g_scale_prefix_max = c.take(t * hq);
  w.delta = c.take(t * hq * sizeof(float));
  w.k_scale_prefix_max = c.take(t * hkv);
  w.v_scale_prefix_max = c.take(t * hkv);
  w.dq_sigma = c.take(t * hq);
  w.dq_beta = c.take(t * hq);
  w.work_counter = c.take(sizeof(int32_t));
  take_work_order(c, tokens, num_docs, w);
  w.total = c.total();
  return w;
}

namespace {

CallError check_buffer_bytes(std::string_view name, size_t required, const char* size_query, const void* buffer,
                             size_t buffer_bytes) {
  const std::string n(name);
  if (buffer == nullptr) {
    return {FLAMIA_ERROR_WORKSPACE,
            n + " is NULL; this call needs " + std::to_string(required) + " bytes (" + size_query + ")"};
  }
  if (buffer_bytes < required) {
    return {FLAMIA_ERROR_WORKSPACE, n + "_bytes (" + std::to_string(buffer_bytes) + ") is smaller than the " +
                                        std::to_string(required) + " bytes " + size_query + " returns"};
  }
  if (reinterpret_cast<uintptr_t>(buffer) % kWorkspaceAlignment != 0) {
    return {FLAMIA_ERROR_WORKSPACE,
            n + " must be 256-byte aligned (as cudaMalloc returns), got address " + address(buffer)};
  }
  return CallError::success();
}

}  // namespace

CallError check_workspace(const ForwardWorkspace& layout, const void* workspace, size_t workspace_bytes,
                          const char* size_query) {
  return check_buffer_bytes("workspace", layout.total, size_query, workspace, workspace_bytes);
}
CallError check_workspace(const BackwardWorkspace& layout, const void* workspace, size_t workspace_bytes,
                          const char* size_query) {
  return check_buffer_bytes("workspace", layout.total, size_query, workspace, workspace_bytes);
}
CallError check_saved_codes(const SavedCodes& layout, const void* saved_codes, size_t saved_codes_bytes) {
  return check_buffer_bytes("saved_codes", layout.total, "flamia_saved_codes_size", saved_codes, saved_codes_bytes);
}

flamia_status report(const CallError& result, flamia_error* error) {
  if (error != nullptr) std::snprintf(error->message, sizeof error->message, "%s", result.message.c_str());
  return result.status;
}

}  // namespace flamia::capi

using flamia::capi::CallError;

namespace flamia::capi {
namespace {

// A workspace size query: the shapes, docs->num_docs (nothing else of docs is read) and the options
// are validated; the bytes come from the call's layout, layout(shapes, num_docs, interior_codes).
template <class Layout>
flamia_status workspace_size_query(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                   const flamia_documents* docs, const flamia_options* options, size_t* bytes,
                                   flamia_error* error, Layout layout) {
  return guarded(error, [&]() -> CallError {
    if (bytes == nullptr) return {FLAMIA_ERROR_INVALID_ARGUMENT, "bytes is NULL"};
    *bytes = 0;
    if (CallError e = validate_shapes(q, k, v); !e.ok()) return e;
    if (docs == nullptr) return {FLAMIA_ERROR_INVALID_ARGUMENT, "docs is NULL"};
    if (docs->num_docs < 1)
      return {FLAMIA_ERROR_INVALID_ARGUMENT, "docs.num_docs must be >= 1, got " + std::to_string(docs->num_docs)};
    if (options == nullptr)
      return {FLAMIA_ERROR_INVALID_ARGUMENT, "options is NULL (flamia_default_options fills the defaults)"};
    if (CallError e = check_options(*options, q->dim); !e.ok()) return e;
    *bytes = layout(q->tokens, q->heads, k->heads, q->dim, docs->num_docs, attention_options(*options).numerics.interior_codes())
                 .total;
    return CallError::success();
  });
}

}  // namespace
}  // namespace flamia::capi

extern "C" {

void flamia_default_options(flamia_options* options) {
  if (options == nullptr) return;
  // The core type's defaults, so that C, the emulation and the CLI start from the same options.
  const flamia::AttentionOptions defaults;
  options->causal = defaults.shape.causal ? 1 : 0;
  options->softmax_scale = float(defaults.shape.softmax_scale);
  options->isolation = flamia_isolation(int(defaults.numerics.isolation));
  options->scale_geometry = flamia_scale_geometry(int(defaults.numerics.scale_geometry));
  options->scale_rule = flamia_scale_rule(int(defaults.numerics.scale_rule));
  options->p_boost_log2 = defaults.numerics.p_boost_log2;
  options->deterministic = defaults.numerics.dq_reduction == flamia::DqReduction::kDeterministic ? 1 : 0;
}

int flamia_abi_version(void) { return FLAMIA_ABI_VERSION; }

// FLAMIA_VERSION_STRING: CMake's project version, which CMakeLists.txt reads from the version's one
// home, python/flamia/__init__.py (tests/python/test_version.py and test_cli.py check the chain).
const char* flamia_version(void) { return FLAMIA_VERSION_STRING; }

const char* flamia_status_name(flamia_status status) {
  switch (flamia::capi::raw_enum(status)) {
    case FLAMIA_SUCCESS: return "FLAMIA_SUCCESS";
    case FLAMIA_ERROR_INVALID_ARGUMENT: return "FLAMIA_ERROR_INVALID_ARGUMENT";
    case FLAMIA_ERROR_NOT_SUPPORTED: return "FLAMIA_ERROR_NOT_SUPPORTED";
    case FLAMIA_ERROR_WORKSPACE: return "FLAMIA_ERROR_WORKSPACE";
    case FLAMIA_ERROR_CUDA: return "FLAMIA_ERROR_CUDA";
    default: return "FLAMIA_UNKNOWN_STATUS";
  }
}

static_assert(sizeof(flamia_offsets_status) == sizeof(flamia::OffsetsRecord) &&
                  alignof(flamia::OffsetsRecord) == 16 && offsetof(flamia_offsets_status, error) == 0 &&
                  offsetof(flamia_offsets_status, index) == 4 && offsetof(flamia_offsets_status, value) == 8 &&
                  offsetof(flamia_offsets_status, bound) == 12,
              "the device writes flamia_offsets_status as a flamia::OffsetsRecord");
static_assert(FLAMIA_OFFSETS_OK == int(flamia::OffsetsError::kOk) &&
                  FLAMIA_OFFSETS_FIRST_NOT_ZERO == int(flamia::OffsetsError::kFirstNotZero) &&
                  FLAMIA_OFFSETS_OUT_OF_RANGE == int(flamia::OffsetsError::kOutOfRange) &&
                  FLAMIA_OFFSETS_DECREASING == int(flamia::OffsetsError::kDecreasing) &&
                  FLAMIA_OFFSETS_LAST_NOT_TOTAL == int(flamia::OffsetsError::kLastNotTotal),
              "flamia_offsets_error spells core/offsets_check.h's OffsetsError");

flamia_status flamia_offsets_status_message(const flamia_offsets_status* record, flamia_error* error) {
  return flamia::capi::guarded(error, [&]() -> CallError {
    if (record == nullptr) return {FLAMIA_ERROR_INVALID_ARGUMENT, "record is NULL"};
    return flamia::capi::offsets_status_error(*record);
  });
}

flamia_status flamia_validate_cu_seqlens(const int32_t* cu_seqlens_host, int32_t num_docs, int64_t total_tokens,
                                         int32_t max_seqlen, flamia_offsets_status* record, flamia_error* error) {
  return flamia::capi::guarded(error, [&]() -> CallError {
    if (record != nullptr) *record = flamia_offsets_status{};
    if (cu_seqlens_host == nullptr) return {FLAMIA_ERROR_INVALID_ARGUMENT, "cu_seqlens_host is NULL"};
    if (num_docs < 1) return {FLAMIA_ERROR_INVALID_ARGUMENT, "num_docs must be >= 1, got " + std::to_string(num_docs)};
    if (total_tokens < 1 || total_tokens > flamia::kMaxTokens) {
      return {FLAMIA_ERROR_INVALID_ARGUMENT,
              "total_tokens must lie in [1, 2147483647], got " + std::to_string(total_tokens)};
    }
    flamia::OffsetsRecord r;
    CallError e = flamia::capi::check_offsets_on_host({cu_seqlens_host, size_t(num_docs) + 1}, total_tokens,
                                                      max_seqlen, "cu_seqlens", "max_seqlen", &r);
    if (record != nullptr) *record = {r.kind, r.index, r.value, r.bound};
    return e;
  });
}

flamia_status flamia_forward_workspace_size(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                            const flamia_documents* docs, const flamia_options* options, size_t* bytes,
                                            flamia_error* error) {
  return flamia::capi::workspace_size_query(q, k, v, docs, options, bytes, error, [](auto... shape) {
    return flamia::capi::forward_workspace_layout(shape..., flamia::capi::QkvCodes::kInWorkspace);
  });
}

flamia_status flamia_backward_workspace_size(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                             const flamia_documents* docs, const flamia_options* options, size_t* bytes,
                                             flamia_error* error) {
  return flamia::capi::workspace_size_query(q, k, v, docs, options, bytes, error, [](auto... shape) {
    return flamia::capi::backward_workspace_layout(shape..., flamia::capi::QkvCodes::kInWorkspace);
  });
}

flamia_status flamia_saved_codes_size(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                      const flamia_documents* docs, const flamia_options* options, size_t* bytes,
                                      flamia_error* error) {
  return flamia::capi::workspace_size_query(q, k, v, docs, options, bytes, error, flamia::capi::saved_codes_layout);
}

flamia_status flamia_forward_train_workspace_size(const flamia_tensor* q, const flamia_tensor* k,
                                                  const flamia_tensor* v, const flamia_documents* docs,
                                                  const flamia_options* options, size_t* bytes, flamia_error* error) {
  return flamia::capi::workspace_size_query(q, k, v, docs, options, bytes, error, [](auto... shape) {
    return flamia::capi::forward_workspace_layout(shape..., flamia::capi::QkvCodes::kSaved);
  });
}

flamia_status flamia_backward_saved_workspace_size(const flamia_tensor* q, const flamia_tensor* k,
                                                   const flamia_tensor* v, const flamia_documents* docs,
                                                   const flamia_options* options, size_t* bytes, flamia_error* error) {
  return flamia::capi::workspace_size_query(q, k, v, docs, options, bytes, error, [](auto... shape) {
    return flamia::capi::backward_workspace_layout(shape..., flamia::capi::QkvCodes::kSaved);
  });
}

}  // extern "C"
