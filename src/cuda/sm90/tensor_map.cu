// Host side of TMA (tensor_map.h): the driver's tensor-map encoder and the two code layouts.
#include "cuda/sm90/tensor_map.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

namespace flamia::cuda::sm90 {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  // Resolved once per process (a function pointer into the driver, no state of ours).
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// The swizzle whose span is a whole row of the tile (64 or 128 bytes).
CUtensorMapSwizzle swizzle_for_row(int row_bytes) {
  return row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
}

cudaError_t make_tensor_map(CUtensorMap& map, CUtensorMapDataType type, const void* base, int rank,
                            const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                            CUtensorMapSwizzle swizzle) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(&map, type, cuuint32_t(rank), const_cast<void*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

cudaError_t make_byte_tensor_map(CUtensorMap& map, const void* base, int rank, const cuuint64_t* dims,
                                 const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
  return make_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, base, rank, dims, strides, box, swizzle);
}

cudaError_t fp16_rows_map(CUtensorMap& map, const void* base, int tokens, int heads, int dim, int64_t stride_token,
                          int64_t stride_head, int box_rows, int box_features) {
  constexpr int kBytes = 2;
  if (box_features * kBytes != 128 || stride_token % 8 != 0 || stride_head % 8 != 0) return cudaErrorInvalidValue;
  const cuuint64_t dims[3] = {cuuint64_t(dim), cuuint64_t(heads), cuuint64_t(tokens)};
  const cuuint64_t strides[2] = {cuuint64_t(stride_head) * kBytes, cuuint64_t(stride_token) * kBytes};
  const cuuint32_t box[3] = {cuuint32_t(box_features), 1, cuuint32_t(box_rows)};
  return make_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, base, 3, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

cudaError_t rows_form_map(CUtensorMap& map, const uint8_t* codes, int tokens, int heads, int dim, int box_rows) {
  if (dim != 64 && dim != 128) return cudaErrorInvalidValue;
  const cuuint64_t dims[3] = {cuuint64_t(dim), cuuint64_t(heads), cuuint64_t(tokens)};
  const cuuint64_t strides[2] = {cuuint64_t(dim), cuuint64_t(heads) * dim};
  const cuuint32_t box[3] = {cuuint32_t(dim), 1, cuuint32_t(box_rows)};
  return make_byte_tensor_map(map, codes, 3, dims, strides, box, swizzle_for_row(dim));
}

cudaError_t transposed_form_map(CUtensorMap& map, const uint8_t* codes_t, int64_t pitch, int heads, int dim,
                                int box_tokens) {
  if (box_tokens != 64 && box_tokens != 128) return cudaErrorInvalidValue;
  const cuuint64_t dims[2] = {cuuint64_t(pitch), cuuint64_t(heads) * dim};
  const cuuint64_t strides[1] = {cuuint64_t(pitch)};
  const cuuint32_t box[2] = {cuuint32_t(box_tokens), cuuint32_t(dim)};
  return make_byte_tensor_map(map, codes_t, 2, dims, strides, box, swizzle_for_row(box_tokens));
}

namespace {
// encode(map, codes) for a code tensor and, where it has interior codes of their own, for those;
// else the interior map is a copy.
template <class Encode>
cudaError_t maps_with_interior(CUtensorMap& map, CUtensorMap& interior_map, const uint8_t* codes,
                               const uint8_t* interior_codes, Encode encode) {
  if (const cudaError_t e = encode(map, codes); e != cudaSuccess) return e;
  if (interior_codes == codes) {
    interior_map = map;
    return cudaSuccess;
  }
  return encode(interior_map, interior_codes);
}
}  // namespace

cudaError_t rows_form_maps(CUtensorMap& map, CUtensorMap& interior_map, const uint8_t* codes,
                           const uint8_t* interior_codes, int tokens, int heads, int dim, int box_rows) {
  return maps_with_interior(map, interior_map, codes, interior_codes, [&](CUtensorMap& m, const uint8_t* c) {
    return rows_form_map(m, c, tokens, heads, dim, box_rows);
  });
}

cudaError_t transposed_form_maps(CUtensorMap& map, CUtensorMap& interior_map, const uint8_t* codes_t,
                                 const uint8_t* interior_codes_t, int64_t pitch, int heads, int dim, int box_tokens) {
  return maps_with_interior(map, interior_map, codes_t, interior_codes_t, [&](CUtensorMap& m, const uint8_t* c) {
    return transposed_form_map(m, c, pitch, heads, dim, box_tokens);
  });
}

}  // namespace flamia::cuda::sm90
