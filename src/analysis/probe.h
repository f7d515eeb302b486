// The isolation probe (docs/DESIGN.md §3): perturb inputs that an output must not depend on and
// check, bitwise, that it does not move.
//
// For each isolation mode it runs three calls on three packed documents [A, B, C]:
//  - base;
//  - suffix control: every input of B after position i is redrawn and token i+1 is scaled by
//    2^suffix_boost_log2, so the scale exponent of the group holding i moves (and values of that
//    group cross the E4M3 subnormal edge). Rows 0..i of B are compared. Default (document) mode
//    is expected to change here, or the probe is blind; prefix mode must not change at all.
//  - other-document control: A and C are redrawn and A grows, so B moves to another offset in
//    the packed buffer. All rows of B are compared; nothing may change in any mode.
// Tensors: O, LSE and dQ (dQ for an incoming dO that is fixed on the compared rows).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "analysis/inputs.h"
#include "analysis/numerics.h"
#include "core/options.h"

namespace flamia::analysis {

struct ProbeOptions {
  std::vector<int> lengths{97, 420, 64};  // [A, B, C]; B is the probed document
  int q_heads = 4, kv_heads = 2, head_dim = 128;
  // i, document-local in B: mid-group and past the first tiling::kFrontierTiles 128-key tiles, so
  // that its row reads prefix isolation's interior codes too.
  int position = 301;
  int suffix_boost_log2 = 6;
  int other_document_growth = 37;  // tokens added to A, so B starts at another (unaligned) offset
  uint64_t seed = 0;
  ScaleGeometry scale_geometry = ScaleGeometry::kBlock32;
  ScaleRule scale_rule = ScaleRule::kCeil;
  Route route = Route::kMxfp8;
  bool hadamard = false;
};

// What the probe compares from one attention call: O and LSE, and dQ when the call has a backward.
struct ProbeOutputs {
  reference::PackedTensor o;
  reference::HeadTokenTensor lse;
  std::optional<reference::PackedTensor> dq;
};
// Runs one causal call on packed inputs with the given options; the CPU emulation by default, a
// GPU implementation in the GPU tests.
using ProbeCall = std::function<ProbeOutputs(const AttentionInputs&, const NumericsOptions&)>;
ProbeOutputs emulated_probe_call(const AttentionInputs& in, const NumericsOptions& options);
// The emulated call under a causal shape with a window or soft-capped scores (the contract holds
// for them too: a window only removes keys, and the cap transforms each score alone).
ProbeCall emulated_probe_call_for(const reference::AttentionShape& shape);

struct ProbeCase {
  Isolation mode;
  std::string control;  // "suffix" or "other_document"
  std::string tensor;   // "o", "lse" or "dq"
  double max_abs_change = 0.0;
  bool bitwise_equal = true;
  int64_t compared = 0;  // values compared
  int64_t changed = 0;   // of those, how many differ bitwise
};

// Throws std::invalid_argument for options that cannot make a probe (e.g. i outside B).
void check_probe_options(const ProbeOptions& options);

// The calls run_probe makes: base, suffix control and other-document control in each of the two
// isolation modes. It reports kProbeCalls + 1 progress steps: generating the inputs, then each call.
inline constexpr int kProbeCalls = 6;
std::vector<ProbeCase> run_probe(const ProbeOptions& options, const Progress& progress = {},
                                 const ProbeCall& call = emulated_probe_call);

// True when the contract holds and the probe is not blind: prefix mode unchanged under the
// suffix control, every mode unchanged under the other-document control, and document mode
// changed under the suffix control for O (and dQ when the call has it). `why` lists the cases
// that break it.
bool probe_passes(const std::vector<ProbeCase>& cases, std::string* why = nullptr);

}  // namespace flamia::analysis
