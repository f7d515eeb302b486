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

// A configuration as the table's progress and messages name it, e.g. "mxfp8+hadamard
// document/block32/ceil/u=rowcol" (prefix isolation's block32 is per token at the frontier).
std::string config_name(const NumericsOptions& config);

using Progress = std::function<void(const std::string&)>;

// What one step of run_numerics computes: a caller sizes each step from this before running.
enum class NumericsWork {
  kReferenceForward,   // FP64 forward
  kReferenceBackward,  // FP64 backward
  kRouteForward,       // one configuration's quantization and forward
  kRouteBackward,      // one configuration's backward with one dQ reduction, and the comparisons
};
struct NumericsStep {
  NumericsWork work;
  std::string name;  // as run_numerics passes it to the progress callback
};

// The steps run_numerics takes for these configurations, in order; it reports each one to its
// progress callback as it starts.
std::vector<NumericsStep> numerics_steps(const std::vector<NumericsOptions>& configs,
                                         const reference::AttentionShape& shape);

// Runs the FP64 reference once and every configuration against it; rows for o, lse, dq, dk, dv.
// A configuration runs the deterministic backward, and where FP16 dQ partials apply to it
// (NumericsOptions::uses_fp16_partials) the fp16_partials backward too, over the same forward:
// rows of both reductions, deterministic first (o and lse repeat, the stats are each call's).
std::vector<NumericsRow> run_numerics(const AttentionInputs& in, const reference::AttentionShape& shape,
                                      const std::vector<NumericsOptions>& configs, const Progress& progress = {});

}  // namespace flamia::analysis
