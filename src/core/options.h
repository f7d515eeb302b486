// The user-facing numerical options of an attention call, shared by the CPU emulation, the
// CUDA kernels and the tests. docs/DESIGN.md §1-§3 define what each one means.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "formats/scales.h"

namespace flamia {

using formats::ScaleRule;

// Which dependencies a call guarantees to respect (docs/DESIGN.md §3).
enum class Isolation : uint8_t {
  kDocument,  // outputs depend only on their own document (default)
  kPrefix,    // and, for query i, O_i, LSE_i and dQ_i depend only on positions <= i
};

// Scale groups of the loaded operands Q, K, V and dO, always counted from the document start.
enum class ScaleGeometry : uint8_t {
  kBlock32,  // 32 consecutive tokens x all D features of one head (the last group may be short)
  kToken,    // one token's D features
};

// Scale geometry of U = P o (E - D), the fresh operand of dQ = U.K and dK = U^T.Q.
enum class UScaleGeometry : uint8_t {
  kRowCol,    // Hopper: one scale per (query row, key tile) for dQ, per (key column, query tile) for dK
  kSquare32,  // Blackwell layout: one 32x32 square shared by both orientations (leaks in prefix mode)
};

// How dQ's sums are reduced (docs/NUMERICS.md, "dQ's reduction").
enum class DqReduction : uint8_t {
  kDeterministic,  // a dQ pass of its own: each row summed by one owner in a fixed order (bitwise repeatable)
  kFp16Partials,   // partials of the dK dV pass, boosted per row and summed in FP16 (five products instead of seven)
};

// Which formats the products use (docs/NUMERICS.md, "The mixed NVFP4/FP8 route").
enum class Route : uint8_t {
  kMxfp8,       // every product on E4M3 codes with UE8M0 scales (the Hopper kernels)
  kNvfp4Mixed,  // S = Q.K^T on NVFP4 (E2M1, E4M3 scale per 16 features, FP32 scale per token); the
                // other products as kMxfp8, with Q and K encoded again in E4M3 for dQ and dK (emulation only)
};

// P's boost exponent: its default and its largest value (boosted P <= 2^boost stays below E4M3's 448).
// flamia.h's FLAMIA_P_BOOST_LOG2_DEFAULT and FLAMIA_P_BOOST_LOG2_MAX spell them for C and Python.
inline constexpr int kPBoostLog2Default = 8;
inline constexpr int kPBoostLog2Max = 8;

// The Hadamard rotation's block: 128 features where D allows it, else 64; 0 when D is not a
// multiple of 64 (the option is then refused).
constexpr int hadamard_block_size(int head_dim) {
  return head_dim % 128 == 0 ? 128 : head_dim % 64 == 0 ? 64 : 0;
}

struct NumericsOptions {
  Isolation isolation = Isolation::kDocument;
  ScaleGeometry scale_geometry = ScaleGeometry::kBlock32;
  ScaleRule scale_rule = ScaleRule::kCeil;
  int p_boost_log2 = kPBoostLog2Default;  // P is rounded as E4M3(p * 2^boost * fold); docs/DESIGN.md §2, "P and its boost"
  DqReduction dq_reduction = DqReduction::kFp16Partials;

  // Emulation only: the Hopper kernels implement the defaults alone, so the C API has no field for
  // these and its options convert with them left as they are (capi::attention_options).
  Route route = Route::kMxfp8;
  UScaleGeometry u_scale = UScaleGeometry::kRowCol;
  bool hadamard = false;  // rotate Q and K along features before quantizing (D a multiple of 64)

  // Whether an emulation-only option differs from its default (no kernel runs these options).
  bool emulation_only() const {
    const NumericsOptions d;
    return route != d.route || u_scale != d.u_scale || hadamard != d.hadamard;
  }

