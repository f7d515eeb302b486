#include <cstdio>
#include <optional>
#include <string>

#include "analysis/probe.h"
#include "cli_args.h"
#include "estimate.h"
#include "commands.h"
#include "json.h"
#include "progress.h"

namespace flamia::cli {

int run_probe_command(int argc, char** argv) {
  analysis::ProbeOptions o;
  bool json = false, quiet = false, force = false;
  std::string geometry = "block32", rule = "ceil", route = "mxfp8";
  int window_left = -1;
  double softcap = 0.0;
  ArgParser args("probe",
                 "Suffix-perturbation probe of the CPU emulation (docs/DESIGN.md §3). Packs three documents\n"
                 "[A, B, C], changes B after position i (suffix control) or changes and moves A and C\n"
                 "(other-document control), and compares O, LSE and dQ bitwise in document and prefix mode.");
  args.option("lengths", &o.lengths, "lengths of the three documents A,B,C (B is probed), each >= 1", 1);
  args.option("position", &o.position, "probed position i inside B (document-local)");
  args.option("heads", &o.q_heads, "query heads", 1);
  args.option("kv-heads", &o.kv_heads, "key/value heads: a divisor of --heads, >= 1", 1);
  args.option("dim", &o.head_dim, "head dimension", 1);
  args.option("seed", &o.seed, "random seed of the inputs");
  args.option("suffix-boost", &o.suffix_boost_log2, "log2 of the factor applied to token i+1 in the suffix control");
  args.option("geometry", &geometry, "scale groups of loaded operands: block32 or token");
  args.option("rule", &rule, "scale exponent rule: ceil or floor");
  args.option("route", &route, "mxfp8, or nvfp4_mixed (S on NVFP4 Q and K, the other products as mxfp8)");
  args.option("window", &window_left, "LEFT: query i sees the keys i - LEFT .. i (a causal sliding window); -1: all", -1);
  args.option("softcap", &softcap, "scores become SOFTCAP tanh(s / SOFTCAP); 0: raw scores", 0.0);
  args.flag("hadamard", &o.hadamard,
            "rotate Q and K before quantizing (normalized Walsh-Hadamard in blocks of 128 features, or of 64 when "
            "--dim is not a multiple of 128; --dim a multiple of 64)");
  args.flag("json", &json, "print one JSON object instead of a table");
  args.flag("quiet", &quiet, "no progress lines on stderr");
  args.flag("force", &force, "run even when the estimate is over the limits (half the RAM, one hour)");
  args.set_epilog(exit_status_help("the contract holds and the positive control is visible",
                                   "the contract is broken, or the probe is blind (the positive control did not fire)"));
  if (!args.parse(argc, argv)) return kExitOk;
  o.scale_geometry = parse_flag<ScaleGeometry>("--geometry", geometry);
  o.scale_rule = parse_flag<ScaleRule>("--rule", rule);
  o.route = parse_flag<Route>("--route", route);
  usage_check([&] { analysis::check_probe_options(o); });
  const reference::AttentionShape shape{.causal = true, .window_left = window_left, .softcap = softcap};
  usage_check([&] { check_options({.shape = shape}, o.head_dim); });
  // Sized before anything is allocated: a run over the limits is refused at once.
  const RunEstimate estimate = estimate_probe(o.lengths, o.other_document_growth, o.q_heads, o.kv_heads, o.head_dim);
  refuse_if_too_large(estimate, force, "--lengths, --heads, --dim");

  const ProgressLog log(quiet);
  log("estimated: " + format_seconds(estimate.seconds()) + ", " + format_bytes(estimate.bytes) + " of memory");
  std::vector<analysis::ProbeCase> cases;
  {
    StepProgress steps(log, quiet, estimate.step_seconds);
    cases = analysis::run_probe(o, [&](const std::string& step) { steps.step(step); },
                                analysis::emulated_probe_call_for(shape));
  }
  std::string why;
  const bool ok = analysis::probe_passes(cases, &why);

  if (json) {
    std::printf("{\"cases\": [");
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      std::printf("%s{\"mode\": %s, \"control\": %s, \"tensor\": %s, \"max_abs_change\": %s, \"bitwise_equal\": %s, "
                  "\"compared\": %lld, \"changed\": %lld}",
                  i ? ", " : "", json_string(std::string(to_string(c.mode))).c_str(), json_string(c.control).c_str(),
                  json_string(c.tensor).c_str(), json_number(c.max_abs_change).c_str(), json_bool(c.bitwise_equal).c_str(),
                  (long long)c.compared, (long long)c.changed);
    }
    std::printf("], \"pass\": %s}\n", json_bool(ok).c_str());
  } else {
    std::printf("isolation probe: documents %d,%d,%d, i = %d, heads %d/%d, D = %d, %s%s, %s/%s, seed %llu",
                o.lengths[0], o.lengths[1], o.lengths[2], o.position, o.q_heads, o.kv_heads, o.head_dim, route.c_str(),
                o.hadamard ? "+hadamard" : "", geometry.c_str(), rule.c_str(), (unsigned long long)o.seed);
    if (window_left >= 0) std::printf(", window %d", window_left);
    if (softcap > 0) std::printf(", softcap %g", softcap);
    std::printf("\n\n");
    std::printf("| mode     | control        | tensor | max abs change | bitwise equal | changed / compared |\n");
    std::printf("|----------|----------------|--------|----------------|---------------|--------------------|\n");
    for (const auto& c : cases) {
      std::printf("| %-8s | %-14s | %-6s | %14.6g | %-13s | %8lld / %-8lld |\n", std::string(to_string(c.mode)).c_str(),
                  c.control.c_str(), c.tensor.c_str(), c.max_abs_change, c.bitwise_equal ? "yes" : "no",
                  (long long)c.changed, (long long)c.compared);
    }
    std::printf("\n%s\n", ok ? "PASS: prefix mode and other documents unchanged; document mode shows the suffix leak"
                             : ("FAIL: " + why).c_str());
  }
  return ok ? kExitOk : kExitFailed;
}

}  // namespace flamia::cli
