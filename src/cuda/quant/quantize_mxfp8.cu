// MXFP8 quantization kernels; see quantize_mxfp8.cuh for the contract.
//
// Bit-exactness with reference::quantize_mxfp8 rests on three facts:
//   1. amax. For finite BF16 values the bit pattern of |x| (sign cleared) orders exactly like
//      the value, and every non-finite pattern (0x7F80 Inf, above it NaN) is larger than every
//      finite one. So the integer max of the masked patterns is the bit pattern of the CPU's
//      max |x|, or a non-finite pattern whenever the group holds a NaN or Inf, which the CPU's
//      nan_max_abs turns into NaN. The max is associative, so the parallel reduction order does
//      not matter.
//   2. The scale. The group's max pattern is turned into its scale code from its bits alone
//      (detail::scale_for_bf16_amax: the shared FLAMIA_HD codec formats::scale_for_float_amax
//      of the float the pattern widens to), no float arithmetic, so it does not depend on FTZ
//      or fast-math flags; it equals the CPU's formats::scale_for_amax of the same value for every
//      BF16 pattern (checked exhaustively on the host; the CPU holds the same values, since the
//      inputs are exactly BF16).
//   3. The codes come from detail::encode_scaled_e4m3x4 (its two halves: inverse_scale and
//      code_mask once per row and scale group, encode_e4m3x4 per four values): one float multiply
//      by 2^-e per value and the hardware E4M3 conversion per pair. It equals the shared codec
//      formats::encode_scaled_e4m3 on its whole domain (every finite BF16 value under every
//      scale: Gpu.E4m3ConversionMatchesTheSharedCodecExhaustively); the double codec made
//      this kernel compute-bound (607 us per 16x4096 operand on the H200).
#include "cuda/quant/quantize_mxfp8.cuh"

#include <cmath>
#include <type_traits>

#include "core/documents.h"
#include "core/operand_layout.h"
#include "core/schedule.h"
#include "core/tiling.h"
#include "cuda/block_scan.cuh"
#include "cuda/gradient_row_dot.cuh"
#include "cuda/schedule/document_span.cuh"
#include "formats/minifloat.h"
#include "formats/scales.h"

