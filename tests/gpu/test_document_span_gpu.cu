// Finding a tile slot's document on the device (cuda/schedule/document_span.cuh): the one-thread bisection
// (document_tile) and the whole-warp 32-way search (document_tile_warp, the persistent forward's
// producer) both against the host's numbering of core/schedule.h, for every slot of
// document lists of 1 to 5000 documents.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/schedule.h"
#include "cuda/schedule/document_span.cuh"
#include "forward_harness.h"

namespace flamia::gpu_test {
namespace {

constexpr int kUnit = 128;

// Per slot: doc, tile, tiles, valid, from the one-thread search and from the warp search.
struct Found {
  int doc, tile, tiles, valid;
};

__global__ void find_every_slot(const int32_t* cu_seqlens, int num_docs, int total_tokens, int slots, Found* bisected,
                                Found* warp_searched) {
  const int slot = int(blockIdx.x);  // one warp per slot
  if (slot >= slots) return;
  cuda::DocumentTile tile;
  const bool valid = cuda::document_tile_warp(cu_seqlens, num_docs, total_tokens, kUnit, slot, tile);
  if (threadIdx.x == 5) warp_searched[slot] = {tile.doc, tile.tile, tile.tiles, valid ? 1 : 0};
  if (threadIdx.x == 0) {
    const bool v = cuda::document_tile(cu_seqlens, num_docs, total_tokens, kUnit, slot, tile);
    bisected[slot] = {tile.doc, tile.tile, tile.tiles, v ? 1 : 0};
  }
}

// The host's answer: each document's tiles in order at its first slot; other slots idle.
std::vector<Found> host_slots(const std::vector<int32_t>& cu) {
  const int docs = int(cu.size()) - 1, total = cu.back();
  std::vector<Found> out(size_t(slots::slot_count(total, docs, kUnit)), Found{-1, -1, -1, 0});
  for (int d = 0; d < docs; ++d) {
    const int tiles = int(slots::ceil_div(cu[d + 1] - cu[d], kUnit));
    const int64_t first = slots::first_slot(cu[d], d, kUnit);
    for (int t = 0; t < tiles; ++t) out[size_t(first + t)] = {d, t, tiles, 1};
  }
  return out;
}

void check_lengths(const std::vector<int>& lens) {
  std::vector<int32_t> cu{0};
  for (int len : lens) cu.push_back(cu.back() + len);
  const int docs = int(lens.size()), total = cu.back();
  const std::vector<Found> expect = host_slots(cu);
  const int slots = int(expect.size());
  DeviceBuffer d_cu(cu.size() * sizeof(int32_t)), d_bis(slots * sizeof(Found)), d_warp(slots * sizeof(Found));
  FLAMIA_CUDA_CHECK(cudaMemcpy(d_cu.get(), cu.data(), cu.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  find_every_slot<<<slots, 32>>>(static_cast<const int32_t*>(d_cu.get()), docs, total, slots,
                                 static_cast<Found*>(d_bis.get()), static_cast<Found*>(d_warp.get()));
  FLAMIA_CUDA_CHECK(cudaGetLastError());
  std::vector<Found> bis(slots), warp(slots);
  FLAMIA_CUDA_CHECK(cudaMemcpy(bis.data(), d_bis.get(), slots * sizeof(Found), cudaMemcpyDeviceToHost));
  FLAMIA_CUDA_CHECK(cudaMemcpy(warp.data(), d_warp.get(), slots * sizeof(Found), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int s = 0; s < slots && wrong < 10; ++s) {
    for (const auto& [name, got] : {std::pair{"bisection", bis[s]}, std::pair{"warp search", warp[s]}}) {
      const bool ok = got.valid == expect[s].valid &&
                      (!got.valid || (got.doc == expect[s].doc && got.tile == expect[s].tile &&
                                      got.tiles == expect[s].tiles));
      if (!ok) {
        ++wrong;
        ADD_FAILURE() << name << ", " << docs << " documents, slot " << s << ": doc " << got.doc << " tile "
                      << got.tile << "/" << got.tiles << " valid " << got.valid << ", expected doc "
                      << expect[s].doc << " tile " << expect[s].tile << "/" << expect[s].tiles << " valid "
                      << expect[s].valid;
      }
    }
  }
}

TEST(DocumentSpan, BothSearchesFindEverySlotsDocument) {
  FLAMIA_REQUIRE_GPU();
  check_lengths({1});
  check_lengths({4096});
  check_lengths({100, 129});
  check_lengths(std::vector<int>(31, 128));  // fewer documents than lanes, all aligned
  check_lengths(std::vector<int>(32, 1));
  check_lengths(std::vector<int>(33, 300));
  std::mt19937 rng(5);
  for (int docs : {2, 63, 1000, 1025, 5000}) {
    std::vector<int> lens(docs);
    for (int& len : lens) len = 1 + int(rng() % 700);
    check_lengths(lens);
  }
  std::vector<int> skewed(224, 256);  // the skewed benchmark workload's shape
  skewed.insert(skewed.begin(), 8192);
  check_lengths(skewed);
}

}  // namespace
}  // namespace flamia::gpu_test
