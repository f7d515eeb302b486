#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "analysis/inputs.h"
#include "analysis/numerics.h"
#include "core/documents.h"
#include "cli_args.h"
#include "estimate.h"
#include "commands.h"
#include "json.h"
#include "progress.h"

namespace flamia::cli {
namespace {

// docs/DESIGN.md §4 accuracy bars for the default route: cosine vs FP64.
constexpr double kCosineBarO = 0.998, kCosineBarGrad = 0.997;

// The default configuration's rows of every dQ reduction it runs (deterministic and fp16_partials
// when causal) must meet the bars.
bool default_config_meets_bars(const std::vector<analysis::NumericsRow>& rows, std::string* why) {
  bool ok = true;
  for (const auto& r : rows) {
    if (r.route != "mxfp8" || r.hadamard || r.isolation != "document" || r.geometry != "block32" || r.rule != "ceil" ||
        r.u_scale != "rowcol")
      continue;
    const double bar = r.tensor == "o" ? kCosineBarO : (r.tensor == "lse" ? 0.0 : kCosineBarGrad);
    if (!(r.cmp.cosine >= bar)) {
      ok = false;
      *why += r.tensor + " (" + r.backward + ") cosine " + std::to_string(r.cmp.cosine) + " < " + std::to_string(bar) + "; ";
    }
  }
  return ok;
}

}  // namespace

int run_numerics_command(int argc, char** argv) {
  int docs = 2, len = 1024, heads = 4, kv_heads = 0, dim = 128;  // kv_heads 0: not given, as many as heads
  int value_dim = 0;                                              // 0: not given, --dim
  std::vector<int> lengths, key_lengths, window = {-1, -1};
  double softcap = 0.0;
  uint64_t seed = 0;
  std::string inputs_name = "normal";
  bool json = false, quiet = false, non_causal = false, check = false, default_only = false, force = false;
  bool compare_routes = false;
  ArgParser args("numerics",
                 "Accuracy of the emulated routes, MXFP8 and mixed NVFP4/FP8 (bit-exact quantization, double\n"
                 "accumulation), against an unquantized FP64 reference on random BF16 inputs (--inputs): cosine,\n"
                 "relative L2, max abs error, row residual sum_j dS_ij, fraction of nonzero U entries rounded to\n"
                 "zero, saturation counts. One row per configuration (route, Hadamard rotation, isolation,\n"
                 "geometry, rule, U scale), dQ reduction (\"backward\": deterministic, and fp16_partials where it\n"
                 "applies: MXFP8, document isolation, causal) and tensor (o, lse, dq, dk, dv).");
  args.option("docs", &docs, "number of documents of length --len", 1);
  args.option("len", &len, "tokens per document", 1);
  args.option("lengths", &lengths, "explicit document lengths, each >= 0 (overrides --docs/--len)", 0);
  args.option("key-lengths", &key_lengths,
              "each document's keys, as many as documents, each >= 0 (flash_attn's cu_seqlens_k: the masks align "
              "bottom-right; prefix isolation, which needs equal documents, is then left out)",
              0);
  args.set_default_text("key-lengths", "the document lengths");
  args.option("heads", &heads, "query heads", 1);
  args.option("kv-heads", &kv_heads, "key/value heads: a divisor of --heads, >= 1", 1);
  args.set_default_text("kv-heads", "--heads");
  args.option("dim", &dim,
              "head dimension (a configuration it does not fit is left out: the Hadamard rotation needs a multiple of "
              "64, nvfp4_mixed of 16)",
              1);
  args.option("dv", &value_dim, "V's (and O's and dO's) head dimension, e.g. 128 with --dim 192 (MLA)", 1);
  args.set_default_text("dv", "--dim");
  args.option("seed", &seed, "random seed of the inputs");
  args.option("inputs", &inputs_name,
              "what the inputs look like: normal (standard normal draws), sharp (q and k x 1.6), outliers (two "
              "features per head: q's and k's x 4, v's x 20) or sink (every query leans toward its document's first "
              "key); the bars are defined on normal inputs");
  args.flag("non-causal", &non_causal, "attend to the whole document (prefix mode is then skipped)");
  args.option("window", &window,
              "LEFT,RIGHT: query i sees the keys i - LEFT .. i + RIGHT of its document, -1 for no bound on that side "
              "(flash_attn's window_size; causal caps RIGHT at 0)",
              -1);
  args.option("softcap", &softcap, "scores become SOFTCAP tanh(s / SOFTCAP) (Gemma 2); 0: raw scores", 0.0);
  args.flag("default-only", &default_only, "run only the default configuration (mxfp8, block32, ceil, document, rowcol)");
  args.flag("compare-routes", &compare_routes,
            "run only the routes side by side: mxfp8 and nvfp4_mixed, each without and with the Hadamard rotation");
  args.flag("check", &check, "exit 1 when the default route misses the accuracy bars (O >= 0.998, grads >= 0.997)");
  args.flag("json", &json, "print one JSON object instead of a table");
  args.flag("quiet", &quiet, "no progress lines on stderr");
  args.flag("force", &force, "run even when the estimate is over the limits (half the RAM, one hour)");
  args.set_epilog(exit_status_help("the run finished (with --check: the default route meets the accuracy bars)",
                                   "with --check: the default route misses the accuracy bars"));
  if (!args.parse(argc, argv)) return kExitOk;
  if (default_only && compare_routes) throw UsageError("--default-only and --compare-routes exclude each other");
  const analysis::InputKind input_kind = parse_flag<analysis::InputKind>("--inputs", inputs_name);
  // Sized from the arguments alone: --docs x --len is not spelled out into a list before it is
  // known to fit (a billion documents would take seconds and gigabytes to list).
  DocumentSizes sizes;
  if (lengths.empty()) {
    usage_check([&] { check_token_count(docs, int64_t(docs) * int64_t(len)); });
    sizes = DocumentSizes::uniform(docs, len);
  } else {
    usage_check([&] { total_tokens_of(lengths); });
    sizes = DocumentSizes::of(lengths);
  }
  if (sizes.tokens == 0) throw UsageError("the documents hold no tokens (every length is 0): there is nothing to compare");
  if (!key_lengths.empty()) {
    const int64_t documents = lengths.empty() ? docs : int64_t(lengths.size());
    if (int64_t(key_lengths.size()) != documents)
      throw UsageError("--key-lengths lists " + std::to_string(key_lengths.size()) + " documents but there are " +
                       std::to_string(documents));
    usage_check([&] { total_tokens_of(key_lengths); });
    if (std::all_of(key_lengths.begin(), key_lengths.end(), [](int n) { return n == 0; }))
      throw UsageError("the key documents hold no keys (every --key-lengths is 0): there is nothing to attend to");
    if (lengths.empty()) lengths.assign(docs, len);  // as many as --key-lengths lists: small
    // Sized at each document's larger side: a bound on its pairs and rows.
    std::vector<int> larger(lengths.size());
    for (size_t d = 0; d < lengths.size(); ++d) larger[d] = std::max(lengths[d], key_lengths[d]);
    sizes = DocumentSizes::of(larger);
    if (key_lengths == lengths) key_lengths.clear();  // self-attention after all
  }
  if (kv_heads == 0) kv_heads = heads;
  if (heads % kv_heads != 0) throw UsageError("--heads must be a positive multiple of --kv-heads");

  if (window.size() != 2) throw UsageError("--window expects LEFT,RIGHT (two integers, each >= -1)");
  const reference::AttentionShape shape{
      .causal = !non_causal, .window_left = window[0], .window_right = window[1], .softcap = softcap};
  std::vector<NumericsOptions> configs;
  for (const auto& c : compare_routes ? analysis::route_comparison_configs() : analysis::default_numerics_configs())
    if ((shape.causal && key_lengths.empty()) || c.isolation != Isolation::kPrefix) configs.push_back(c);
  if (default_only) configs.resize(1);  // the first configuration is the default route
  // Every configuration's rules for this head dim (the core's, as in every call), before any runs:
  // the first (the default route, which --check judges) must hold; another that this head dim does
  // not fit (Hadamard blocks, NVFP4 blocks) is left out and named.
  std::vector<std::string> left_out;
  for (size_t i = 0; i < configs.size();) {
    const std::optional<std::string> e = options_error({.shape = shape, .numerics = configs[i]}, dim);
    if (!e) {
      ++i;
      continue;
    }
    if (i == 0) throw UsageError("configuration " + analysis::config_name(configs[i]) + ": " + *e);
    left_out.push_back(analysis::config_name(configs[i]) + " (" + *e + ")");
    configs.erase(configs.begin() + ptrdiff_t(i));
  }
  const std::vector<analysis::NumericsStep> steps = analysis::numerics_steps(configs, shape);
  // Sized before anything is allocated: a run over the limits is refused at once.
  if (value_dim == 0) value_dim = dim;
  // Sized at the larger of the two head dims: a bound on both.
  const RunEstimate estimate = estimate_numerics(sizes, heads, kv_heads, std::max(dim, value_dim), shape.causal, steps);
  refuse_if_too_large(estimate, force, "--docs, --len, --lengths, --key-lengths, --heads, --dim, --dv");
  if (lengths.empty()) lengths.assign(docs, len);  // known to fit now

  const ProgressLog log(quiet);
  for (const std::string& config : left_out) log("left out: " + config);
  log("estimated: " + format_seconds(estimate.seconds()) + ", " + format_bytes(estimate.bytes) + " of memory");
  std::vector<analysis::NumericsRow> rows;
  {
    StepProgress progress(log, quiet, estimate.step_seconds);
    progress.step("generating inputs");
    const auto inputs = analysis::random_inputs({lengths, heads, kv_heads, dim, value_dim, key_lengths}, seed, input_kind);
    rows = analysis::run_numerics(inputs, shape, configs, [&](const std::string& step) { progress.step(step); });
  }
  log("done");
  std::string why;
  const bool bars = default_config_meets_bars(rows, &why);

  if (json) {
    std::printf("{\"rows\": [");
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      const auto& s = r.stats;
      std::printf(
          "%s{\"route\": %s, \"hadamard\": %s, \"isolation\": %s, \"geometry\": %s, \"rule\": %s, \"u_scale\": %s, \"backward\": %s, "
          "\"tensor\": %s, "
          "\"cosine\": %s, \"rel_l2\": %s, \"max_abs\": %s, \"row_residual_max\": %s, \"row_residual_rms\": %s, "
          "\"u_zero_fraction\": %s, \"saturated\": {\"q\": %lld, \"k\": %lld, \"v\": %lld, \"do\": %lld, \"p\": %lld, "
          "\"u\": %lld}}",
          i ? ", " : "", json_string(r.route).c_str(), json_bool(r.hadamard).c_str(), json_string(r.isolation).c_str(), json_string(r.geometry).c_str(),
          json_string(r.rule).c_str(), json_string(r.u_scale).c_str(), json_string(r.backward).c_str(),
          json_string(r.tensor).c_str(),
          json_number(r.cmp.cosine).c_str(), json_number(r.cmp.rel_l2).c_str(), json_number(r.cmp.max_abs).c_str(),
          json_number(s.row_residual_max).c_str(), json_number(s.row_residual_rms()).c_str(),
          json_number(s.u_zero_fraction()).c_str(), (long long)s.saturated_q, (long long)s.saturated_k,
          (long long)s.saturated_v, (long long)s.saturated_g, (long long)s.saturated_p, (long long)s.saturated_u);
    }
    std::printf("], \"left_out\": [");
    for (size_t i = 0; i < left_out.size(); ++i) std::printf("%s%s", i ? ", " : "", json_string(left_out[i]).c_str());
    std::printf("], \"inputs\": %s, \"meets_bars\": %s}\n", json_string(std::string(to_string(input_kind))).c_str(),
                json_bool(bars).c_str());
  } else {
    auto list = [](const std::vector<int>& v) {
      std::string out;
      for (int n : v) out += (out.empty() ? "" : ",") + std::to_string(n);
      return out;
    };
    std::string ls = list(lengths);
    if (!key_lengths.empty()) ls += "], keys [" + list(key_lengths);
    std::string mask = shape.causal ? "causal" : "non-causal";
    if (shape.windowed())
      mask += ", window (" + std::to_string(shape.window_left) + ", " + std::to_string(shape.window_right) + ")";
    if (shape.softcap > 0) {
      char cap[48];
      std::snprintf(cap, sizeof cap, ", softcap %g", shape.softcap);
      mask += cap;
    }
    const std::string dims = value_dim == dim ? "D = " + std::to_string(dim)
                                              : "D = " + std::to_string(dim) + ", Dv = " + std::to_string(value_dim);
    std::printf("numerics vs FP64: documents [%s], %s, heads %d/%d, %s, %s inputs, seed %llu\n", ls.c_str(),
                mask.c_str(), heads, kv_heads, dims.c_str(), std::string(to_string(input_kind)).c_str(),
                (unsigned long long)seed);
    for (const std::string& config : left_out) std::printf("left out: %s\n", config.c_str());
    std::printf("\n");
    std::printf("| route       | hadamard | isolation | geometry | rule  | U scale  | backward      | tensor | cosine    | rel L2    | max abs  | row res max | row res rms | U zero frac | saturated q/k/v/dO/P/U |\n");
    std::printf("|-------------|----------|-----------|----------|-------|----------|---------------|--------|-----------|-----------|----------|-------------|-------------|-------------|------------------------|\n");
    for (const auto& r : rows) {
      const auto& s = r.stats;
      char saturated[128];
      std::snprintf(saturated, sizeof saturated, "%lld/%lld/%lld/%lld/%lld/%lld", (long long)s.saturated_q,
                    (long long)s.saturated_k, (long long)s.saturated_v, (long long)s.saturated_g,
                    (long long)s.saturated_p, (long long)s.saturated_u);
      std::printf("| %-11s | %-8s | %-9s | %-8s | %-5s | %-8s | %-13s | %-6s | %.7f | %.3e | %.2e | %11.3e | %11.3e | %11.5f | %-22s |\n",
                  r.route.c_str(), r.hadamard ? "on" : "off", r.isolation.c_str(), r.geometry.c_str(), r.rule.c_str(), r.u_scale.c_str(),
                  r.backward.c_str(), r.tensor.c_str(), r.cmp.cosine, r.cmp.rel_l2, r.cmp.max_abs, s.row_residual_max, s.row_residual_rms(),
                  s.u_zero_fraction(), saturated);
    }
    std::printf("\naccuracy bars (default route, cosine: O >= %.3f, dQ/dK/dV >= %.3f): %s\n", kCosineBarO, kCosineBarGrad,
                bars ? "met" : ("MISSED: " + why).c_str());
  }
  return check && !bars ? kExitFailed : kExitOk;
}

}  // namespace flamia::cli