namespace flamia::cuda {
namespace {

constexpr int kTileTokens = tiling::kScaleBlock;  // document positions per CTA step: one block32 group
constexpr int kThreads = 256;
constexpr int kChunk = 8;  // BF16 features per 16-byte load
constexpr int kMaxDim = 256;
constexpr int kMaxItemsPerThread = kTileTokens * (kMaxDim / kChunk) / kThreads;  // (row, chunk) items
constexpr int kItemsUpTo128 = kTileTokens * (128 / kChunk) / kThreads;              // ... when D <= 128
constexpr int kMaxGridY = 65535;
constexpr int kHeadsPerCta = 4;  // heads per CTA: the document bisection, once per slot, serves them
// CTAs per SM the registers must allow for head dims up to 128: 4 holds the kernel to 64 registers,
// as this ptxas chooses unbounded (62). Explicitly one CTA lets it take 94 (two CTAs per SM, half
// the loads in flight): a forward's three tensors 0.44 -> 0.61 ms at 4x16384 and 0.50 -> 0.71 ms
// tiny-unaligned on the H200, 3 CTAs (78 registers) 0.48 / 0.56 ms, 5 spill. Larger
// head dims hold twice the chunks (about 124 registers, two CTAs per SM): one. The instances that also
// write the interior codes (prefix isolation's second encoding) need more: at 4 CTAs they spilled (24-
// and 32-byte stack frames); at 3 (80 registers, none spilled) prefix's training-call quantize took
// 0.768 -> 0.726 ms on tiny-unaligned and 0.836 -> 0.786 at 16x4096 (the same codes).
constexpr int min_ctas_per_sm(int items, bool second_encoding) {
  return items > kItemsUpTo128 ? 1 : second_encoding ? 3 : 4;
}
static_assert(kTileTokens == 32, "one warp-sized tile of positions per CTA step");
static_assert(kTileTokens == layout::kKeyStep, "a CTA step writes whole steps of the transposed layout");
// The step's codes, kept for the transposed store: rows = positions. An odd pitch in words (65)
// puts the two rows that a lane pair reads at once in phase 4 (positions j and j + 16 of a half)
// 16 banks apart, so each of that phase's word loads hits 32 distinct banks.
constexpr int kTilePitch = kMaxDim + 4;
static_assert(kTilePitch % 4 == 0 && (kTilePitch / 4) % 2 == 1, "word-aligned rows, an odd number of words apart");
// Bytes after each head's rows: 4 words. A warp's phase-4 load covers 4 heads (lane pairs take
// them in turn), which the padding puts 4 banks apart.
constexpr int kHeadPad = 16;
static_assert((kTileTokens * kTilePitch + kHeadPad) / 4 % 32 == 4 && kHeadPad % 16 == 0, "heads 4 banks apart");
// Phase 4's units: (head, 4 features, half step) per thread, as many as a kItems kernel's dims need.
__host__ __device__ constexpr int units_per_thread(int items) {
  return kHeadsPerCta * (items * kThreads / kTileTokens * kChunk) / 2 / kThreads;  // at the largest dim it takes
}
static_assert(kTileTokens * (kMaxDim / kChunk) % kThreads == 0, "items divide evenly over the CTA");

// A row's scale as detail::encode_e4m3x4 takes it (one 8-byte shared load per chunk).
struct __align__(8) RowCodec {
  float inverse_scale;  // detail::inverse_scale
  uint32_t mask;        // detail::code_mask
};


// Max of |x| over 8 BF16 values, as a sign-cleared bit pattern (see fact 1 above).
__device__ __forceinline__ uint32_t max_abs_bits(const uint4& v) {
  constexpr uint32_t kAbs = 0x7FFF7FFFu;
  const uint32_t m = __vmaxu2(__vmaxu2(v.x & kAbs, v.y & kAbs), __vmaxu2(v.z & kAbs, v.w & kAbs));
  return max(m & 0xFFFFu, m >> 16);
}

// A 16-byte copy from global to shared memory that completes in the background (the issuing thread
// waits for its copies with wait_own_copies), so that the row of O behind kDelta's products is in
// flight with the step's loads without holding registers.
__device__ __forceinline__ void copy_async_16(void* shared_dst, const void* global_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(uint32_t(__cvta_generic_to_shared(shared_dst))),
               "l"(global_src)
               : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void wait_own_copies() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// kDelta's dynamic shared memory: each thread's chunks of O, (head, item) at [(hh * kItems + k) *
// kThreads + thread] (a warp's 16-byte reads are consecutive).
template <int kItems>
constexpr size_t kDeltaStageBytes = size_t(kHeadsPerCta) * kItems * kThreads * sizeof(uint4);

// threadIdx.x, read where it is called: the compiler cannot hoist what derives from it out of a loop.
__device__ __forceinline__ int thread_index_here() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

// Transposes a 4x4 block of bytes held as four words: byte b of word r moves to byte r of word b.
__device__ __forceinline__ void transpose_bytes_4x4(uint32_t (&w)[4]) {
  const uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), hi01 = __byte_perm(w[0], w[1], 0x7362);
  const uint32_t lo23 = __byte_perm(w[2], w[3], 0x5140), hi23 = __byte_perm(w[2], w[3], 0x7362);
  w[0] = __byte_perm(lo01, lo23, 0x5410);
  w[1] = __byte_perm(lo01, lo23, 0x7632);
  w[2] = __byte_perm(hi01, hi23, 0x5410);
  w[3] = __byte_perm(hi01, hi23, 0x7632);
}

template <bool kVecLoad>
__device__ __forceinline__ uint4 load_chunk(const __nv_bfloat16* src) {
  if constexpr (kVecLoad) {
    return __ldg(reinterpret_cast<const uint4*>(src));
  } else {
    const unsigned short* p = reinterpret_cast<const unsigned short*>(src);
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = uint32_t(__ldg(p + 2 * j)) | (uint32_t(__ldg(p + 2 * j + 1)) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Grid (document tile slots of 32 positions, head groups of kHeadsPerCta; core/schedule.h).
// Each CTA step owns positions [p0, p0 + 32) of one document for its heads: per head one block32
// group, or 32 token groups. Its kThreads threads split the tile's rows x (dim / 8) chunks, kItems
// per thread and head. The step runs in phases over all its heads at once, so every head's loads
// are in flight together (the pass is bound by DRAM latency otherwise) and a step takes three
// barriers, not three per head:
//   1. load every head's chunks into registers (x is read once) and take the groups' amax;
//   2. one thread per (head, row) turns its amax into the scale;
//   3. encode, store row-form codes, and keep the codes in shared memory when the transposed layout
//      is wanted; 4. (transposed) each (head, feature, 16-slot half) is one 16-byte store.
// kSecond: phases 2 to 4 run twice per step, the second time into `second`'s buffers with block32
// scales taken from the per-token amax of phase 1 (the first encoding is per token), on the steps
// before each document's last second.skip_tiles tiles; the input is read once.
// kDelta (dim 64 or 128, both layouts written): phase 1 also copies the items' chunks of O into
// shared memory, and 5. forms each row's D_i from them and the codes staged in phase 3 (row_delta).
// A row's items lie on dim / 8 consecutive lanes in chunk order (item i is row i / chunks, chunk
// i % chunks), which is gradient_row_dot's lane order.
template <bool kVecLoad, int kItems, bool kSecond, bool kDelta>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm(kItems, kSecond || kDelta))
    quantize_mxfp8_kernel(const __nv_bfloat16* __restrict__ x, int64_t token_stride, int64_t head_stride,
                          int total_tokens, int heads, int dim, const int32_t* __restrict__ cu_seqlens, int num_docs,
                          ScaleGeometry geometry, ScaleRule rule, bool vec_store, uint8_t* __restrict__ codes,
                          uint8_t* __restrict__ transposed_codes, uint8_t* __restrict__ scales,
                          BlockCodes second, RowDelta row_delta) {
  static_assert(!(kSecond && kDelta), "D_i is formed for dO, which has one encoding");
  static_assert(!kDelta || kItems * kThreads == kTileTokens * 128 / kChunk, "D_i's instances take dim <= 128");
  // Per (head of the CTA, row): sign-cleared BF16 amax patterns (block32 uses row 0) and scales.
  __shared__ uint32_t row_amax[kHeadsPerCta][kTileTokens];
  __shared__ RowCodec row_codec[kHeadsPerCta][kTileTokens];  // each row's scale, as the encoder takes it
  __shared__ __align__(16) uint8_t tile_codes[kHeadsPerCta][kTileTokens * kTilePitch + kHeadPad];
  __shared__ uint8_t row_scale[kHeadsPerCta][kTileTokens];  // kDelta: each row's scale code
  extern __shared__ uint4 o_stage[];                          // kDelta: kDeltaStageBytes<kItems>
  const int64_t transposed_pitch = layout::transposed_tokens(total_tokens, num_docs);
  // This CTA's heads: one document lookup serves them all.
  const int h_first = int(blockIdx.y) * kHeadsPerCta, cta_heads = min(heads - h_first, kHeadsPerCta);
  const int chunks = dim / kChunk;
  const int items = kTileTokens * chunks;
  const bool per_token = geometry == ScaleGeometry::kToken;
  // The thread's (row, chunk) items, the same at every step: item k is i = threadIdx.x + k kThreads
  // when i < items. (Computed once: per step they cost a division by the runtime chunk count.)
  int item_row[kItems], item_chunk[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int i = int(threadIdx.x) + k * kThreads;
    item_row[k] = i / chunks;
    item_chunk[k] = i - item_row[k] * chunks;
  }
  auto has_item = [&](int k) { return int(threadIdx.x) + k * kThreads < items; };

  // The loop and the idle-slot skip are uniform over the CTA, so the barriers inside are safe.
  const int64_t slot_count = slots::slot_count(total_tokens, num_docs, kTileTokens);
  for (int64_t slot = blockIdx.x; slot < slot_count; slot += gridDim.x) {
    // Each warp finds the slot's document with a 32-way search: ceil(log32(num_docs)) dependent
    // loads where a binary search took log2(num_docs), ahead of every load of the step.
    DocumentTile work;
    if (!document_tile_warp(cu_seqlens, num_docs, total_tokens, kTileTokens, slot, work)) {
      // An idle slot: its step of the transposed layout holds no token. Zero it, so that the whole
      // layout is defined (the attention kernels' tile loads run past a document's end).
      if (transposed_codes) {
        for (int i = int(threadIdx.x); i < 2 * dim * cta_heads; i += kThreads) {
          const int row = h_first * dim + i / 2, half = i % 2;  // row = head * dim + feature
          *reinterpret_cast<uint4*>(transposed_codes + int64_t(row) * transposed_pitch + slot * kTileTokens +
                                    16 * half) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
      continue;
    }
    const DocumentSpan d = work.span;
    const int p0 = work.tile * kTileTokens;
    // A block32 group is [p0, scale_group_end(p0)); a token tile is the same 32 positions.
    const int rows = scale_group_end(p0, ScaleGeometry::kBlock32, d.len) - p0;
    const int t0 = d.begin + p0;

    // 1. Loads and amax. The loads are issued first, so that zeroing row_amax and its barrier
    // overlap them. (row_amax was last read before the previous step's phase-2 barrier.) Each
    // item's element offset is taken once per step; the heads add a constant to it.
    int64_t item_src[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k)
      item_src[k] = int64_t(t0 + item_row[k]) * token_stride + int64_t(h_first) * head_stride + item_chunk[k] * kChunk;
    uint4 v[kHeadsPerCta][kItems];
#pragma unroll
    for (int hh = 0; hh < kHeadsPerCta; ++hh)
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        v[hh][k] = make_uint4(0u, 0u, 0u, 0u);
        if (hh < cta_heads && has_item(k) && item_row[k] < rows)
          v[hh][k] = load_chunk<kVecLoad>(x + item_src[k] + hh * head_stride);
      }
    if constexpr (kDelta) {  // the items' chunks of O (this thread read its o_stage last in phase 5)
#pragma unroll
      for (int hh = 0; hh < kHeadsPerCta; ++hh)
#pragma unroll
        for (int k = 0; k < kItems; ++k)
          if (hh < cta_heads && has_item(k) && item_row[k] < rows)
            copy_async_16(o_stage + (hh * kItems + k) * kThreads + threadIdx.x,
                          row_delta.o + int64_t(t0 + item_row[k]) * row_delta.o_stride_token +
                              int64_t(h_first + hh) * row_delta.o_stride_head + item_chunk[k] * kChunk);
      commit_copies();
    }
    for (int i = int(threadIdx.x); i < kHeadsPerCta * kTileTokens; i += kThreads) (&row_amax[0][0])[i] = 0u;
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < kHeadsPerCta; ++hh) {
      uint32_t local = 0;  // padding chunks are zero: they never raise a max
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const uint32_t m = max_abs_bits(v[hh][k]);
        if (per_token) {
          if (has_item(k) && item_row[k] < rows) atomicMax(&row_amax[hh][item_row[k]], m);
        } else {
          local = max(local, m);
        }
      }
      if (!per_token) {
        local = __reduce_max_sync(0xFFFFFFFFu, local);
        if ((threadIdx.x & 31u) == 0) atomicMax(&row_amax[hh][0], local);
      }
    }
    __syncthreads();

    // Phases 2 to 4 of one encoding: into codes, transposed_codes and scales, with per-token scales
    // (token_scales) or block32 ones.
    auto encode = [&](bool token_scales, uint8_t* __restrict__ codes, uint8_t* __restrict__ transposed_codes,
                      uint8_t* __restrict__ scales) {
      // 2. Scales, one thread per (head, row). A second, block32 encoding takes the group's amax as
      // the max of its rows' (a warp per head: kTileTokens = 32 lanes).
      for (int j = int(threadIdx.x); j < cta_heads * kTileTokens; j += kThreads) {
        const int hh = j / kTileTokens, r = j % kTileTokens;
        uint32_t amax = row_amax[hh][per_token ? r : 0];
        if (kSecond && !token_scales) amax = __reduce_max_sync(0xFFFFFFFFu, amax);  // rows past the end: 0
        if (r >= rows) continue;
        const uint8_t s = detail::scale_for_bf16_amax(amax, rule);
        const float inv = detail::inverse_scale(s);
        row_codec[hh][r] = RowCodec{inv, detail::code_mask(inv)};
        if constexpr (kDelta) row_scale[hh][r] = s;
        scales[int64_t(t0 + r) * heads + h_first + hh] = s;
      }
      __syncthreads();

      // 3. Codes. (tile_codes was last read in the previous step's phase 4, before two barriers.)
      // One loop per set of layouts written (write_rows, write_staged: std::bool_constant), so
      // that no chunk tests them. Each item's place in the row layout, once per step; the heads
      // add a constant to it.
      auto encode_chunks = [&](auto write_rows, auto write_staged) {
        int64_t item_dst[kItems];
#pragma unroll
        for (int k = 0; k < kItems; ++k)
          item_dst[k] = (int64_t(t0 + item_row[k]) * heads + h_first) * dim + item_chunk[k] * kChunk;
#pragma unroll
        for (int hh = 0; hh < kHeadsPerCta; ++hh) {
          if (hh >= cta_heads) break;
#pragma unroll
          for (int k = 0; k < kItems; ++k) {
            const int r = item_row[k], c = item_chunk[k];
            if (!has_item(k)) continue;
            uint32_t* const staged = reinterpret_cast<uint32_t*>(tile_codes[hh] + r * kTilePitch + c * kChunk);
            if (r >= rows) {  // past the document end: zero codes in the transposed layout's padding
              if constexpr (write_staged.value) staged[0] = staged[1] = 0u;
              continue;
            }
            const RowCodec row = row_codec[hh][r];
            const uint32_t lo = detail::encode_e4m3x4(v[hh][k].x, v[hh][k].y, row.inverse_scale, row.mask);
            const uint32_t hi = detail::encode_e4m3x4(v[hh][k].z, v[hh][k].w, row.inverse_scale, row.mask);
            if constexpr (write_staged.value) {  // two word stores: rows are word-aligned (kTilePitch)
              staged[0] = lo;
              staged[1] = hi;
            }
            if constexpr (write_rows.value) {
              uint8_t* dst = codes + item_dst[k] + hh * dim;
              if (vec_store) {
                *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
              } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                  dst[j] = uint8_t(lo >> (8 * j));
                  dst[4 + j] = uint8_t(hi >> (8 * j));
                }
              }
            }
          }
        }
      };
      if (codes && transposed_codes) encode_chunks(std::true_type{}, std::true_type{});
      else if (codes) encode_chunks(std::true_type{}, std::false_type{});
      else if (transposed_codes) encode_chunks(std::false_type{}, std::true_type{});

      // 4. The transposed layout: slot p0 + permuted_position(j) of the document holds position
      // p0 + j, so the 16 slots of half `half` of the step hold rows permuted_key(16 half + 0..15)
      // = 16 half + permuted_key(0..15). A unit reads those 16 rows' bytes of its 4 features as words,
      // transposes them in 4x4 blocks with byte permutes, and writes each feature's 16 slots with one
      // 16-byte store; the lane pair's two halves make one whole 32-byte sector per feature row.
      // (Byte loads took 16 loads and 16 merges per 16 bytes: the pass was issue-bound on them.)
      if (transposed_codes) {
        __syncthreads();
        const int64_t first_slot = layout::transposed_document_start(d.begin, work.doc) + p0;
        // The thread's units: (head, features 4 quad + 0..3, half) of the step. The head and half come
        // from the lane (lanes 2m and 2m + 1 write the two halves of the same feature rows), so a unit
        // costs no division. (Read here, not before the loop: hoisted, the units' addresses took
        // registers that phase 1 needs and spilled.)
        constexpr int kUnits = units_per_thread(kItems);
        const int tid = thread_index_here();
        const int unit_half = tid % 2, unit_head = tid / 2 % kHeadsPerCta, unit_quad = tid / (2 * kHeadsPerCta);
#pragma unroll
        for (int k = 0; k < kUnits; ++k) {
          const int feature = 4 * (unit_quad + k * kThreads / (2 * kHeadsPerCta));
          if (unit_head >= cta_heads || feature >= dim) continue;
          const uint8_t* const half_rows = tile_codes[unit_head] + 16 * unit_half * kTilePitch + feature;
          uint32_t w[4][4];  // w[q][e]: features of row permuted_key(4q + e), then (transposed) rows of feature e
#pragma unroll
          for (int q = 0; q < 4; ++q) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
              w[q][e] = *reinterpret_cast<const uint32_t*>(half_rows + layout::permuted_key(4 * q + e) * kTilePitch);
            transpose_bytes_4x4(w[q]);
          }
          uint8_t* const dst = transposed_codes + (int64_t(h_first + unit_head) * dim + feature) * transposed_pitch +
                               first_slot + 16 * unit_half;
#pragma unroll
          for (int e = 0; e < 4; ++e)
            *reinterpret_cast<uint4*>(dst + e * transposed_pitch) = make_uint4(w[0][e], w[1][e], w[2][e], w[3][e]);
        }
      }
    };
    encode(per_token, codes, transposed_codes, scales);
    if constexpr (kDelta) {
      // 5. D_i: each item's products of its staged codes (phase 3, this thread's) with its chunk of
      // O (copied in phase 1, by this thread), summed over the row's lanes (every lane of the warp
      // takes part: has_item is uniform over a warp) and written by the row's first lane. The next
      // step writes tile_codes and row_scale only after two barriers.
      wait_own_copies();
#pragma unroll
      for (int hh = 0; hh < kHeadsPerCta; ++hh) {
        if (hh >= cta_heads) break;
#pragma unroll
        for (int k = 0; k < kItems; ++k) {
          if (!has_item(k)) continue;
          float sum = 0.f, no_squares = 0.f;
          if (item_row[k] < rows) {
            // two word loads: staged rows are word-aligned only (kTilePitch)
            const uint32_t* const staged =
                reinterpret_cast<const uint32_t*>(tile_codes[hh] + item_row[k] * kTilePitch + item_chunk[k] * kChunk);
            const uint2 codes_staged = make_uint2(staged[0], staged[1]);
            const uint4 o = o_stage[(hh * kItems + k) * kThreads + threadIdx.x];
            gradient_row_dot::add_lane_products<false>(codes_staged, o, sum, no_squares);
          }
          sum = gradient_row_dot::row_sum(sum, chunks);
          const int r = item_row[k];
          if (item_chunk[k] == 0 && r < rows)
            row_delta.delta[int64_t(h_first + hh) * total_tokens + t0 + r] =
                gradient_row_dot::row_delta(sum, row_scale[hh][r]);
        }
      }
    }
    if constexpr (kSecond) {
      // uniform over the CTA, as the barriers need
      if (second.skip_tile > 0 &&
          p0 >= ((d.len + second.skip_tile - 1) / second.skip_tile - second.skip_tiles) * second.skip_tile)
        continue;
      __syncthreads();  // every thread is done with the first encoding's inverse scales and staged codes
      encode(false, second.codes, second.transposed_codes, second.scales);
    }
  }
}

