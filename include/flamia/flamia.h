/* flamia: microscaled (MXFP8), causally safe attention over packed documents — C API.
 *
 * Every attention call takes device pointers and a CUDA stream, allocates nothing, never
 * synchronizes the host, and so can be captured in a CUDA graph (flamia_check_offsets_status, which
 * reads a status word back, is the one function that waits for the device). Errors come back as a status code plus a message
 * naming the bad argument, written into a caller-owned flamia_error (no global state). What only
 * the device can see, malformed device cu_seqlens, is recorded in a caller-owned status word
 * (flamia_documents.status) and poisons the call's outputs with NaN: see "Offsets found malformed
 * on the device" below.
 *
 * Layout (like flash_attn_varlen_func): q [T, Hq, D], k and v [T, Hkv, D], o [T, Hq, D], BF16,
 * the feature axis contiguous; lse [Hq, T] FP32 (natural log); cu_seqlens int32 [num_docs + 1]
 * on the device. docs/DESIGN.md §2 and docs/NUMERICS.md define the numerics.
 */
#ifndef FLAMIA_FLAMIA_H_
#define FLAMIA_FLAMIA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The binary interface of this header: it changes whenever a struct's layout, an enum's values or a
 * function's signature below changes, so that a binding that mirrors the structs (the Python
 * package's ctypes layer checks it when it loads the library) refuses a library built from other
 * headers instead of handing it structs it would misread. */
#define FLAMIA_ABI_VERSION 3
/* FLAMIA_ABI_VERSION as the library was built. */
int flamia_abi_version(void);
/* The library's version, "major.minor.patch". */
const char* flamia_version(void);

typedef enum flamia_status {
  FLAMIA_SUCCESS = 0,
  FLAMIA_ERROR_INVALID_ARGUMENT = 1, /* shape, dtype, stride, alignment, cu_seqlens, options */
  FLAMIA_ERROR_NOT_SUPPORTED = 2,    /* valid, but not built (e.g. head dim 96, no sm_90a device) */
  FLAMIA_ERROR_WORKSPACE = 3,        /* workspace missing or smaller than the size query said */
  FLAMIA_ERROR_CUDA = 4              /* a CUDA launch failed; the message holds cudaGetErrorString */
} flamia_status;

typedef enum flamia_dtype { FLAMIA_DTYPE_BF16 = 0, FLAMIA_DTYPE_FP16 = 1, FLAMIA_DTYPE_FP32 = 2 } flamia_dtype;
typedef enum flamia_isolation { FLAMIA_ISOLATION_DOCUMENT = 0, FLAMIA_ISOLATION_PREFIX = 1 } flamia_isolation;
typedef enum flamia_scale_geometry { FLAMIA_SCALE_BLOCK32 = 0, FLAMIA_SCALE_TOKEN = 1 } flamia_scale_geometry;
typedef enum flamia_scale_rule { FLAMIA_SCALE_RULE_CEIL = 0, FLAMIA_SCALE_RULE_FLOOR = 1 } flamia_scale_rule;

/* A packed [tokens, heads, dim] tensor on the device. Strides are in elements; dim is contiguous. */
typedef struct flamia_tensor {
  void* data;
  flamia_dtype dtype;
  int64_t tokens, heads, dim;
  int64_t stride_token, stride_head;
} flamia_tensor;

/* ---- Offsets found malformed on the device --------------------------------------------------
 * cu_seqlens [num_docs + 1] describes T packed tokens when cu[0] == 0, every entry lies in [0, T],
 * no entry is smaller than the one before, and cu[num_docs] == T. Every call checks its device
 * cu_seqlens on the device, in a kernel it runs anyway (the work order builder, the call's first
 * kernel): no extra launch and no host synchronization, so calls stay capturable in CUDA graphs and
 * a graph replay checks the offsets it finds then. On a violation the call
 *   - computes nothing from the offsets: every later kernel of the call sees no document;
 *   - writes NaN into every element of its outputs (o and lse; dq, dk and dv);
 *   - records the first bad entry in docs->status, when it is not NULL and holds no record yet
 *     (error == FLAMIA_OFFSETS_OK): the first record stays until the caller clears it.
 * The call itself returns FLAMIA_SUCCESS (it cannot know without waiting for the device): read the
 * status word when the work is done, e.g. with flamia_check_offsets_status. To check before
 * launching instead, pass a host copy in docs->cu_seqlens_host (or call flamia_validate_cu_seqlens):
 * the same rule and the same message, as FLAMIA_ERROR_INVALID_ARGUMENT from the call at once. */
