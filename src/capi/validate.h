// Host-side half of the C API: argument validation, the workspace layout and the error plumbing.
// Pure C++ (no CUDA headers), part of the core library, so the CPU tests exercise every rule;
// src/capi/forward.cu calls the same functions before it launches anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "core/options.h"
#include "flamia/flamia.h"

namespace flamia::capi {

// Success, or the first problem found: a status and a message that names the bad argument.
struct CallError {
  flamia_status status = FLAMIA_SUCCESS;
  std::string message;

  bool ok() const { return status == FLAMIA_SUCCESS; }
  static CallError success() { return {}; }
};

// Limits of the kernels this library builds (FLAMIA_ERROR_NOT_SUPPORTED beyond them).
inline constexpr int64_t kMaxElements = 2147483647;  // T * H * D of every tensor: int32 indexing
inline constexpr int64_t kMaxHeads = 65535;          // heads ride on a grid dimension
inline constexpr bool head_dim_supported(int64_t d) { return d == 64 || d == 128; }

// Input rows must be 16-byte aligned: data pointers 16-byte aligned, strides multiples of 8 BF16.
inline constexpr size_t kDataAlignment = 16;
inline constexpr int64_t kStrideMultiple = 8;

// Shape checks shared by the size query and the call: q, k, v non-null, BF16, T >= 1, equal
// tokens and dim, k and v the same heads, Hq a multiple of Hkv; then the NOT_SUPPORTED limits
// (head_dim 64 or 128, heads <= 65535, T * H * D <= 2^31 - 1). Data pointers, strides and
// alignment are not looked at (the size query only needs the shapes).
CallError validate_shapes(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v);

// Where a call finds (or puts) q, k and v's codes: in its own workspace, or in a caller's saved
// codes buffer (the training pair flamia_forward_train / flamia_backward_saved), which then holds
// them for the backward and the workspace has no code regions.
enum class QkvCodes { kInWorkspace, kSaved };

// Everything flamia_forward checks before it touches the device (never dereferences a device
// pointer; reads docs->cu_seqlens_host when it is not NULL). INVALID_ARGUMENT problems are
// reported before NOT_SUPPORTED ones, so NOT_SUPPORTED means "valid, but not built".
CallError validate_forward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                           const flamia_documents* docs, const flamia_options* options, const flamia_tensor* o,
                           const float* lse);

// Everything flamia_backward checks before it touches the device: the forward's rules for q, k,
// v, o (an input here), lse, docs and options, and dout and dq shaped like q, dk and dv like k.
// With QkvCodes::kSaved (flamia_backward_saved) only the shapes of q, k and v are read: their
// data pointers and strides are not checked (they may be NULL).
CallError validate_backward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                            const flamia_tensor* o, const float* lse, const flamia_tensor* dout,
                            const flamia_documents* docs, const flamia_options* options, const flamia_tensor* dq,
                            const flamia_tensor* dk, const flamia_tensor* dv, QkvCodes codes = QkvCodes::kInWorkspace);

// A status word's record (flamia_offsets_status) as a call's error: success when it holds none,
// else INVALID_ARGUMENT with the message the host check gives for the same offsets.
CallError offsets_status_error(const flamia_offsets_status& record);

// The C options as the core type (valid options only: check them first). The emulation-only
// numerics (route, u_scale, hadamard) keep their defaults: the C API cannot select them.
AttentionOptions attention_options(const flamia_options& options);

// What a backward call runs, decided once from its validated arguments before anything is launched.
// dQ comes from FP16 partials of the dK dV pass (core/dq_partials.h) where the saving forward kept
// 1 / l_i (saved codes), the options allow it (NumericsOptions::uses_fp16_partials: not
// deterministic, document isolation, causal), the kernels have the instance
// (cuda/sm90/backward.h's dq_partials_supported: D = 128, long documents) and dq's rows can be TMA's
// FP16 reduce target (8-element strides, a 16-byte aligned base); else the deterministic dQ pass
// runs. The workspace poison, the kernels' parameters and the pass list all read this plan.
struct BackwardPlan {
  QkvCodes codes;
  NumericsOptions numerics;
  bool dq_partials;
};
BackwardPlan plan_backward(const flamia_tensor& q, const flamia_tensor& dq, const flamia_documents& docs,
                           const flamia_options& options, QkvCodes codes);