// One CTA per (chunk of kScanChunk positions of a document, head column; the chunk slots of
// core/schedule.h), or per (document, head column) when every document fits one chunk
// (`chunked` false: no document search): an inclusive max-scan over the chunk's tokens in steps of
// kThreads, carrying the running max from step to step, and into the chunk the max of the
// document's tokens before it (each thread reads every kThreads-th of them). UE8M0 bytes order like
// their exponents and the NaN code 0xFF is the largest byte, so the byte max is the NaN-propagating
// max of the exponents (starting from 0x00, the smallest exponent, which any first token's scale
// dominates).
// Chunks, not one CTA per document: a CTA walks its tokens one step after another, so a 65536-token
// document took 256 dependent steps on 16 CTAs (0.2 ms per launch); its last chunk now
// reads the bytes before it 16 loads in flight per thread. Documents that fit one chunk skip the
// search: with it, tiny-unaligned's 278 documents took 17 us per launch instead of 10.
// A head column is one head's byte, or with kFourHeads (heads % 4 == 0) four heads' bytes as one
// word, scanned with the byte-wise max (__vmaxu4): a quarter of the CTAs and loads.
constexpr int kScanChunk = 4 * kThreads;
template <bool kFourHeads>
__global__ void __launch_bounds__(kThreads)
    prefix_max_scales_kernel(const uint8_t* __restrict__ scales, int total_tokens, int heads,
                             const int32_t* __restrict__ cu_seqlens, int num_docs, bool chunked,
                             uint8_t* __restrict__ prefix_max) {
  static_assert(formats::kUe8m0NaN == 0xFF, "NaN must be the largest UE8M0 byte");
  using Column = std::conditional_t<kFourHeads, uint32_t, uint8_t>;  // a token's bytes of the CTA's heads
  __shared__ uint32_t warp_total[kThreads / 32];
  __shared__ uint32_t block_total;
  const int column = blockIdx.y, columns = heads / int(sizeof(Column));
  const Column* const in = reinterpret_cast<const Column*>(scales);
  Column* const out = reinterpret_cast<Column*>(prefix_max);
  const auto column_max = [](uint32_t a, uint32_t b) { return kFourHeads ? __vmaxu4(a, b) : max(a, b); };
  // The last thread's value of a block_inclusive_scan, for every thread (the scan's total).
  const auto scan_total = [&](uint32_t v) {
    __syncthreads();  // every thread has read warp_total
    if (threadIdx.x == kThreads - 1) block_total = v;
    __syncthreads();
    return block_total;
  };
  const int64_t slot_count = chunked ? slots::slot_count(total_tokens, num_docs, kScanChunk) : num_docs;
  for (int64_t slot = blockIdx.x; slot < slot_count; slot += gridDim.x) {
    DocumentTile work{};  // every warp finds the same, so the branch is uniform over the CTA
    if (!chunked) work.span = document_span(cu_seqlens, int(slot), total_tokens);
    else if (!document_tile_warp(cu_seqlens, num_docs, total_tokens, kScanChunk, slot, work)) continue;
    const DocumentSpan d = work.span;
    const int c0 = work.tile * kScanChunk, c1 = chunked ? min(d.len, c0 + kScanChunk) : d.len;
    uint32_t carry = 0;
    if (c0 > 0) {  // uniform over the CTA
      uint32_t before = 0;  // this thread's share of the positions [0, c0)
#pragma unroll 16
      for (int p = int(threadIdx.x); p < c0; p += kThreads)
        before = column_max(before, uint32_t(__ldg(in + int64_t(d.begin + p) * columns + column)));
      carry = scan_total(block_inclusive_scan<kThreads>(before, 0u, column_max, warp_total));
    }
    for (int p0 = c0; p0 < c1; p0 += kThreads) {
      const int p = p0 + int(threadIdx.x);
      const int64_t at = int64_t(d.begin + p) * columns + column;
      const uint32_t v = column_max(
          block_inclusive_scan<kThreads>(p < c1 ? uint32_t(__ldg(in + at)) : 0u, 0u, column_max, warp_total), carry);
      if (p < c1) out[at] = Column(v);
      carry = scan_total(v);  // the step's max, passed on
    }
  }
}

}  // namespace

