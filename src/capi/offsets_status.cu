// flamia_check_offsets_status: the caller's status word read back after the work on a stream (the
// one entry point that waits for the device), and cleared on request. The word is device memory or
// mapped pinned host memory: cudaMemcpyDefault copies either way under unified addressing.
#include <cuda_runtime.h>

#include "capi/cuda_call.h"
#include "capi/validate.h"
#include "flamia/flamia.h"

namespace flamia::capi {
namespace {

CallError check_offsets_status(flamia_offsets_status* status, int clear, cudaStream_t s) {
  if (status == nullptr) return {FLAMIA_ERROR_INVALID_ARGUMENT, "status is NULL"};
  if (reinterpret_cast<uintptr_t>(status) % alignof(OffsetsRecord) != 0)
    return {FLAMIA_ERROR_INVALID_ARGUMENT, "status must be 16-byte aligned"};
  if (clear != 0 && clear != 1) return {FLAMIA_ERROR_INVALID_ARGUMENT, "clear must be 0 or 1, got " + std::to_string(clear)};
  flamia_offsets_status record{};
  if (cudaError_t err = cudaMemcpyAsync(&record, status, sizeof record, cudaMemcpyDefault, s); err != cudaSuccess)
    return cuda_error("reading the status word (cudaMemcpyAsync)", err);
  if (cudaError_t err = cudaStreamSynchronize(s); err != cudaSuccess)
    return cuda_error("reading the status word (cudaStreamSynchronize)", err);
  const CallError found = offsets_status_error(record);
  if (clear && !found.ok()) {
    static const flamia_offsets_status kClear{};
    if (cudaError_t err = cudaMemcpyAsync(status, &kClear, sizeof kClear, cudaMemcpyDefault, s); err != cudaSuccess)
      return cuda_error("clearing the status word (cudaMemcpyAsync)", err);
    if (cudaError_t err = cudaStreamSynchronize(s); err != cudaSuccess)
      return cuda_error("clearing the status word (cudaStreamSynchronize)", err);
  }
  return found;
}

}  // namespace
}  // namespace flamia::capi

extern "C" flamia_status flamia_check_offsets_status(flamia_offsets_status* status, int clear, void* stream,
                                                     flamia_error* error) {
  return flamia::capi::guarded(
      error, [&] { return flamia::capi::check_offsets_status(status, clear, static_cast<cudaStream_t>(stream)); });
}
