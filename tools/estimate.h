// What a CLI run of the CPU emulation will cost, worked out before anything is allocated, and the
// limits past which the CLI refuses a run (unless --force).
//
// The model counts memory as the run's packed double tensors (q, k, v, dO, the reference's and the
// route's outputs and gradients, the quantized operands) plus one document's score matrix, and
// time per progress step as the causal score pairs times heads times head_dim (the attention
// products) plus a term per element (input generation, quantization, comparisons), at rates
// measured on the emulation for each kind of step; both are upper estimates, the time within a
// factor of about 2 on an idle machine.
#pragma once

#include <string>
#include <vector>

#include "analysis/numerics.h"
#include "analysis/probe.h"

namespace flamia::cli {

// The document lengths as the estimates read them, from a list or from a count of equal lengths
// (--docs x --len) without building that list, which may hold billions of entries.
struct DocumentSizes {
  double tokens = 0, squares = 0, longest = 0;  // squares: sum of length^2
  static DocumentSizes of(const std::vector<int>& lengths);
  static DocumentSizes uniform(int documents, int length);
};

struct RunEstimate {
  double bytes = 0;                  // peak resident memory
  std::vector<double> step_seconds;  // wall seconds of each progress step, in the order they run
  double seconds() const;
};

// numerics: generating the inputs, then the steps of analysis::run_numerics.
RunEstimate estimate_numerics(const DocumentSizes& sizes, int heads, int kv_heads, int dim, bool causal,
                              const std::vector<analysis::NumericsStep>& steps);
// probe: generating its three input sets, then analysis::kProbeCalls causal calls (forward and
// backward) on three documents (A grows by `growth` in the moved call).
RunEstimate estimate_probe(const std::vector<int>& lengths, int growth, int heads, int kv_heads, int dim);

// The limits: memory over half of the machine's physical RAM, or over an hour of estimated time.
inline constexpr double kMaxRamFraction = 0.5;
inline constexpr double kMaxSeconds = 3600;

// Throws UsageError naming the estimate, the limit, the options that size the run (`sizes`) and
// --force when the run is over a limit and force is false.
void refuse_if_too_large(const RunEstimate& estimate, bool force, const std::string& sizes);

// "1.2 GB", "350 MB"; "45 s", "16 min", "2.5 h".
std::string format_bytes(double bytes);
std::string format_seconds(double seconds);

}  // namespace flamia::cli
