// Host side of TMA: tensor maps (the descriptors a kernel's TMA loads read) for E4M3 code tensors.
// The driver's encoder is reached through the runtime (cudaGetDriverEntryPointByVersion), so
// nothing links libcuda directly. Encoding is pure host work: legal during stream capture, and
// the map travels to the kernel as a __grid_constant__ parameter.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flamia::cuda::sm90 {

// A rank-2 or rank-3 byte tensor: dims innermost first (dims[0] contiguous), byte strides of
// dims[1..rank) (multiples of 16), a box of `box` elements per load, written to shared memory with
// the given swizzle (the box's inner extent must not exceed the swizzle span). Elements outside
// the tensor load as zero. cudaErrorInvalidValue when the driver rejects the description.
cudaError_t make_byte_tensor_map(CUtensorMap& map, const void* base, int rank, const cuuint64_t* dims,
                                 const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle);

}  // namespace flamia::cuda::sm90