typedef enum flamia_offsets_error {
  FLAMIA_OFFSETS_OK = 0,
  FLAMIA_OFFSETS_FIRST_NOT_ZERO = 1, /* cu_seqlens[0] != 0 */
  FLAMIA_OFFSETS_OUT_OF_RANGE = 2,   /* an entry below 0 or above T */
  FLAMIA_OFFSETS_DECREASING = 3,     /* cu_seqlens[index] < cu_seqlens[index - 1] */
  FLAMIA_OFFSETS_LAST_NOT_TOTAL = 4  /* cu_seqlens[num_docs] != T (every entry in range: it ends early) */
} flamia_offsets_error;

/* The status word: the first bad entry of a malformed cu_seqlens and its values. 16 bytes, written
 * by the device with one 16-byte store. Owned by the caller (the library keeps no state): device
 * memory, or mapped pinned host memory (cudaHostAlloc; under unified addressing its host pointer),
 * which the host can then read without a CUDA call once the call's work is done. Zero it before
 * first use; one word may serve many calls and streams: the first violation recorded stays (the
 * device checks the word, then stores, without atomics, which mapped host memory does not offer:
 * of calls that find violations at the same moment on two streams, one record stays). */
typedef struct flamia_offsets_status {
  int32_t error; /* flamia_offsets_error; FLAMIA_OFFSETS_OK: nothing recorded */
  int32_t index; /* the first entry of cu_seqlens that breaks the rule */
  int32_t value; /* cu_seqlens[index] */
  int32_t bound; /* DECREASING: cu_seqlens[index - 1]; OUT_OF_RANGE and LAST_NOT_TOTAL: T; FIRST_NOT_ZERO: 0 */
} flamia_offsets_status;

/* Document boundaries. cu_seqlens lives on the device and is checked there (above); cu_seqlens_host,
 * when not NULL, is a host copy that the call validates before it launches anything, without
 * touching the device. */
typedef struct flamia_documents {
  const int32_t* cu_seqlens;
  const int32_t* cu_seqlens_host;
  int32_t num_docs;
  /* A bound on the document lengths, in [1, T]. The results never depend on it: it only picks the
   * launch shape of the fold reference's scan, and both shapes scan every document whole, so a
   * bound below the longest document still gives the same bytes. The device does not check it;
   * the host copy's check refuses a bound below the longest document (a sign that max_seqlen and
   * cu_seqlens come from different batches). */
  int32_t max_seqlen;
  flamia_offsets_status* status; /* where the device records malformed cu_seqlens (above); 16-byte
                                    aligned, or NULL: no record (the outputs are NaN all the same) */
} flamia_documents;

/* P's boost exponent (flamia_options.p_boost_log2): the default and the largest value; boosted P
 * (<= 2^boost) then never exceeds E4M3's 448. */
#define FLAMIA_P_BOOST_LOG2_DEFAULT 8
#define FLAMIA_P_BOOST_LOG2_MAX 8

typedef struct flamia_options {
  int causal;                            /* default 1 */
  float softmax_scale;                   /* > 0, or +0.0f (the default) for 1/sqrt(D); negative, -0.0f,
                                            NaN and infinities are INVALID_ARGUMENT */
  flamia_isolation isolation;            /* default DOCUMENT */
  flamia_scale_geometry scale_geometry;  /* default BLOCK32 */
  flamia_scale_rule scale_rule;          /* default CEIL */
  int p_boost_log2;                      /* default FLAMIA_P_BOOST_LOG2_DEFAULT, in [0, FLAMIA_P_BOOST_LOG2_MAX] */
  /* 0 (default): where they apply (documents of 8192 tokens or more on average, D = 128), dQ's sums
   * of the backward from saved codes (flamia_backward_saved) are FP16 partials of the dK dV pass,
   * reduced in whatever order they arrive (not bitwise repeatable); 1: a dQ pass of its own, each
   * row summed in a fixed order (bitwise repeatable). Prefix isolation, non-causal calls and
   * flamia_backward always run the deterministic backward. */
  int deterministic;
} flamia_options;

