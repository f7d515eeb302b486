#include "estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <thread>

#include "cli_args.h"

namespace flamia::cli {
namespace {

// Core-seconds per causal score pair x head x head_dim element, measured on the emulation (at the
// slow end of what a shared 2-core machine gives): the FP64 reference's forward and backward, and
// one route configuration's quantization, forward and backward. A non-causal document has twice
// the pairs.
constexpr double kReferencePerUnit = 8e-9, kConfigPerUnit = 1e-8;
constexpr double kPerElement = 4e-7;  // core-seconds per element of q per call (quantize, compare)
constexpr double kBaseBytes = 32e6;   // the process itself

int cores() { return std::max(1u, std::thread::hardware_concurrency()); }

double physical_ram() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
}

// Score pairs x heads x dim over the documents (causal: half the square).
double attention_units(const std::vector<int>& lengths, int heads, int dim, bool causal) {
  double pairs = 0;
  for (int n : lengths) pairs += double(n) * double(n) * (causal ? 0.5 : 1.0);
  return pairs * heads * dim;
}

double longest(const std::vector<int>& lengths) {
  return lengths.empty() ? 0.0 : double(*std::max_element(lengths.begin(), lengths.end()));
}

}  // namespace

double RunEstimate::seconds() const { return std::accumulate(step_seconds.begin(), step_seconds.end(), 0.0); }

RunEstimate estimate_numerics(const std::vector<int>& lengths, int heads, int kv_heads, int dim, bool causal,
                              int configs) {
  double tokens = 0;
  for (int n : lengths) tokens += n;
  const double q_elements = tokens * heads * dim, kv_elements = tokens * kv_heads * dim;
  const double units = attention_units(lengths, heads, dim, causal), c = cores();
  RunEstimate e;
  // q, dO, o, dq (x2: reference and route) and their codes; k, v, dk, dv likewise: 14 q-sized
  // double tensors cover both with GQA; one L x L double matrix per document in flight.
  e.bytes = kBaseBytes + 8.0 * (10 * q_elements + 4 * kv_elements) + 8.0 * longest(lengths) * longest(lengths);
  e.step_seconds.push_back((units * kReferencePerUnit + q_elements * kPerElement) / c);
  for (int i = 0; i < configs; ++i) e.step_seconds.push_back((units * kConfigPerUnit + q_elements * kPerElement) / c);
  return e;
}

RunEstimate estimate_probe(const std::vector<int>& lengths, int growth, int heads, int kv_heads, int dim) {
  std::vector<int> moved = lengths;
  if (!moved.empty()) moved[0] += growth;
  double tokens = growth;
  for (int n : lengths) tokens += n;
  const double q_elements = tokens * heads * dim, kv_elements = tokens * kv_heads * dim, c = cores();
  RunEstimate e;
  // Three input sets (q, k, v, dO), two calls' outputs alive, the codes of one call.
  e.bytes = kBaseBytes + 8.0 * (16 * q_elements + 8 * kv_elements) + 8.0 * longest(moved) * longest(moved);
  const double units = attention_units(moved, heads, dim, true);
  for (int i = 0; i < 6; ++i) e.step_seconds.push_back((units * kConfigPerUnit + q_elements * kPerElement) / c);
  return e;
}

std::string format_bytes(double bytes) {
  char buf[32];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  else std::snprintf(buf, sizeof buf, "%.0f MB", bytes / 1e6);
  return buf;
}

std::string format_seconds(double s) {
  char buf[32];
  if (s < 90) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 90 * 60) std::snprintf(buf, sizeof buf, "%.0f min", s / 60);
  else std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
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
