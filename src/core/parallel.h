// A minimal fork-join loop for the CPU reference and emulation. Work items must be independent
// and write disjoint outputs, so results do not depend on the thread count or schedule.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flamia {

template <class F>
void parallel_for(int count, F&& body) {
  const int workers = std::max(1, std::min<int>(count, int(std::thread::hardware_concurrency())));
  if (workers <= 1) {
    for (int i = 0; i < count; ++i) body(i);
    return;
  }
  std::atomic<int> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&] {
    for (int i; (i = next.fetch_add(1)) < count;) {
      try {
        body(i);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers; ++w) threads.emplace_back(run);
  run();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flamia
