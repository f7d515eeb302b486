// Launching the Hopper attention kernels: one template instance per head dim, over a grid of
// document tile slots (core/document_slots.h) x heads, with more dynamic shared memory than the
// 48 KiB default (cudaFuncSetAttribute is legal during stream capture, so graphs still work).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "core/document_slots.h"

namespace flamia::cuda::sm90 {

// The grid: slots::slot_count(total_tokens, num_docs, tile_tokens) x heads.
template <class Args>
cudaError_t launch_over_tile_slots(void (*kernel)(Args), const Args& args, size_t smem_bytes, int threads,
                                   int total_tokens, int num_docs, int tile_tokens, int heads, cudaStream_t stream) {
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes));
      e != cudaSuccess)
    return e;
  const dim3 grid(unsigned(slots::slot_count(total_tokens, num_docs, tile_tokens)), unsigned(heads));
  kernel<<<grid, threads, smem_bytes, stream>>>(args);
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

}  // namespace flamia::cuda::sm90
