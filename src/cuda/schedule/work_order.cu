// The work order's table (core/schedule.h), built by one CTA per call: a counting sort of every
// document's tiles by cost, largest first. Its four phases, each over the tile slots or the costs:
//   1. every entry idle, every cost counter 0; and cu_seqlens checked (core/offsets_check.h);
//   2. counter[c] = the tiles of cost c (each slot's tile found by bisection over cu_seqlens);
//   3. counter[c] = the tiles that cost more than c: the first rank of cost c (a suffix sum);
//   4. each tile takes rank atomicAdd(counter[its cost], 1).
// No tile costs 0, so counter[0] ends as the number of tiles (phase 3's sum over every cost).
// A few microseconds (tiles and costs are counted in thousands); the attention kernels then find
// an item with one table load instead of a document search.
// The check is the call's first kernel's first phase (the C API runs the builder before anything
// else reads cu_seqlens): its copy of the offsets (OffsetsCheck) is what the later kernels read,
// and malformed offsets stop here, after phase 1: no tile, a copy of zeros, the record and the NaN.
#include <cuda_runtime.h>

#include <climits>

#include "cuda/block_scan.cuh"
#include "cuda/schedule/work_order.cuh"

namespace flamia::cuda {
namespace {

constexpr int kThreads = 1024;

// a[i] = the sum of a[j] for j > i, over a[0 .. n), by the whole block, in chunks of kThreads from
// the top (thread t of a chunk holds index top - 1 - t, so a scan in thread order is a descending
// one over the indices).
__device__ void exclusive_suffix_sum(int* a, int n) {
  __shared__ int warp_totals[kThreads / 32];
  __shared__ int chunk_total;
  const int t = int(threadIdx.x);
  const auto plus = [](int x, int y) { return x + y; };
  int carry = 0;  // the sum of the chunks above this one
  for (int top = n; top > 0; top -= kThreads) {
    const int i = top - 1 - t;
    const int x = i >= 0 ? a[i] : 0;
    const int inclusive = block_inclusive_scan<kThreads>(x, 0, plus, warp_totals) + carry;
    if (i >= 0) a[i] = inclusive - x;
    __syncthreads();  // every thread has read warp_totals; the last one now passes the total on
    if (t == kThreads - 1) chunk_total = inclusive;
    __syncthreads();
    carry = chunk_total;
  }
}

struct BuildArgs {
  const int32_t* cu_seqlens;
  int num_docs, total_tokens;
  bool causal;
  order::OrderedTile* table;
  int* counters;
  int64_t entries;
  int costs;
  OffsetsCheck check;
};

constexpr unsigned kNoBadEntry = UINT_MAX;  // entries are numbered below 2^31

// The record of the first bad entry into the caller's status word, unless it holds one already.
// The word may be mapped host memory, where atomics are not atomic for the host: one plain check
// and one 16-byte store (of calls that find violations at once on other streams, one record stays).
__device__ void record_violation(const BuildArgs& a, unsigned bad) {
  const int32_t value = a.cu_seqlens[bad], previous = bad > 0 ? a.cu_seqlens[bad - 1] : 0;
  const OffsetsRecord r = offsets_record(offsets_entry_error(bad, value, previous, a.num_docs, a.total_tokens), bad,
                                         value, previous, a.total_tokens);
  OffsetsRecord* const status = a.check.status;
  if (*reinterpret_cast<volatile const int32_t*>(&status->kind) != int32_t(OffsetsError::kOk)) return;
  *reinterpret_cast<int4*>(status) = make_int4(r.kind, r.index, r.value, r.bound);
  __threadfence_system();
}

// NaN into every element of the outputs the check names (the whole CTA; malformed offsets only).
__device__ void poison_outputs(const BuildArgs& a) {
  const OffsetsCheck& c = a.check;
  const int t = int(threadIdx.x);
  // Unrolled: each output's fields stay kernel parameters (a loop over references into the array
  // copied the parameters into a stack frame at every launch, valid offsets or not).
#pragma unroll
  for (int i = 0; i < kOffsetsCheckRows; ++i) {
    const NanRows& out = c.rows[i];
    if (out.data == nullptr) continue;
    // T * H * D < 2^31 (the C API's limit), so every count fits an int.
    const int chunks = out.dim / 8, items = a.total_tokens * out.heads * chunks;
    const uint4 nan = make_uint4(out.nan_pair, out.nan_pair, out.nan_pair, out.nan_pair);  // 8 NaNs
    for (int e = t; e < items; e += kThreads) {
      const int row = e / chunks, token = row / out.heads, head = row % out.heads;
      auto* const at = static_cast<uint16_t*>(out.data) + token * out.stride_token + head * out.stride_head;
      *reinterpret_cast<uint4*>(at + (e % chunks) * 8) = nan;
    }
  }
  if (c.lse != nullptr) {
    const int n = c.lse_heads * a.total_tokens;
    for (int e = t; e < n; e += kThreads) c.lse[e] = __int_as_float(0x7FC00000);
  }
}

__global__ void __launch_bounds__(kThreads) build_work_order_kernel(const BuildArgs a) {
  __shared__ unsigned first_bad;
  const int t = int(threadIdx.x);
  if (t == 0) first_bad = kNoBadEntry;
  __syncthreads();
  // Each thread's entries come in increasing order, so its first violation is its smallest.
  for (int64_t i = t; i <= a.num_docs; i += kThreads) {
    const int32_t previous = i > 0 ? a.cu_seqlens[i - 1] : 0;
    if (offsets_entry_error(i, a.cu_seqlens[i], previous, a.num_docs, a.total_tokens) != OffsetsError::kOk) {
      atomicMin(&first_bad, unsigned(i));
      break;
    }
  }
  for (int64_t e = t; e < a.entries; e += kThreads) a.table[e] = {-1, 0};
  for (int c = t; c < a.costs; c += kThreads) a.counters[c] = 0;
  __syncthreads();
  const unsigned bad = first_bad;  // the same in every thread, so the return below is uniform
  if (int32_t* const copy = a.check.checked_cu_seqlens)
    for (int64_t i = t; i <= a.num_docs; i += kThreads) copy[i] = bad == kNoBadEntry ? a.cu_seqlens[i] : 0;
  if (bad != kNoBadEntry) {
    if (t == 0 && a.check.status != nullptr) record_violation(a, bad);
    poison_outputs(a);
    return;  // counters[0] == 0: no tile
  }
  // f(tile, cost) for each tile of a document, one tile slot per thread at a time.
  auto each_tile = [&](auto f) {
    for (int64_t slot = t; slot < a.entries; slot += kThreads) {
      DocumentTile tile;
      if (document_tile(a.cu_seqlens, a.num_docs, a.total_tokens, order::kWorkTile, slot, tile))
        f(tile, order::tile_cost(tile.tile, tile.tiles, a.causal));
    }
  };
  each_tile([&](const DocumentTile&, int cost) { atomicAdd(a.counters + cost, 1); });
  __syncthreads();
  exclusive_suffix_sum(a.counters, a.costs);
  __syncthreads();
  each_tile([&](const DocumentTile& tile, int cost) {
    a.table[atomicAdd(a.counters + cost, 1)] = {tile.doc, tile.tile};
  });
}

}  // namespace

cudaError_t launch_build_work_order(const int32_t* cu_seqlens, int num_docs, int total_tokens, bool causal,
                                    order::OrderedTile* table, int* cost_counters, cudaStream_t stream,
                                    const OffsetsCheck& check) {
  if (num_docs < 1 || total_tokens < 0 || cu_seqlens == nullptr || table == nullptr || cost_counters == nullptr ||
      reinterpret_cast<uintptr_t>(check.status) % alignof(OffsetsRecord) != 0)
    return cudaErrorInvalidValue;
  for (const NanRows& out : check.rows)
    if (out.data != nullptr && (out.dim % 8 != 0 || reinterpret_cast<uintptr_t>(out.data) % 16 != 0 ||
                                out.stride_token % 8 != 0 || out.stride_head % 8 != 0))
      return cudaErrorInvalidValue;
  const BuildArgs args{cu_seqlens,
                       num_docs,
                       total_tokens,
                       causal,
                       table,
                       cost_counters,
                       order::table_entries(total_tokens, num_docs),
                       int(order::cost_counters(total_tokens)),
                       check};
  build_work_order_kernel<<<1, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flamia::cuda