// The forward's device workspace: one 256-byte aligned region per buffer, offsets from the
// (256-byte aligned) workspace base. The size query and the call both use this one function.
inline constexpr size_t kWorkspaceAlignment = 256;

struct WorkspaceRegion {
  size_t offset = 0, bytes = 0;  // bytes 0: the layout has no such buffer
};

// Codes come in two layouts, each operand in the one(s) its kernels read: rows [T, H, D] (x_codes)
// and transposed [H, D, layout::transposed_tokens(T, num_docs)] (x_codes_t, core/operand_layout.h).
// With interior codes (NumericsOptions::interior_codes(): prefix isolation, block32) K and V have
// a second, block32 encoding, read on interior pairs (core/tiling.h), in the same layouts as the
// first: the regions named k_interior_* and v_interior_* (none otherwise).
struct ForwardWorkspace {
  WorkspaceRegion q_codes;     // E4M3 [T, Hq, D]
  WorkspaceRegion k_codes;     // E4M3 [T, Hkv, D]
  WorkspaceRegion q_codes_t, k_codes_t, v_codes;  // none: the forward reads V transposed only
  WorkspaceRegion v_codes_t;   // E4M3 transposed, Hkv heads
  WorkspaceRegion q_scales;    // UE8M0 [T, Hq]
  WorkspaceRegion k_scales;    // UE8M0 [T, Hkv]
  WorkspaceRegion v_scales;    // UE8M0 [T, Hkv]
  WorkspaceRegion k_interior_codes, k_interior_codes_t, v_interior_codes;  // none (K rows, V^T only)
  WorkspaceRegion v_interior_codes_t, k_interior_scales, v_interior_scales;
  WorkspaceRegion v_fold_ref;  // UE8M0 [T, Hkv]: running max of V's scales within the document
  WorkspaceRegion work_counter;  // int32: the persistent forward kernel's item counter
  WorkspaceRegion work_order;    // order::OrderedTile [order::table_entries(T, num_docs)] (core/schedule.h)
  WorkspaceRegion work_order_counters;  // int32 [order::cost_counters(T)]: the work order builder's scratch
  // int32 [num_docs + 1]: cu_seqlens as the work order builder checked it (the caller's offsets, or
  // all zeros when they are malformed: no document), which every later kernel of the call reads.
  WorkspaceRegion checked_cu_seqlens;
  size_t total = 0;            // a multiple of kWorkspaceAlignment
};

// Whether a layout (ForwardWorkspace, BackwardWorkspace, SavedCodes) holds interior codes.
template <class Layout>
bool has_interior_codes(const Layout& l) {
  return l.k_interior_scales.bytes != 0;
}
// The kernels address K's and V's interior scales with one shift from their other scales: every
// layout with interior codes takes k_scales, v_scales and k_interior_scales, v_interior_scales as
// two pairs of adjacent regions of one size. The shift in bytes (0 without interior codes).
template <class Layout>
int64_t interior_scales_shift(const Layout& l) {
  if (!has_interior_codes(l)) return 0;
  return int64_t(l.k_interior_scales.offset) - int64_t(l.k_scales.offset);
}

// Precondition (every layout): the shapes passed validate_shapes and num_docs >= 1 (so no size
// can overflow).
ForwardWorkspace forward_workspace_layout(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                          int64_t num_docs, bool interior_codes,
                                          QkvCodes codes = QkvCodes::kInWorkspace);

// The saved codes of flamia_forward_train: q, k and v in both layouts (the forward reads Q and K
// rows and V transposed, the backward Q, K, V rows and Q, K transposed) and their scales.
struct SavedCodes {
  WorkspaceRegion q_codes, k_codes, v_codes;        // E4M3 [T, H, D]
  WorkspaceRegion q_codes_t, k_codes_t, v_codes_t;  // E4M3 transposed
  WorkspaceRegion q_scales, k_scales, v_scales;     // UE8M0 [T, H]
  WorkspaceRegion k_interior_codes, k_interior_codes_t, v_interior_codes;  // with interior codes: both
  WorkspaceRegion v_interior_codes_t, k_interior_scales, v_interior_scales;  // layouts of K and V again
  WorkspaceRegion row_max_prob;  // FP32 [Hq, T]: the forward's 1 / l_i (the FP16-partials backward's bound)
  size_t total = 0;                                 // a multiple of kWorkspaceAlignment
};
SavedCodes saved_codes_layout(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t num_docs,
                              bool interior_codes);