cudaError_t launch_quantize_mxfp8(const __nv_bfloat16* x, int64_t token_stride, int64_t head_stride, int total_tokens,
                                  int heads, int dim, const int32_t* cu_seqlens, int num_docs, ScaleGeometry geometry,
                                  ScaleRule rule, uint8_t* codes, uint8_t* transposed_codes, uint8_t* scales,
                                  cudaStream_t stream, const BlockCodes* second, const RowDelta* row_delta) {
  if (dim < kChunk || dim > kMaxDim || dim % kChunk != 0 || heads < 1 || heads > kMaxGridY || total_tokens < 0 ||
      num_docs < 0)
    return cudaErrorInvalidValue;
  if (second != nullptr &&
      (geometry != ScaleGeometry::kToken || second->scales == nullptr ||
       (second->codes == nullptr && second->transposed_codes == nullptr) ||
       reinterpret_cast<uintptr_t>(second->transposed_codes) % 16 != 0 ||
       reinterpret_cast<uintptr_t>(second->codes) % 8 != 0 || second->skip_tile < 0 ||
       second->skip_tile % kTileTokens != 0 || second->skip_tiles < 0))
    return cudaErrorInvalidValue;
  const bool vec_load = reinterpret_cast<uintptr_t>(x) % 16 == 0 && token_stride % kChunk == 0 && head_stride % kChunk == 0;
  if (row_delta != nullptr &&
      ((dim != 64 && dim != 128) || !vec_load || second != nullptr || row_delta->delta == nullptr || codes == nullptr ||
       transposed_codes == nullptr || reinterpret_cast<uintptr_t>(row_delta->o) % 16 != 0 ||
       row_delta->o_stride_token % kChunk != 0 || row_delta->o_stride_head % kChunk != 0))
    return cudaErrorInvalidValue;
  if (total_tokens == 0 || num_docs == 0) return cudaSuccess;
  if (x == nullptr || cu_seqlens == nullptr || scales == nullptr || (codes == nullptr && transposed_codes == nullptr) ||
      reinterpret_cast<uintptr_t>(transposed_codes) % 16 != 0)
    return cudaErrorInvalidValue;

  const bool vec_store = reinterpret_cast<uintptr_t>(codes) % 8 == 0;
  constexpr int64_t kMaxGridX = (int64_t(1) << 31) - 1;  // CTAs loop over the slots beyond it
  const int64_t slot_count = slots::slot_count(total_tokens, num_docs, kTileTokens);
  const dim3 grid(unsigned(slot_count < kMaxGridX ? slot_count : kMaxGridX),
                  unsigned((heads + kHeadsPerCta - 1) / kHeadsPerCta));
  // Registers hold every chunk of the CTA's heads: size the array for the dim (D <= 128 or <= 256).
  auto launch = [&](auto vec_load_c, auto items_c) {
    constexpr bool kVec = decltype(vec_load_c)::value;
    constexpr int kItemsC = decltype(items_c)::value;
    if (second != nullptr)
      quantize_mxfp8_kernel<kVec, kItemsC, true, false><<<grid, kThreads, 0, stream>>>(
          x, token_stride, head_stride, total_tokens, heads, dim, cu_seqlens, num_docs, geometry, rule, vec_store,
          codes, transposed_codes, scales, *second, RowDelta{});
    else
      quantize_mxfp8_kernel<kVec, kItemsC, false, false><<<grid, kThreads, 0, stream>>>(
          x, token_stride, head_stride, total_tokens, heads, dim, cu_seqlens, num_docs, geometry, rule, vec_store,
          codes, transposed_codes, scales, BlockCodes{}, RowDelta{});
  };
  // D_i beside dO's codes: dim 64 or 128 and 16-byte loads (checked above).
  auto launch_with_delta = [&] {
    const auto kernel = quantize_mxfp8_kernel<true, kItemsUpTo128, false, true>;
    constexpr size_t kStage = kDeltaStageBytes<kItemsUpTo128>;
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kStage));
        e != cudaSuccess)
      return e;
    kernel<<<grid, kThreads, kStage, stream>>>(x, token_stride, head_stride, total_tokens, heads, dim, cu_seqlens,
                                               num_docs, geometry, rule, vec_store, codes, transposed_codes, scales,
                                               BlockCodes{}, *row_delta);
    return cudaSuccess;
  };
  using Small = std::integral_constant<int, kItemsUpTo128>;
  using Large = std::integral_constant<int, kMaxItemsPerThread>;
  if (row_delta != nullptr) {
    if (const cudaError_t e = launch_with_delta(); e != cudaSuccess) return e;
  } else if (vec_load) {
    dim <= 128 ? launch(std::true_type{}, Small{}) : launch(std::true_type{}, Large{});
  } else {
    dim <= 128 ? launch(std::false_type{}, Small{}) : launch(std::false_type{}, Large{});
  }
  return cudaGetLastError();
}

