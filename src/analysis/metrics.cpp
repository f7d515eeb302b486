#include "analysis/metrics.h"

#include <cmath>
#include <stdexcept>

namespace flamia::analysis {

Comparison compare(std::span<const double> a, std::span<const double> e) {
  if (a.size() != e.size()) throw std::invalid_argument("compare: tensors differ in size");
  double ae = 0, aa = 0, ee = 0, dd = 0, max_abs = 0;
  bool nan = false;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - e[i];
    nan = nan || std::isnan(d);
    ae += a[i] * e[i], aa += a[i] * a[i], ee += e[i] * e[i], dd += d * d;
    max_abs = std::fmax(max_abs, std::fabs(d));
  }
  if (nan) return {NAN, NAN, NAN};
  const double denom = std::sqrt(aa * ee);
  return {denom > 0 ? ae / denom : (aa == ee ? 1.0 : 0.0), ee > 0 ? std::sqrt(dd / ee) : std::sqrt(dd), max_abs};
}

}  // namespace flamia::analysis
