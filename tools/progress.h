// Progress lines on stderr, so that --json output on stdout stays machine-readable.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace flamia::cli {

class ProgressLog {
 public:
  explicit ProgressLog(bool quiet) : quiet_(quiet), start_(std::chrono::steady_clock::now()) {}
  void operator()(const std::string& step) const {
    if (quiet_) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "[%7.1fs] %s\n", s, step.c_str());
  }

 private:
  bool quiet_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace flamia::cli
