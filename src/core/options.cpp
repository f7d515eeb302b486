#include "core/options.h"

namespace flamia {

std::string_view to_string(Route v) { return v == Route::kNvfp4Mixed ? "nvfp4_mixed" : "mxfp8"; }
std::string_view to_string(Isolation v) { return v == Isolation::kPrefix ? "prefix" : "document"; }
std::string_view to_string(ScaleGeometry v) { return v == ScaleGeometry::kToken ? "token" : "block32"; }
std::string_view to_string(ScaleRule v) { return v == ScaleRule::kFloor ? "floor" : "ceil"; }
std::string_view to_string(UScaleGeometry v) { return v == UScaleGeometry::kSquare32 ? "square32" : "rowcol"; }
std::string_view to_string(DqReduction v) { return v == DqReduction::kFp16Partials ? "fp16_partials" : "deterministic"; }

std::optional<Route> parse_route(std::string_view s) {
  if (s == "mxfp8") return Route::kMxfp8;
  if (s == "nvfp4_mixed") return Route::kNvfp4Mixed;
  return std::nullopt;
}
std::optional<Isolation> parse_isolation(std::string_view s) {
  if (s == "document") return Isolation::kDocument;
  if (s == "prefix") return Isolation::kPrefix;
  return std::nullopt;
}
std::optional<ScaleGeometry> parse_scale_geometry(std::string_view s) {
  if (s == "block32") return ScaleGeometry::kBlock32;
  if (s == "token") return ScaleGeometry::kToken;
  return std::nullopt;
}
std::optional<ScaleRule> parse_scale_rule(std::string_view s) {
  if (s == "ceil") return ScaleRule::kCeil;
  if (s == "floor") return ScaleRule::kFloor;
  return std::nullopt;
}
std::optional<UScaleGeometry> parse_u_scale(std::string_view s) {
  if (s == "rowcol") return UScaleGeometry::kRowCol;
  if (s == "square32") return UScaleGeometry::kSquare32;
  return std::nullopt;
}
std::optional<DqReduction> parse_dq_reduction(std::string_view s) {
  if (s == "deterministic") return DqReduction::kDeterministic;
  if (s == "fp16_partials") return DqReduction::kFp16Partials;
  return std::nullopt;
}

}  // namespace flamia
