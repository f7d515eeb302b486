#include "analysis/numerics.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "reference/attention_fp64.h"

namespace flamia::analysis {

std::vector<NumericsOptions> default_numerics_configs() {
  std::vector<NumericsOptions> configs(6);
  configs[1].scale_geometry = ScaleGeometry::kToken;
  configs[2].scale_rule = ScaleRule::kFloor;
  configs[3].isolation = Isolation::kPrefix;  // block32: interior codes, per-token at the frontier
  configs[4].isolation = Isolation::kPrefix;
  configs[4].scale_geometry = ScaleGeometry::kToken;
  configs[5].u_scale = UScaleGeometry::kSquare32;
  const auto routes = route_comparison_configs();
  configs.insert(configs.end(), routes.begin() + 1, routes.end());  // the first is the default route
  return configs;
}

std::vector<NumericsOptions> route_comparison_configs() {
  std::vector<NumericsOptions> configs(4);
  configs[1].hadamard = true;
  configs[2].route = configs[3].route = Route::kNvfp4Mixed;
  configs[3].hadamard = true;
  return configs;
}

std::string config_name(const NumericsOptions& opt) {
  return std::string(to_string(opt.route)) + (opt.hadamard ? "+hadamard " : " ") + std::string(to_string(opt.isolation)) +
         "/" + std::string(to_string(opt.scale_geometry)) + "/" + std::string(to_string(opt.scale_rule)) +
         "/u=" + std::string(to_string(opt.u_scale));
}

namespace {
// The dQ reductions a configuration's rows report: deterministic, then fp16_partials where it applies.
std::vector<DqReduction> reductions_of(const NumericsOptions& opt, bool causal) {
  std::vector<DqReduction> reductions = {DqReduction::kDeterministic};
  if (opt.uses_fp16_partials(causal)) reductions.push_back(DqReduction::kFp16Partials);
  return reductions;
}

// LSE over the rows that see a key: a row that sees none (a causal query before its document's
// first key, with documents of their own key lengths) has LSE = -inf in both, and -inf would turn
// every sum of the comparison into NaN. A row -inf on one side only makes the result NaN.
Comparison compare_lse(const std::vector<double>& approx, const std::vector<double>& exact) {
  std::vector<double> a, e;
  bool one_sided = false;
  for (size_t i = 0; i < exact.size(); ++i) {
    const bool empty_exact = std::isinf(exact[i]) && exact[i] < 0, empty_approx = std::isinf(approx[i]) && approx[i] < 0;
    if (empty_exact != empty_approx) one_sided = true;
    if (empty_exact || empty_approx) continue;
    a.push_back(approx[i]);
    e.push_back(exact[i]);
  }
  if (!one_sided) return compare(a, e);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  return {nan, nan, nan};
}
}  // namespace

std::vector<NumericsStep> numerics_steps(const std::vector<NumericsOptions>& configs,
                                         const reference::AttentionShape& shape) {
  std::vector<NumericsStep> steps = {{NumericsWork::kReferenceForward, "fp64 reference forward"},
                                     {NumericsWork::kReferenceBackward, "fp64 reference backward"}};
  for (const NumericsOptions& opt : configs) {
    const std::string name = config_name(opt);
    steps.push_back({NumericsWork::kRouteForward, name + " forward"});
    for (const DqReduction reduction : reductions_of(opt, shape.causal))
      steps.push_back({NumericsWork::kRouteBackward, name + " backward " + std::string(to_string(reduction))});
  }
  return steps;
}

std::vector<NumericsRow> run_numerics(const AttentionInputs& in, const reference::AttentionShape& shape,
                                      const std::vector<NumericsOptions>& configs, const Progress& progress) {
  using namespace reference;
  // Each step is announced from numerics_steps, so what a caller estimated is what runs.
  const std::vector<NumericsStep> steps = numerics_steps(configs, shape);
  size_t next = 0;
  const auto start = [&](NumericsWork work) {
    if (next >= steps.size() || steps[next].work != work)
      throw std::logic_error("run_numerics: its steps went out of step with numerics_steps");
    if (progress) progress(steps[next].name);
    ++next;
  };
  start(NumericsWork::kReferenceForward);
  const Documents& k_docs = in.key_docs();  // the same object as in.docs for self-attention
  const ForwardOutputs exact = reference_forward(in.q, in.k, in.v, in.docs, k_docs, shape);
  start(NumericsWork::kReferenceBackward);
  const Gradients exact_grads =
      reference_backward(in.q, in.k, in.v, exact.o, exact.lse, in.dout, in.docs, k_docs, shape);

  std::vector<NumericsRow> rows;
  for (const NumericsOptions& opt : configs) {
    start(NumericsWork::kRouteForward);
    RouteStats forward_stats;
    const QuantizedInputs qin = quantize_inputs(in.q, in.k, in.v, in.docs, k_docs, opt);
    const ForwardOutputs fwd = mxfp8_forward(qin, in.docs, k_docs, shape, opt, &forward_stats);
    for (const DqReduction reduction : reductions_of(opt, shape.causal)) {
      start(NumericsWork::kRouteBackward);
      NumericsOptions run = opt;
      run.dq_reduction = reduction;
      RouteStats stats = forward_stats;
      const Gradients grads = mxfp8_backward(qin, fwd, in.dout, in.docs, k_docs, shape, run, &stats);
      const std::pair<const char*, Comparison> tensors[] = {
          {"o", compare(fwd.o.data, exact.o.data)},
          {"lse", compare_lse(fwd.lse.data, exact.lse.data)},
          {"dq", compare(grads.dq.data, exact_grads.dq.data)},
          {"dk", compare(grads.dk.data, exact_grads.dk.data)},
          {"dv", compare(grads.dv.data, exact_grads.dv.data)},
      };
      for (const auto& [tensor, cmp] : tensors) {
        rows.push_back({std::string(to_string(opt.route)), std::string(to_string(opt.isolation)),
                        std::string(to_string(opt.scale_geometry)), std::string(to_string(opt.scale_rule)),
                        std::string(to_string(opt.u_scale)), opt.hadamard, std::string(to_string(reduction)), tensor,
                        cmp, stats});
      }
    }
  }
  if (next != steps.size()) throw std::logic_error("run_numerics: ran fewer steps than numerics_steps lists");
  return rows;
}

}  // namespace flamia::analysis
