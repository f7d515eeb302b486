// Launching the attention kernels: over a grid of document tile slots (core/schedule.h) x heads, or
// persistent (one CTA per SM taking work items, work_items.cuh), one template instance per head
// dim, with more dynamic shared memory than the 48 KiB default (cudaFuncSetAttribute and the device
// queries are legal during stream capture, so graphs still work).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "core/schedule.h"

namespace flamia::cuda {

// Lets `kernel` take smem_bytes of dynamic shared memory (above the 48 KiB default).
template <class Args>
cudaError_t allow_shared_memory(void (*kernel)(Args), size_t smem_bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes));
}

// The grid: slots::slot_count(total_tokens, num_docs, tile_tokens) x heads.
template <class Args>
cudaError_t launch_over_tile_slots(void (*kernel)(Args), const Args& args, size_t smem_bytes, int threads,
                                   int total_tokens, int num_docs, int tile_tokens, int heads, cudaStream_t stream) {
  if (const cudaError_t e = allow_shared_memory(kernel, smem_bytes); e != cudaSuccess) return e;
  const dim3 grid(unsigned(slots::slot_count(total_tokens, num_docs, tile_tokens)), unsigned(heads));
  kernel<<<grid, threads, smem_bytes, stream>>>(args);
  return cudaGetLastError();
}

// Persistent kernels: one CTA per SM (at most one per work item; the kernels need an SM each),
// taking work items 0 .. items - 1 in order from a counter in global memory: a CTA's first item is
// blockIdx.x, each next one gridDim.x + atomicAdd(counter, 1) (work_items.cuh), so
// a CTA that finishes early takes more, as the hardware hands out the CTAs of a grid of items, but
// each CTA pays its start-up once and loads its next item while it finishes the last. (A kernel
// written this way also runs as an ordinary grid of one CTA per item: its first claim ends it.)
// The counter is zeroed on the stream before the launch (graph capture records a memset node).
// `items` bounds the CTAs only: a kernel may stop sooner, at a count it reads on the device (the
// work order's tiles x heads, core/schedule.h).
template <class Args>
cudaError_t launch_persistent(void (*kernel)(Args), const Args& args, size_t smem_bytes, int threads, int64_t items,
                              int* counter, cudaStream_t stream) {
  if (const cudaError_t e = allow_shared_memory(kernel, smem_bytes); e != cudaSuccess) return e;
  int device = 0, sms = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
    return e;
  if (const cudaError_t e = cudaMemsetAsync(counter, 0, sizeof(int), stream); e != cudaSuccess) return e;
  const int64_t ctas = items < sms ? items : sms;
  kernel<<<dim3(unsigned(ctas > 0 ? ctas : 1)), threads, smem_bytes, stream>>>(args);
  return cudaGetLastError();
}

// launch(std::integral_constant<int, D>) for the head dims the kernels are built for (64, 128);
// cudaErrorInvalidValue for any other. Returns the cudaError_t as an int, as the launchers do.
template <class Launch>
int for_head_dim(int head_dim, Launch launch) {
  if (head_dim == 128) return int(launch(std::integral_constant<int, 128>{}));
  if (head_dim == 64) return int(launch(std::integral_constant<int, 64>{}));
  return int(cudaErrorInvalidValue);
}

}  // namespace flamia::cuda
