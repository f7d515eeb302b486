// CHECK(call) for the standalone CUDA benchmark tools (pipe_rates.cu): a
// failed CUDA runtime call prints itself and the error, and exits with status 1.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                             \
  do {                                                                          \
    const cudaError_t err_ = (call);                                            \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)
