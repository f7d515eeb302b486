// The numerics table (docs/DESIGN.md §4): each route configuration against the FP64 reference.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "analysis/inputs.h"
#include "analysis/metrics.h"
#include "core/options.h"
#include "reference/mxfp8_route.h"

namespace flamia::analysis {

struct NumericsRow {
  std::string route, isolation, geometry, rule, u_scale;
  bool hadamard = false;
  std::string backward;  // dQ's reduction: to_string(DqReduction)
  std::string tensor;
  Comparison cmp;
  reference::RouteStats stats;  // of the whole call; the same on every tensor row of a config
};

// The configurations the table reports by default: the default route, then one option changed
// at a time (token geometry, floor rule, prefix isolation, 32x32 U squares), then the rest of
// route_comparison_configs() (the Hadamard rotation, the mixed NVFP4/FP8 route).
std::vector<NumericsOptions> default_numerics_configs();
// The routes side by side on the default options: mxfp8, mxfp8 with Hadamard, nvfp4_mixed,
// nvfp4_mixed with Hadamard.
std::vector<NumericsOptions> route_comparison_configs();

using Progress = std::function<void(const std::string&)>;

// Runs the FP64 reference once and every configuration against it; rows for o, lse, dq, dk, dv.
// A configuration runs the deterministic backward, and where FP16 dQ partials apply to it
// (NumericsOptions::uses_fp16_partials) the fp16_partials backward too, over the same forward:
// rows of both reductions, deterministic first (o and lse repeat, the stats are each call's).
std::vector<NumericsRow> run_numerics(const AttentionInputs& in, const reference::AttentionShape& shape,
                                      const std::vector<NumericsOptions>& configs, const Progress& progress = {});

}  // namespace flamia::analysis
