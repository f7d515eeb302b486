// Marks functions usable from both host (CPU emulation, tests) and device (CUDA kernels).
#pragma once

#if defined(__CUDACC__)
#define FLAMIA_HD __host__ __device__ __forceinline__
#else
#define FLAMIA_HD inline
#endif
