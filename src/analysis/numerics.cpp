#include "analysis/numerics.h"

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

std::vector<NumericsRow> run_numerics(const AttentionInputs& in, const reference::AttentionShape& shape,
                                      const std::vector<NumericsOptions>& configs, const Progress& progress) {
  using namespace reference;
  if (progress) progress("fp64 reference");
  const ForwardOutputs exact = reference_forward(in.q, in.k, in.v, in.docs, shape);
  const Gradients exact_grads = reference_backward(in.q, in.k, in.v, exact.o, exact.lse, in.dout, in.docs, shape);

  std::vector<NumericsRow> rows;
  for (const NumericsOptions& opt : configs) {
    // The geometry as the option names it (prefix isolation's block32 is per token at the frontier).
    const std::string name = std::string(to_string(opt.route)) + (opt.hadamard ? "+hadamard " : " ") +
                             std::string(to_string(opt.isolation)) + "/" + std::string(to_string(opt.scale_geometry)) +
                             "/" + std::string(to_string(opt.scale_rule)) + "/u=" + std::string(to_string(opt.u_scale));
    if (progress) progress(name);
    RouteStats forward_stats;
    const QuantizedInputs qin = quantize_inputs(in.q, in.k, in.v, in.docs, opt);
    const ForwardOutputs fwd = mxfp8_forward(qin, in.docs, shape, opt, &forward_stats);
    std::vector<DqReduction> reductions = {DqReduction::kDeterministic};
    if (opt.uses_fp16_partials(shape.causal)) reductions.push_back(DqReduction::kFp16Partials);
    for (const DqReduction reduction : reductions) {
      NumericsOptions run = opt;
      run.dq_reduction = reduction;
      RouteStats stats = forward_stats;
      if (progress && reductions.size() > 1) progress(name + " backward " + std::string(to_string(reduction)));
      const Gradients grads = mxfp8_backward(qin, fwd, in.dout, in.docs, shape, run, &stats);
      const std::pair<const char*, Comparison> tensors[] = {
          {"o", compare(fwd.o.data, exact.o.data)},
          {"lse", compare(fwd.lse.data, exact.lse.data)},
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
  return rows;
}

}  // namespace flamia::analysis