cudaError_t launch_prefix_max_scales(const uint8_t* scales, int total_tokens, int heads, const int32_t* cu_seqlens,
                                     int num_docs, int max_doc_len, uint8_t* prefix_max, cudaStream_t stream) {
  if (heads < 1 || total_tokens < 0 || num_docs < 0) return cudaErrorInvalidValue;
  if (total_tokens == 0 || num_docs == 0) return cudaSuccess;
  if (scales == nullptr || cu_seqlens == nullptr || prefix_max == nullptr) return cudaErrorInvalidValue;
  if (heads > kMaxGridY) return cudaErrorInvalidValue;
  constexpr int64_t kMaxBlocks = 1 << 20;  // blocks loop over the remaining slots
  const bool chunked = max_doc_len > kScanChunk;
  const int64_t work_slots = chunked ? slots::slot_count(total_tokens, num_docs, kScanChunk) : num_docs;
  const bool four_heads = heads % 4 == 0 && reinterpret_cast<uintptr_t>(scales) % 4 == 0 &&
                          reinterpret_cast<uintptr_t>(prefix_max) % 4 == 0;
  const dim3 grid(unsigned(work_slots < kMaxBlocks ? work_slots : kMaxBlocks),
                  unsigned(four_heads ? heads / 4 : heads));
  if (four_heads)
    prefix_max_scales_kernel<true><<<grid, kThreads, 0, stream>>>(scales, total_tokens, heads, cu_seqlens, num_docs,
                                                                  chunked, prefix_max);
  else
    prefix_max_scales_kernel<false><<<grid, kThreads, 0, stream>>>(scales, total_tokens, heads, cu_seqlens, num_docs,
                                                                   chunked, prefix_max);
  return cudaGetLastError();
}

}  // namespace flamia::cuda
