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

// The two layouts of E4M3 codes (core/operand_layout.h), as tiles for wgmma.cuh's swizzled
// layouts (a row of 64 or 128 bytes, swizzled over its length):
//  - rows form, codes [tokens, heads, dim]: a box of box_rows tokens x the dim features of one
//    head, loaded at coordinates {0, head, token};
//  - transposed form, codes [heads * dim, pitch]: a box of the dim feature rows of one head x
//    box_tokens token slots, loaded at coordinates {slot, head * dim}.
cudaError_t rows_form_map(CUtensorMap& map, const uint8_t* codes, int tokens, int heads, int dim, int box_rows);
// An FP16 [tokens, heads, dim] tensor with element strides stride_token, stride_head (multiples of
// 8: 16-byte rows), in boxes of box_rows tokens x box_features features (128-byte rows, 128-byte
// swizzle) of one head at coordinates {feature, head, token}: the FP16 dQ accumulator that TMA
// reduce-adds into.
cudaError_t fp16_rows_map(CUtensorMap& map, const void* base, int tokens, int heads, int dim, int64_t stride_token,
                          int64_t stride_head, int box_rows, int box_features);
cudaError_t transposed_form_map(CUtensorMap& map, const uint8_t* codes_t, int64_t pitch, int heads, int dim,
                                int box_tokens);

// The same for a K or V code tensor and its interior codes (prefix isolation's block32 encoding,
// which interior tiles read: KernelProblem::interior_codes), into map and interior_map. Without
// interior codes the kernels' interior fields point at the codes themselves (kernel_problem.h):
// interior_map is then a copy of map, not encoded again.
cudaError_t rows_form_maps(CUtensorMap& map, CUtensorMap& interior_map, const uint8_t* codes,
                           const uint8_t* interior_codes, int tokens, int heads, int dim, int box_rows);
cudaError_t transposed_form_maps(CUtensorMap& map, CUtensorMap& interior_map, const uint8_t* codes_t,
                                 const uint8_t* interior_codes_t, int64_t pitch, int heads, int dim, int box_tokens);

}  // namespace flamia::cuda::sm90
