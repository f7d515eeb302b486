// The user-facing numerical options of an attention call, shared by the CPU emulation, the
// CUDA kernels and the tests. docs/DESIGN.md §1-§3 define what each one means.
#pragma once

#include <cstdint>
#include <optional>
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

struct NumericsOptions {
  Route route = Route::kMxfp8;
  Isolation isolation = Isolation::kDocument;
  ScaleGeometry scale_geometry = ScaleGeometry::kBlock32;
  ScaleRule scale_rule = ScaleRule::kCeil;
  UScaleGeometry u_scale = UScaleGeometry::kRowCol;
  int p_boost_log2 = 8;    // P is rounded as E4M3(p * 2^boost * fold); docs/DESIGN.md §2, "P and its boost"
  bool hadamard = false;   // rotate Q and K along features before quantizing (D a multiple of 64)
  DqReduction dq_reduction = DqReduction::kFp16Partials;

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

// Names as they appear on the command line, in JSON and in the Python API.
std::string_view to_string(Route v);
std::string_view to_string(Isolation v);
std::string_view to_string(ScaleGeometry v);
std::string_view to_string(ScaleRule v);
std::string_view to_string(UScaleGeometry v);
std::string_view to_string(DqReduction v);
std::optional<Route> parse_route(std::string_view s);
std::optional<Isolation> parse_isolation(std::string_view s);
std::optional<ScaleGeometry> parse_scale_geometry(std::string_view s);
std::optional<ScaleRule> parse_scale_rule(std::string_view s);
std::optional<UScaleGeometry> parse_u_scale(std::string_view s);
std::optional<DqReduction> parse_dq_reduction(std::string_view s);

}  // namespace flamia
