#include "core/options.h"

#include <cmath>
#include <stdexcept>

namespace flamia {

std::optional<std::string> options_error(const AttentionOptions& options, int head_dim) {
  const NumericsOptions& n = options.numerics;
  const double scale = options.shape.softmax_scale;
  if (!std::isfinite(scale) || scale < 0)
    return "softmax_scale must be finite and > 0, or 0 for the default 1/sqrt(head_dim); got " + std::to_string(scale);
  if (n.isolation == Isolation::kPrefix && !options.shape.causal)
    return "isolation=prefix needs causal=true: without a causal mask every query reads its future";
  if (n.isolation == Isolation::kPrefix && n.u_scale == UScaleGeometry::kSquare32) {
    return "u_scale=square32 shares one scale between query rows of a 32x32 square, which couples a row to later "
           "rows; isolation=prefix needs u_scale=rowcol";
  }
  if (n.p_boost_log2 < 0 || n.p_boost_log2 > kPBoostLog2Max) {
    return "p_boost_log2 must lie in [0, " + std::to_string(kPBoostLog2Max) +
           "] so that boosted P (<= 2^boost) never exceeds 448";
  }
  if (n.route == Route::kNvfp4Mixed && head_dim % formats::kNvfp4Block != 0) {
    return "route=nvfp4_mixed needs head_dim a multiple of " + std::to_string(formats::kNvfp4Block) +
           " (NVFP4 block scales), got " + std::to_string(head_dim);
  }
  // The rotation works on blocks of 64 or 128 features (reference::hadamard_block_size).
  if (n.hadamard && head_dim % 64 != 0)
    return "hadamard=true needs head_dim a multiple of 64, got " + std::to_string(head_dim);
  return std::nullopt;
}

void check_options(const AttentionOptions& options, int head_dim) {
  if (std::optional<std::string> e = options_error(options, head_dim)) throw std::invalid_argument(*e);
}

}  // namespace flamia
