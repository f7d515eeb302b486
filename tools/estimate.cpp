#include "estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <thread>

#include "cli_args.h"

namespace flamia::cli {
namespace {

using analysis::NumericsWork;

// Core-seconds per causal score pair x head x head_dim ("unit") and per element of q, for each kind
// of step, at the slow end of what a shared 2-core machine gives (about twice what the emulation
// takes on an idle one). A non-causal document has twice the pairs.
struct Rate {
  double per_unit, per_element;
};
constexpr Rate kReferenceForward{0.8e-9, 4e-8}, kReferenceBackward{1.5e-9, 8e-8};
constexpr Rate kRouteForward{2.0e-9, 1.5e-7};  // quantization of q, k, v, then the forward
constexpr Rate kRouteBackward{5.5e-9, 3.0e-7};  // the backward, then five comparisons
constexpr double kInputsPerElement = 7e-8;     // seconds per draw of q, k, v or dO (one thread)
constexpr double kBaseBytes = 32e6;          // the process itself

int cores() { return std::max(1u, std::thread::hardware_concurrency()); }

double physical_ram() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
}

// Score pairs x heads x dim over the documents (causal: half the square).
double attention_units(const DocumentSizes& sizes, int heads, int dim, bool causal) {
  return sizes.squares * (causal ? 0.5 : 1.0) * heads * dim;
}

const Rate& rate_of(NumericsWork work) {
  switch (work) {
    case NumericsWork::kReferenceForward: return kReferenceForward;
    case NumericsWork::kReferenceBackward: return kReferenceBackward;
    case NumericsWork::kRouteForward: return kRouteForward;
    case NumericsWork::kRouteBackward: return kRouteBackward;
  }
  return kRouteBackward;
}

double step_seconds(const Rate& rate, double units, double q_elements) {
  return (units * rate.per_unit + q_elements * rate.per_element) / cores();
}

}  // namespace

DocumentSizes DocumentSizes::of(const std::vector<int>& lengths) {
  DocumentSizes s;
  for (int n : lengths) {
    s.tokens += n;
    s.squares += double(n) * double(n);
    s.longest = std::max(s.longest, double(n));
  }
  return s;
}

DocumentSizes DocumentSizes::uniform(int documents, int length) {
  const double d = documents, n = length;
  return {.tokens = d * n, .squares = d * n * n, .longest = documents > 0 ? n : 0.0};
}

double RunEstimate::seconds() const { return std::accumulate(step_seconds.begin(), step_seconds.end(), 0.0); }

RunEstimate estimate_numerics(const DocumentSizes& sizes, int heads, int kv_heads, int dim, bool causal,
                              const std::vector<analysis::NumericsStep>& steps) {
  const double q_elements = sizes.tokens * heads * dim, kv_elements = sizes.tokens * kv_heads * dim;
  const double units = attention_units(sizes, heads, dim, causal);
  RunEstimate e;
  // q, dO, o, dq (x2: reference and route) and their codes; k, v, dk, dv likewise: 14 q-sized
  // double tensors cover both with GQA; one L x L double matrix per document in flight.
  e.bytes = kBaseBytes + 8.0 * (10 * q_elements + 4 * kv_elements) + 8.0 * sizes.longest * sizes.longest;
  e.step_seconds.push_back(2 * (q_elements + kv_elements) * kInputsPerElement);  // generating inputs, one thread
  for (const auto& step : steps) e.step_seconds.push_back(step_seconds(rate_of(step.work), units, q_elements));
  return e;
}

RunEstimate estimate_probe(const std::vector<int>& lengths, int growth, int heads, int kv_heads, int dim) {
  std::vector<int> moved = lengths;
  if (!moved.empty()) moved[0] += growth;
  const DocumentSizes sizes = DocumentSizes::of(moved);
  const double q_elements = sizes.tokens * heads * dim, kv_elements = sizes.tokens * kv_heads * dim;
  RunEstimate e;
  // Three input sets (q, k, v, dO), two calls' outputs alive, the codes of one call.
  e.bytes = kBaseBytes + 8.0 * (16 * q_elements + 8 * kv_elements) + 8.0 * sizes.longest * sizes.longest;
  e.step_seconds.push_back(3 * 2 * (q_elements + kv_elements) * kInputsPerElement);
  const double units = attention_units(sizes, heads, dim, true);
  const double call = step_seconds(kRouteForward, units, q_elements) + step_seconds(kRouteBackward, units, q_elements);
  for (int i = 0; i < analysis::kProbeCalls; ++i) e.step_seconds.push_back(call);
  return e;
}

std::string format_bytes(double bytes) {
  char buf[32];
  if (bytes >= 1e15) std::snprintf(buf, sizeof buf, "%.1f PB", bytes / 1e15);
  else if (bytes >= 1e12) std::snprintf(buf, sizeof buf, "%.1f TB", bytes / 1e12);
  else if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  else std::snprintf(buf, sizeof buf, "%.0f MB", bytes / 1e6);
  return buf;
}

std::string format_seconds(double s) {
  char buf[32];
  if (s < 90) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 90 * 60) std::snprintf(buf, sizeof buf, "%.0f min", s / 60);
  else if (s < 72 * 3600) std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  else if (s < 3 * 365 * 86400.0) std::snprintf(buf, sizeof buf, "%.0f days", s / 86400);
  else std::snprintf(buf, sizeof buf, "%.0f years", s / (365 * 86400.0));
  return buf;
}

void refuse_if_too_large(const RunEstimate& e, bool force, const std::string& sizes) {
  if (force) return;
  const double ram = physical_ram();
  std::string over;
  if (ram > 0 && e.bytes > kMaxRamFraction * ram) {
    over = "about " + format_bytes(e.bytes) + " of memory, more than half of this machine's " + format_bytes(ram) +
           " of RAM";
  }
  if (e.seconds() > kMaxSeconds) {
    over += (over.empty() ? "" : ", and ") + std::string("about ") + format_seconds(e.seconds()) + " on " +
            std::to_string(cores()) + " cores, more than the " + "one-hour limit";
  }
  if (!over.empty()) {
    throw UsageError("this run needs " + over +
                     " (estimated before allocating); make it smaller (" + sizes + ") or pass --force to run it anyway");
  }
}

}  // namespace flamia::cli
