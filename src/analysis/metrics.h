// Error metrics of an approximate tensor against an exact one (docs/DESIGN.md §4).
#pragma once

#include <span>

namespace flamia::analysis {

struct Comparison {
  double cosine = 0.0;   // <a, e> / (|a| |e|); NaN when either holds a NaN
  double rel_l2 = 0.0;   // |a - e| / |e|
  double max_abs = 0.0;  // max |a - e|
};

Comparison compare(std::span<const double> approx, std::span<const double> exact);

}  // namespace flamia::analysis
