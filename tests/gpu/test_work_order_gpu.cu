// The attention kernels' work order (core/schedule.h, cuda/schedule/work_order.cuh): the table
// the device builds holds every tile of every document exactly once, sorted by cost (largest
// first), then idle entries, and its tile count, for document lists of 1 to 5000 documents, empty documents among
// them, causal and not. (That the kernels' outputs do not depend on the order is what every other
// GPU test checks: they run through it.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "core/schedule.h"
#include "cuda/schedule/work_order.cuh"
#include "forward_harness.h"

namespace flamia::gpu_test {
namespace {

void check_order(const std::vector<int>& lens, bool causal) {
  std::vector<int32_t> cu{0};
  for (int len : lens) cu.push_back(cu.back() + len);
  const int docs = int(lens.size()), total = cu.back();
  const int64_t entries = order::table_entries(total, docs);
  DeviceBuffer d_cu(cu.size() * sizeof(int32_t)), d_table(size_t(entries) * sizeof(order::OrderedTile)),
      d_counters(size_t(order::cost_counters(total)) * sizeof(int));
  FLAMIA_CUDA_CHECK(cudaMemcpy(d_cu.get(), cu.data(), cu.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  // Garbage first: the builder must not rely on zeroed buffers.
  FLAMIA_CUDA_CHECK(cudaMemset(d_table.get(), 0x5a, size_t(entries) * sizeof(order::OrderedTile)));
  FLAMIA_CUDA_CHECK(cudaMemset(d_counters.get(), 0x5a, size_t(order::cost_counters(total)) * sizeof(int)));
  FLAMIA_CUDA_CHECK(cuda::launch_build_work_order(static_cast<const int32_t*>(d_cu.get()), docs, total, causal,
                                                  static_cast<order::OrderedTile*>(d_table.get()),
                                                  static_cast<int*>(d_counters.get()), nullptr));
  std::vector<order::OrderedTile> table(static_cast<size_t>(entries));
  FLAMIA_CUDA_CHECK(cudaMemcpy(table.data(), d_table.get(), table.size() * sizeof(order::OrderedTile),
                               cudaMemcpyDeviceToHost));
  int tiles = -1;  // the kernels' work_order_tiles
  FLAMIA_CUDA_CHECK(cudaMemcpy(&tiles, d_counters.get(), sizeof(int), cudaMemcpyDeviceToHost));

  std::set<std::pair<int, int>> expected;  // every (document, tile)
  for (int d = 0; d < docs; ++d)
    for (int t = 0; t < int(slots::ceil_div(lens[d], order::kWorkTile)); ++t) expected.insert({d, t});
  const auto tiles_of = [&](int d) { return int(slots::ceil_div(lens[size_t(d)], order::kWorkTile)); };
  std::set<std::pair<int, int>> seen;
  int last_cost = 1 << 30, wrong = 0;
  for (int64_t e = 0; e < entries && wrong < 5; ++e) {
    const order::OrderedTile& t = table[size_t(e)];
    const bool tile = e < int64_t(expected.size());
    const auto where = [&] {
      return ::testing::Message() << docs << " documents, causal " << causal << ", entry " << e << ": doc "
                                  << t.doc << " tile " << t.tile;
    };
    if (!tile) {
      if (t.doc >= 0) ++wrong, ADD_FAILURE() << where() << ": expected an idle entry past the last tile";
      continue;
    }
    if (t.doc < 0 || t.doc >= docs || t.tile < 0 || t.tile >= tiles_of(t.doc)) {
      ++wrong, ADD_FAILURE() << where() << ": not a tile of a document";
      continue;
    }
    if (!seen.insert({t.doc, t.tile}).second) ++wrong, ADD_FAILURE() << where() << ": a tile listed twice";
    const int cost = order::tile_cost(t.tile, tiles_of(t.doc), causal);
    if (cost > last_cost) ++wrong, ADD_FAILURE() << where() << ": cost " << cost << " after " << last_cost;
    last_cost = cost;
  }
  EXPECT_EQ(seen, expected) << docs << " documents, causal " << causal;
  EXPECT_EQ(tiles, int(expected.size())) << docs << " documents, causal " << causal << ": the tile count";
}

TEST(WorkOrder, EveryTileOnceCostliestFirst) {
  FLAMIA_REQUIRE_GPU();
  for (bool causal : {true, false}) {
    check_order({1}, causal);
    check_order({65536}, causal);
    check_order(std::vector<int>(16, 4096), causal);
    check_order({100, 0, 129, 0}, causal);  // empty documents have no tiles
    check_order({31, 32, 33, 127, 129, 1000, 4097, 1, 1}, causal);
    std::vector<int> skewed(224, 256);  // the skewed benchmark workload's shape
    skewed.insert(skewed.begin(), 8192);
    check_order(skewed, causal);
    std::mt19937 rng(7);
    for (int docs : {2, 63, 1025, 5000}) {
      std::vector<int> lens(static_cast<size_t>(docs));
      for (int& len : lens) len = int(rng() % 3000);
      check_order(lens, causal);
    }
  }
}

}  // namespace
}  // namespace flamia::gpu_test