typedef struct flamia_error {
  char message[512];
} flamia_error;

void flamia_default_options(flamia_options* options);
const char* flamia_status_name(flamia_status status);

/* What a status word's record says (record in host memory; no CUDA call): FLAMIA_SUCCESS when it
 * holds none, else FLAMIA_ERROR_INVALID_ARGUMENT and a message naming the entry and its values in
 * error, the message the host check gives for the same offsets. */
flamia_status flamia_offsets_status_message(const flamia_offsets_status* record, flamia_error* error);

/* The host check of a host copy of cu_seqlens (num_docs + 1 entries) for T = total_tokens packed
 * tokens: the device's rule, then, when max_seqlen > 0, that max_seqlen is at least the longest
 * document (as docs->cu_seqlens_host's check). FLAMIA_SUCCESS, or FLAMIA_ERROR_INVALID_ARGUMENT with
 * the message; record (may be NULL) receives what the device would record (zeros when valid, and
 * for a max_seqlen below the longest document, which the device does not check). No CUDA call. */
flamia_status flamia_validate_cu_seqlens(const int32_t* cu_seqlens_host, int32_t num_docs, int64_t total_tokens,
                                         int32_t max_seqlen, flamia_offsets_status* record, flamia_error* error);

/* Reads a status word (device memory or mapped pinned host memory) after the work queued on stream:
 * copies it on stream and waits for the stream, so this call synchronizes the host (the one call of
 * this API that does). FLAMIA_SUCCESS when no violation is recorded; FLAMIA_ERROR_INVALID_ARGUMENT
 * and the record's message when one is; FLAMIA_ERROR_CUDA when a copy fails. clear != 0 also resets
 * a recorded word to zeros (on stream, waited for), so the next violation is recorded. Work on other
 * streams that may write the word must be done first (e.g. cudaDeviceSynchronize). */
flamia_status flamia_check_offsets_status(flamia_offsets_status* status, int clear, void* stream, flamia_error* error);

/* Bytes of device workspace flamia_forward needs (E4M3 codes and UE8M0 scales of q, k, v, and V's
 * running scale max). Depends only on the shapes, docs->num_docs and the options (data pointers,
 * strides and cu_seqlens are not read; options must be the call's: prefix isolation with block32
 * geometry encodes K and V twice, per token and block32, and needs more). The workspace passed to
 * flamia_forward must be 256-byte aligned, as cudaMalloc returns it. Every size query below takes
 * the same arguments. */
flamia_status flamia_forward_workspace_size(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                            const flamia_documents* docs, const flamia_options* options, size_t* bytes,
                                            flamia_error* error);

/* Quantizes q, k, v (document-local groups) and computes o and lse on `stream`. lse is FP32
 * [Hq, T], contiguous. Outputs must not share memory with each other or with an input (tensors
 * interleaved in one buffer without sharing an element are fine), and no descriptor's last element
 * ((tokens - 1) * stride_token + (heads - 1) * stride_head + dim) may wrap int64 or the address
 * space: INVALID_ARGUMENT otherwise. The same holds for every call below. */
flamia_status flamia_forward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                             const flamia_documents* docs, const flamia_options* options, flamia_tensor* o, float* lse,
                             void* workspace, size_t workspace_bytes, void* stream, flamia_error* error);

/* Bytes of device workspace flamia_backward needs (E4M3 codes and UE8M0 scales of q, k, v and dout,
 * dout's running scale max, and D_i in FP32). Depends only on the shapes, docs->num_docs and the
 * options, as above; 256-byte aligned as above. */
