#include "core/options.h"

#include <cmath>
#include <stdexcept>

namespace flamia {

std::optional<std::string> options_error(const AttentionOptions& options, int head_dim) {
  const NumericsOptions& n = options.numerics;
  const double scale = options.shape.softmax_scale;
  if (!std::isfinite(scale) || scale < 0)
    return "softmax_scale must be finite and > 0, or 0 for the default 1/sqrt(head_dim); got " + std::to_string(scale);
  const AttentionShape& shape = options.shape;
  if (shape.window_left < -1 || shape.window_right < -1) {
    return "window must be (left, right) with each >= 0, or -1 for no bound on that side; got (" +
           std::to_string(shape.window_left) + ", " + std::to_string(shape.window_right) + ")";
  }
  if (!std::isfinite(shape.softcap) || shape.softcap < 0)
    return "softcap must be finite and > 0, or 0 for raw scores; got " + std::to_string(shape.softcap);
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
  if (n.hadamard && hadamard_block_size(head_dim) == 0)
    return "hadamard=true needs head_dim a multiple of 64, got " + std::to_string(head_dim);
  return std::nullopt;
}

void check_options(const AttentionOptions& options, int head_dim) {
  if (std::optional<std::string> e = options_error(options, head_dim)) throw std::invalid_argument(*e);
}

}  // namespace flamia