// The backward's device workspace: Q, K, V and dO quantized again (bitwise the forward's codes),
// dO's running scale max (for the dV fold reference) and D_i.
struct BackwardWorkspace {
  WorkspaceRegion q_codes, k_codes, v_codes, g_codes;      // E4M3 [T, H, D] (g: dO)
  WorkspaceRegion q_codes_t, k_codes_t, g_codes_t;         // E4M3 transposed (dK's, dQ's, dV's B operands)
  WorkspaceRegion v_codes_t;                               // none
  WorkspaceRegion q_scales, k_scales, v_scales, g_scales;  // UE8M0 [T, H]
  WorkspaceRegion k_interior_codes, k_interior_codes_t, v_interior_codes;  // with interior codes
  WorkspaceRegion v_interior_codes_t, k_interior_scales, v_interior_scales;  // (v_interior_codes_t: none)
  WorkspaceRegion g_scale_prefix_max;                      // UE8M0 [T, Hq]
  WorkspaceRegion delta;                                   // FP32 [Hq, T]: D_i
  // FP16 dQ partials (core/dq_partials.h): K's and V's running scale max, each row's sigma and beta.
  WorkspaceRegion k_scale_prefix_max, v_scale_prefix_max;  // UE8M0 [T, Hkv]
  WorkspaceRegion dq_sigma, dq_beta;                       // UE8M0, int8 [Hq, T]
  WorkspaceRegion work_counter;                            // int32: the persistent kernels' item counter
  WorkspaceRegion work_order;                              // as the forward's: the items' order,
  WorkspaceRegion work_order_counters;                     // its builder's scratch,
  WorkspaceRegion checked_cu_seqlens;                      // and the checked cu_seqlens
  size_t total = 0;                                        // a multiple of kWorkspaceAlignment
};

BackwardWorkspace backward_workspace_layout(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                            int64_t num_docs, bool interior_codes,
                                            QkvCodes codes = QkvCodes::kInWorkspace);

// FLAMIA_ERROR_WORKSPACE when the workspace is NULL, smaller than layout.total, or not 256-byte
// aligned; size_query names the function that gives the size.
CallError check_workspace(const ForwardWorkspace& layout, const void* workspace, size_t workspace_bytes,
                          const char* size_query = "flamia_forward_workspace_size");
CallError check_workspace(const BackwardWorkspace& layout, const void* workspace, size_t workspace_bytes,
                          const char* size_query = "flamia_backward_workspace_size");
// The same rules for the saved codes buffer (named saved_codes in the messages).
CallError check_saved_codes(const SavedCodes& layout, const void* saved_codes, size_t saved_codes_bytes);
// An entry point's caller-owned buffers: the workspace (size_query names its size function) and,
// when codes is kSaved, the saved codes buffer.
template <class Workspace>
CallError check_caller_buffers(const Workspace& layout, const char* size_query, const void* workspace,
                               size_t workspace_bytes, QkvCodes codes, const SavedCodes& saved_layout,
                               const void* saved_codes, size_t saved_codes_bytes) {
  if (CallError e = check_workspace(layout, workspace, workspace_bytes, size_query); !e.ok()) return e;
  if (codes == QkvCodes::kSaved) return check_saved_codes(saved_layout, saved_codes, saved_codes_bytes);
  return CallError::success();
}

// Writes the message into *error (truncated to fit, always NUL-terminated; "" on success) when
// error is not NULL, and returns the status.
flamia_status report(const CallError& result, flamia_error* error);

// The body of every extern "C" entry point: runs body() (returning a CallError) and reports it;
// no exception crosses the C boundary (one becomes an "internal error").
template <class Body>
flamia_status guarded(flamia_error* error, Body&& body) {
  try {
    return report(body(), error);
  } catch (const std::exception& e) {
    return report({FLAMIA_ERROR_INVALID_ARGUMENT, std::string("internal error: ") + e.what()}, error);
  } catch (...) {
    return report({FLAMIA_ERROR_INVALID_ARGUMENT, "internal error"}, error);
  }
}

}  // namespace flamia::capi