flamia_status flamia_backward_workspace_size(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                             const flamia_documents* docs, const flamia_options* options, size_t* bytes,
                                             flamia_error* error);

/* Gradients of the call flamia_forward(q, k, v, docs, options) -> (o, lse) for the incoming gradient
 * dout [T, Hq, D] BF16: dq [T, Hq, D], dk and dv [T, Hkv, D] (BF16, written, not accumulated into).
 * Pass the same q, k, v, docs and options as the forward and its o and lse. q, k and v are quantized
 * again (bitwise the forward's codes). Deterministic: every output element is summed by one thread
 * in a fixed order (no atomics), so equal inputs give bitwise equal gradients; in prefix isolation
 * dq of row i depends on nothing after i, whatever options->deterministic says (dQ from FP16
 * partials needs the saving forward's codes: flamia_backward_saved). */
flamia_status flamia_backward(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                              const flamia_tensor* o, const float* lse, const flamia_tensor* dout,
                              const flamia_documents* docs, const flamia_options* options, flamia_tensor* dq,
                              flamia_tensor* dk, flamia_tensor* dv, void* workspace, size_t workspace_bytes,
                              void* stream, flamia_error* error);

/* ---- Training calls: the backward reuses the forward's codes ----------------------------------
 * flamia_forward_train quantizes q, k and v into a caller-owned "saved codes" buffer (their E4M3
 * codes in both layouts the kernels read, and their UE8M0 scales) and computes o and lse exactly as
 * flamia_forward does; flamia_backward_saved then reads q, k and v's codes from that buffer instead
 * of quantizing them again (3 of the backward's 4 quantization passes), with bitwise the gradients
 * of flamia_backward. The buffer must stay untouched from the forward to the backward, and the
 * backward must be given the shapes, docs and options of that forward. It takes about 2 bytes per
 * element of q, k and v (2 more per element of k and v in prefix isolation with block32 geometry,
 * which encodes K and V twice): as much as BF16 copies of them, which a caller that keeps the codes need
 * not keep (flamia_backward_saved reads only q, k and v's shapes). All buffers 256-byte aligned. */
flamia_status flamia_saved_codes_size(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                      const flamia_documents* docs, const flamia_options* options, size_t* bytes,
                                      flamia_error* error);
/* The workspace flamia_forward_train needs besides the saved codes (V's running scale max). */
flamia_status flamia_forward_train_workspace_size(const flamia_tensor* q, const flamia_tensor* k,
                                                  const flamia_tensor* v, const flamia_documents* docs,
                                                  const flamia_options* options, size_t* bytes, flamia_error* error);
flamia_status flamia_forward_train(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                   const flamia_documents* docs, const flamia_options* options, flamia_tensor* o,
                                   float* lse, void* saved_codes, size_t saved_codes_bytes, void* workspace,
                                   size_t workspace_bytes, void* stream, flamia_error* error);
/* The workspace flamia_backward_saved needs (dout's codes and scales, its running scale max, D_i). */
flamia_status flamia_backward_saved_workspace_size(const flamia_tensor* q, const flamia_tensor* k,
                                                   const flamia_tensor* v, const flamia_documents* docs,
                                                   const flamia_options* options, size_t* bytes, flamia_error* error);
/* flamia_backward with q, k and v's codes from flamia_forward_train's saved codes: q, k and v give
 * their shapes only (their data pointers are not read and may be NULL). */
flamia_status flamia_backward_saved(const flamia_tensor* q, const flamia_tensor* k, const flamia_tensor* v,
                                    const flamia_tensor* o, const float* lse, const flamia_tensor* dout,
                                    const flamia_documents* docs, const flamia_options* options,
                                    const void* saved_codes, size_t saved_codes_bytes, flamia_tensor* dq,
                                    flamia_tensor* dk, flamia_tensor* dv, void* workspace, size_t workspace_bytes,
                                    void* stream, flamia_error* error);

#ifdef __cplusplus
}
#endif

#endif /* FLAMIA_FLAMIA_H_ */
