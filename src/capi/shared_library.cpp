// The one source of libflamia_capi.so, the C API as a shared library (the Python package loads it
// with ctypes). The API itself lives in the static libraries: flamia_forward in flamia_cuda
// (src/capi/forward.cu), the size query and helpers in flamia (src/capi/validate.cpp). This table
// references every entry point, so the linker keeps each one even without --whole-archive; the
// version script of the target exports the flamia_* symbols and hides everything else.
//
// The core library's source glob (src/capi/*.cpp) also compiles this file; there
// FLAMIA_CAPI_SHARED_LIBRARY is not defined and the translation unit is empty.
#ifdef FLAMIA_CAPI_SHARED_LIBRARY

#include "flamia/flamia.h"

namespace {

struct EntryPoints {
  decltype(&flamia_default_options) default_options;
  decltype(&flamia_status_name) status_name;
  decltype(&flamia_forward_workspace_size) forward_workspace_size;
  decltype(&flamia_forward) forward;
  decltype(&flamia_backward_workspace_size) backward_workspace_size;
  decltype(&flamia_backward) backward;
  decltype(&flamia_saved_codes_size) saved_codes_size;
  decltype(&flamia_forward_train_workspace_size) forward_train_workspace_size;
  decltype(&flamia_forward_train) forward_train;
  decltype(&flamia_backward_saved_workspace_size) backward_saved_workspace_size;
  decltype(&flamia_backward_saved) backward_saved;
  decltype(&flamia_offsets_status_message) offsets_status_message;
  decltype(&flamia_validate_cu_seqlens) validate_cu_seqlens;
  decltype(&flamia_check_offsets_status) check_offsets_status;
};

[[maybe_unused]] __attribute__((used)) const EntryPoints kEntryPoints = {
    &flamia_default_options, &flamia_status_name, &flamia_forward_workspace_size, &flamia_forward,
    &flamia_backward_workspace_size, &flamia_backward, &flamia_saved_codes_size,
    &flamia_forward_train_workspace_size, &flamia_forward_train, &flamia_backward_saved_workspace_size,
    &flamia_backward_saved, &flamia_offsets_status_message, &flamia_validate_cu_seqlens,
    &flamia_check_offsets_status};

}  // namespace

#endif  // FLAMIA_CAPI_SHARED_LIBRARY
