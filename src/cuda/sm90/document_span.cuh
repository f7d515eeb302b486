// The token range of one document, read from cu_seqlens on the device and clamped into
// [0, total_tokens] (each end to at least its begin), so garbage offsets cannot make a kernel
// index out of bounds (they give meaningless results instead; the host copy is what the C API
// validates).
#pragma once

#include <cstdint>

namespace flamia::cuda::sm90 {

struct DocumentSpan {
  int begin, end, len;
};

__device__ __forceinline__ DocumentSpan document_span(const int32_t* cu_seqlens, int doc, int total_tokens) {
  const int begin = min(max(cu_seqlens[doc], 0), total_tokens);
  const int end = min(max(cu_seqlens[doc + 1], begin), total_tokens);
  return {begin, end, end - begin};
}

}  // namespace flamia::cuda::sm90
