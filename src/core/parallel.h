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

// Runs body(item) for items 0 .. count-1: those for which small(item) holds side by side, the
// others one after another (each is expected to run parallel_for inside), so neither many short
// items nor one long item leaves cores idle. Items must write disjoint outputs.
template <class Small, class F>
void parallel_for_small_then_large(int count, Small&& small, F&& body) {
  std::vector<int> small_items, large_items;
  for (int item = 0; item < count; ++item) (small(item) ? small_items : large_items).push_back(item);
  parallel_for(int(small_items.size()), [&](int i) { body(small_items[i]); });
  for (int item : large_items) body(item);
}

}  // namespace flamia
