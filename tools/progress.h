// Progress lines on stderr, so that --json output on stdout stays machine-readable.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "estimate.h"

namespace flamia::cli {

class ProgressLog {
 public:
  explicit ProgressLog(bool quiet) : quiet_(quiet), start_(std::chrono::steady_clock::now()) {}
  void operator()(const std::string& step) const {
    if (quiet_) return;
    std::fprintf(stderr, "[%7.1fs] %s\n", elapsed(), step.c_str());
  }
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  bool quiet_;
  std::chrono::steady_clock::time_point start_;
};

// Progress through steps of estimated durations (RunEstimate::step_seconds): step(name) starts the
// next one (the previous is then done) and prints it with the share of the estimated work done and
// the time left; while a step runs, a line follows every `interval` seconds. Once the finished
// steps have taken kCalibrateSeconds, the estimates of the rest are scaled by how long those really
// took against their estimate (each kind of step has its own rate, so one scale fits them all).
class StepProgress {
 public:
  static constexpr double kCalibrateSeconds = 1.0;

  StepProgress(const ProgressLog& log, bool quiet, std::vector<double> step_seconds, double interval = 10)
      : log_(log), quiet_(quiet), estimate_(std::move(step_seconds)), interval_(interval) {
    if (!quiet_) ticker_ = std::thread([this] { tick(); });
  }
  ~StepProgress() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (ticker_.joinable()) ticker_.join();
  }
  StepProgress(const StepProgress&) = delete;
  StepProgress& operator=(const StepProgress&) = delete;

  void step(const std::string& name) {
    std::lock_guard lock(mutex_);
    const double now = log_.elapsed();
    if (current_ >= 0) done_seconds_ += now - step_start_;
    ++current_;
    step_start_ = now;
    name_ = name;
    if (!quiet_) log_(name + " (" + status(now) + ")");
    last_line_ = now;
  }

 private:
  // "35% of the estimated work done, about 3 min left" at time `now` (mutex held).
  std::string status(double now) const {
    const double total = std::accumulate(estimate_.begin(), estimate_.end(), 0.0);
    const size_t i = size_t(std::max(current_, 0));
    const size_t finished = std::min(i, estimate_.size());
    const double before = std::accumulate(estimate_.begin(), estimate_.begin() + finished, 0.0);
    // Finished steps that took less than kCalibrateSeconds in all say too little about the machine.
    const double scale = before > 0 && done_seconds_ >= kCalibrateSeconds ? done_seconds_ / before : 1.0;
    const double this_step = i < estimate_.size() ? estimate_[i] : 0.0;
    const double in_step = now - step_start_;
    const bool late = in_step > this_step * scale;
    const double fraction = this_step > 0 ? std::min(in_step / (this_step * scale), 0.99) : 0.0;
    const double left = std::max(0.0, (late ? 0.0 : this_step * scale - in_step) + (total - before - this_step) * scale);
    // Rounded down, so that 100% is never shown while work is left.
    const double percent = total > 0 ? std::floor(100.0 * (before + fraction * this_step) / total) : 0.0;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.0f%% of the estimated work done, about %s left%s", percent,
                  format_seconds(left + 0.0).c_str(),
                  late ? " after this step (running longer than estimated)" : "");
    return buf;
  }

  void tick() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::duration<double>(std::min(interval_, 1.0)), [this] { return stop_; });
      if (stop_ || current_ < 0) continue;
      const double now = log_.elapsed();
      if (now - last_line_ >= interval_) {
        log_("  " + name_ + ": " + status(now));
        last_line_ = now;
      }
    }
  }

  const ProgressLog& log_;
  bool quiet_;
  std::vector<double> estimate_;
  double interval_;
  int current_ = -1;
  double step_start_ = 0, done_seconds_ = 0, last_line_ = 0;
  std::string name_;
  bool stop_ = false;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread ticker_;
};

}  // namespace flamia::cli