  // Prefix isolation closes the 32-token groups that straddle a query by giving the loaded
  // operands per-token scales: Q and dO everywhere, K and V where a pair is not interior
  // (tiling::interior_pair). This is the geometry of those codes.
  ScaleGeometry effective_geometry() const {
    return isolation == Isolation::kPrefix ? ScaleGeometry::kToken : scale_geometry;
  }
  // Prefix isolation with block32 geometry encodes K and V twice: per token (the frontier's
  // codes) and block32 (the interior codes, read on interior pairs, whose groups lie wholly before
  // the query). With token geometry every pair reads the per-token codes.
  bool interior_codes() const { return isolation == Isolation::kPrefix && scale_geometry == ScaleGeometry::kBlock32; }
  // Whether a call's dQ is reduced from FP16 partials (core/dq_partials.h). Only document
  // isolation with a causal mask takes them; every other call takes the deterministic reduction:
  // prefix isolation's guarantee that dQ_i is bitwise independent of positions after i needs a
  // reduction in a fixed order that no later tile can touch, and the partials' per-row factors
  // come from bounds over the row's prefix (the largest K and V scales over keys j <= i), which
  // cover the row's keys only when the row is causal. The partials are a Hopper layout with one U
  // scale per row (sigma_i); 32x32 U squares have no row scale and keep their own dQ. The mixed
  // NVFP4/FP8 route is an emulation of a Blackwell design and keeps the deterministic reduction.
  bool uses_fp16_partials(bool causal) const {
    return dq_reduction == DqReduction::kFp16Partials && route == Route::kMxfp8 && isolation == Isolation::kDocument &&
           causal && u_scale == UScaleGeometry::kRowCol;
  }
};

// The keys a query sees inside its document, [first, last] (document-local positions).
struct KeyRange {
  int first, last;
};

// The mask, the softmax scale and the score transform of a call.
// The window is flash_attn's window_size = (left, right): query i sees the keys j of its document
// with i - left <= j <= i + right, -1 meaning no bound on that side; causal is the same as right = 0.
// softcap > 0 replaces each score s = scale q.k by softcap tanh(s / softcap) (Gemma 2), with the
// backward's dS taking the derivative's factor 1 - tanh^2.
// Windows and softcap are served by the emulation and the FP64 reference; the kernels, and so the
// C API, serve neither (docs/DESIGN.md §1).
struct AttentionShape {
  bool causal = true;
  double softmax_scale = 0.0;  // 0 means 1/sqrt(head_dim)
  int window_left = -1, window_right = -1;
  double softcap = 0.0;  // 0: scores as they are
  double scale_for(int head_dim) const { return softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(double(head_dim)); }
  bool windowed() const { return window_left >= 0 || (window_right >= 0 && !causal); }
  // The keys of document-local query p in a document of len tokens (never empty: p sees itself).
  KeyRange keys_of(int p, int len) const { return keys_of(p, len, len); }
  // The same with q_len queries and k_len keys in the document (flash_attn's cu_seqlens_q and
  // cu_seqlens_k): the mask is aligned bottom-right, query p sitting at key position
  // p + k_len - q_len. Empty (last < first) for a causal query before the first key.
  KeyRange keys_of(int p, int q_len, int k_len) const {
    const int at = p + k_len - q_len;
    int last = causal ? at : k_len - 1;
    if (window_right >= 0 && at + window_right < last) last = at + window_right;
    if (last > k_len - 1) last = k_len - 1;
    const int first = window_left >= 0 && at - window_left > 0 ? at - window_left : 0;
    return {first, last};
  }
  // The natural-log score from the unscaled product: scale q.k, soft-capped when asked.
  double score(double scaled) const { return softcap > 0 ? softcap * std::tanh(scaled / softcap) : scaled; }
  // d score / d (scale q.k) at a soft-capped score: 1 - tanh^2 (1 without softcap).
  double score_slope(double capped) const {
    if (softcap <= 0) return 1.0;
    const double t = capped / softcap;
    return 1.0 - t * t;
  }
};

// Every option of one attention call. The C API's flamia_options converts into this type
// (capi::attention_options); the emulation takes its two parts as separate arguments.
struct AttentionOptions {
  AttentionShape shape;
  NumericsOptions numerics;
};

// Why the options cannot be honoured together for this head_dim (for example prefix isolation
// without a causal mask, or 32x32 U squares in prefix mode), or nullopt when they can.
std::optional<std::string> options_error(const AttentionOptions& options, int head_dim);
// The same rules, as std::invalid_argument.
void check_options(const AttentionOptions& options, int head_dim);

// ---- Names of the option enums --------------------------------------------------------------
// One table per enum: the names as they appear on the command line, in JSON and in the Python API,
// and the C API's constant where flamia.h has one (empty for emulation-only values).
// capi/validate.cpp checks each c_name against the header's constant of the same value.
template <class E>
struct EnumName {
  E value;
  std::string_view name;
  std::string_view c_name;
};

template <class E>
struct EnumNames;  // specialized per option enum: static constexpr EnumName<E> table[]

template <>
struct EnumNames<Route> {
  static constexpr EnumName<Route> table[] = {{Route::kMxfp8, "mxfp8", ""}, {Route::kNvfp4Mixed, "nvfp4_mixed", ""}};
};
template <>
struct EnumNames<Isolation> {
  static constexpr EnumName<Isolation> table[] = {{Isolation::kDocument, "document", "FLAMIA_ISOLATION_DOCUMENT"},
                                                  {Isolation::kPrefix, "prefix", "FLAMIA_ISOLATION_PREFIX"}};
};
template <>
struct EnumNames<ScaleGeometry> {
  static constexpr EnumName<ScaleGeometry> table[] = {{ScaleGeometry::kBlock32, "block32", "FLAMIA_SCALE_BLOCK32"},
                                                      {ScaleGeometry::kToken, "token", "FLAMIA_SCALE_TOKEN"}};
};
template <>
struct EnumNames<ScaleRule> {
  static constexpr EnumName<ScaleRule> table[] = {{ScaleRule::kCeil, "ceil", "FLAMIA_SCALE_RULE_CEIL"},
                                                  {ScaleRule::kFloor, "floor", "FLAMIA_SCALE_RULE_FLOOR"}};
};
template <>
struct EnumNames<UScaleGeometry> {
  static constexpr EnumName<UScaleGeometry> table[] = {{UScaleGeometry::kRowCol, "rowcol", ""},
                                                       {UScaleGeometry::kSquare32, "square32", ""}};
};
template <>
struct EnumNames<DqReduction> {
  static constexpr EnumName<DqReduction> table[] = {{DqReduction::kDeterministic, "deterministic", ""},
                                                    {DqReduction::kFp16Partials, "fp16_partials", ""}};
};

template <class E>
concept OptionEnum = requires { EnumNames<E>::table; };

template <OptionEnum E>
constexpr std::span<const EnumName<E>> enum_names() {
  return EnumNames<E>::table;
}

template <OptionEnum E>
constexpr std::string_view to_string(E v) {
  for (const EnumName<E>& e : enum_names<E>())
    if (e.value == v) return e.name;
  return "unknown";
}

template <OptionEnum E>
constexpr std::optional<E> parse_option(std::string_view s) {
  for (const EnumName<E>& e : enum_names<E>())
    if (e.name == s) return e.value;
  return std::nullopt;
}

// The valid names for a message, e.g. "block32 or token".
template <OptionEnum E>
std::string option_names() {
  std::string out;
  const auto names = enum_names<E>();
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i].name;
  }
  return out;
}

}  // namespace flamia
