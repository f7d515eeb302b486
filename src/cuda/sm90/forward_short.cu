// MXFP8 attention forward for short documents, quantized inside the kernel (core/short_documents.h
// says why, and which documents): persistent and warp-specialized like forward.cu, its work in
// items of one (document of at most short_docs::kMaxTokens tokens, KV head), longest documents
// first, and the items in Q tiles (128 rows of one query head of the group).
//   - Warpgroup 0 quantizes. It claims items, streams their BF16 chunks (32 tokens x D of one head)
//     with TMA into a ring of staging slots in short_docs::ChunkPlan's order (and the next item's
//     into L2 ahead of them), and turns them into codes in shared memory with the quantizer's
//     arithmetic (cuda/quant/quantize_mxfp8.cuh's detail steps: bitwise its codes and scales):
//     K's and V's key tiles (rows form and transposed, key-permuted form, as forward.cu's stages
//     hold them) with their per-key factors and V's running scale max (the fold reference rho),
//     then each Q tile with its rows' constants and the fold factors of its split c, which it
//     hands to the consumers.
//   - Warpgroups 1 and 2 attend each Q tile handed over, each its 64 rows, against the item's
//     resident key tiles with the forward's own tile math (forward_tile.cuh), on the values
//     forward.cu's producers would hand it: O and LSE are bitwise those of the quantization pass
//     and forward.cu (GPU-tested).
// So the quantization of the next tiles runs while the consumers attend (the first version had the
// consumers quantize between their products: 0.94 ms on tiny-unaligned, against 0.77 for the
// quantization pass and forward.cu). A document's key tiles stay in shared memory while its Q tiles
// run, so each BF16 element is read once and no code goes through global memory. Items take the
// kTileBuffers key tile buffers in turn, so the next item's first tiles are quantized while the
// current item's last Q tiles run where the buffers allow.
//
// Measured (H200, session 36; reverted right after this commit, which keeps it in the history):
// bitwise the unfused route on every GPU test, but slower: tiny-unaligned's forward 1.37 ms against
// 0.77 (quantization pass + forward.cu) and cuDNN BF16's 0.57. The quantizer warps are the
// bottleneck (consumers skipping their attention: 1.09 ms), and under them the chunk stream itself:
// with the document's key tiles resident only ~40 KiB of staging is left per SM, and the loads alone
// (no arithmetic, no stores, no attention) take 0.51 ms for Q, K and V (~1.6 TB/s). docs/KERNELS.md.
//
// Hand-over: Q tile t (over all the CTA's items) sits in Q buffer t % 2 with its QueryTileInfo;
// q_ring's "full" when the quantizers are done with it, "empty" when the consumers are. The fold
// factors (v_pow, group_fold) live in the key tiles and depend on the Q tile's split c, so the
// quantizers refresh them for Q tile t only once the consumers are done with Q tile t - 1; a key
// tile buffer is taken again once the consumers release its item (tile_free, after the item's last
// Q tile).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/operand_layout.h"
#include "core/short_documents.h"
#include "core/tiling.h"
#include "cuda/document_span.cuh"
#include "cuda/quant/quantize_mxfp8.cuh"
#include "cuda/sm90/forward.h"
#include "cuda/sm90/forward_tile.cuh"
#include "cuda/sm90/launch.cuh"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/sm90/work_items.cuh"
#include "formats/scales.h"

namespace flamia::cuda::sm90 {
namespace {

using namespace forward_tile;
using short_docs::ChunkPlan;
using short_docs::kChunksPerTile;

constexpr int kChunkRows = short_docs::kChunkTokens;  // 32: one block32 group
constexpr int kWarpgroupThreads = 128;
constexpr int kQuantizers = kWarpgroupThreads;  // warpgroup 0
static_assert(short_docs::kTileTokens == kKeyTile && kKeyTile == kQueryRows, "tiles of the forward's size");
static_assert(kQueryRows == kQuantizers, "a quantizer thread per Q tile row (its constants)");
// Key tile buffers: a document's tiles at most, items take them in turn (item n from where item n - 1
// ended). Q buffers: the next Q tile is quantized while the consumers attend one.
constexpr int kTileBuffers = short_docs::kMaxTiles;
constexpr int kQueryBuffers = 2;
// Registers per thread after the hand-over: the quantizers' chunk state spilled at forward.cu's
// producers' 40 (and at 56, between Q tiles); 128 x 64 + 256 x 216 = 63488 fit in what the launch
// allocates, 168 x 384 (tma.cuh: the consumers' increase waits for registers the decrease freed).
constexpr int kQuantizerRegisters = 72, kAttendRegisters = 208;
static_assert(kQuantizers * kQuantizerRegisters + 2 * kWarpgroupThreads * kAttendRegisters <=
                  kQuantizers * kProducerRegisters + 2 * kWarpgroupThreads * kConsumerRegisters,
              "the hand-over fits the launch's registers");
// Named barrier 1 (0 is __syncthreads'): the quantizers among themselves.
constexpr int kQuantizerBarrier = 1;

template <int D>
constexpr int kChunkBytes = kChunkRows * D * 2;  // BF16
// Staging slots: as many as fit beside the tiles; TMA loads run this many chunks ahead of the
// quantizers (reading L2: the producer prefetches an item's chunks one item ahead).
template <int D>
constexpr int kStagingSlots = D == 128 ? 5 : 16;
// A V chunk's codes before they are transposed: rows of D bytes at a pitch of an odd number of words,
// so that the transpose's word loads hit 32 distinct banks (as the quantizer's phase 4).
template <int D>
constexpr int kVRowPitch = D + 4;
static_assert(kVRowPitch<128> % 4 == 0 && (kVRowPitch<128> / 4) % 2 == 1 && (kVRowPitch<64> / 4) % 2 == 1,
              "word-aligned rows, an odd number of words apart");

// One item as the quantizers hold it (in shared memory, for all of them).
struct ShortItem {
  int doc, begin, len, kvh;
  int first_use;  // its first chunk's use of the staging ring (the ring runs on across items)
  int total;      // its chunks (ChunkPlan::total); 0: no item
  int tile_base;  // its key tile j sits in buffer (tile_base + j) % kTileBuffers
};
// A Q tile as the quantizers hand it over.
struct ShortTileInfo {
  QueryTileInfo q;   // the tile (work: its CtaWork, tiles = 0 for "no more") and its rows' constants
  int tile_base;     // where its item's key tiles are
  int releases;      // the item's last Q tile: the consumers then release its key tile buffers
};

template <int D>
struct ShortShared {
  KeyTileStage<D> tile[kTileBuffers];                     // key tiles' codes and per-key factors
  alignas(1024) uint8_t q[kQueryBuffers][kQueryRows * D];  // Q tiles' codes, rows form
  alignas(128) uint8_t staging[kStagingSlots<D>][kChunkBytes<D>];  // BF16 chunks, as TMA lands them
  alignas(16) uint8_t v_rows[2][kChunkRows * kVRowPitch<D>];       // by V chunk parity
  ShortTileInfo info[kQueryBuffers];
  uint8_t rho[short_docs::kMaxTokens];  // the item's V running scale max at each position (UE8M0)
  uint8_t q_scale[kQueryRows];          // the Q tile's row scales
  uint32_t amax[2][2][4];               // block32: each quantizer warp's amax, by parity and chunk
  ShortItem items[2];                   // the quantizers' current and next item, by item parity
  int issued;                           // the lead quantizer's next use to load,
  short_docs::ChunkCursor cursor;       // and its chunk in its item
  uint64_t chunk_full[kStagingSlots<D>];  // a chunk's TMA landed (1 arrival with the bytes)
  uint64_t tile_free[kTileBuffers];      // the consumers released the buffer's item (8 warp arrivals)
  StageRing<kQueryBuffers> q_ring;       // full: the quantizers (128 arrivals); empty: 8 consumer warps
};
// The dynamic shared memory's base is only 16-byte aligned: aligned_shared_storage rounds it up.
template <int D>
constexpr size_t kShortSharedBytes = sizeof(ShortShared<D>) + 1024;
static_assert(kShortSharedBytes<128> <= 227 * 1024 && kShortSharedBytes<64> <= 227 * 1024,
              "one CTA per SM must fit in shared memory");

struct ShortArgs {
  ForwardParams p;
  const int32_t* docs;
  const int* doc_count;
  bool floor_rule;
  CUtensorMap x_map[3];  // BF16 Q, K, V (ChunkPlan::Operand order): box 2D bytes x 1 x kChunkRows
};

// threadIdx.x, read where it is called: the compiler cannot hoist what derives from it out of the
// item loop (held across it, such values spilled).
__device__ __forceinline__ int thread_index_here() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

// --- quantizing a chunk --------------------------------------------------------------------------
// A quantizer thread's units of a chunk: (row, 16-byte column) pairs, the row's features 8 col ..
// 8 col + 7, rows row0 + k kRowStep. A row's kColumns units sit in kColumns consecutive lanes.
template <int D>
struct ChunkUnits {
  static constexpr int kColumns = D / 8;
  static constexpr int kRowStep = kQuantizers / kColumns;
  static constexpr int kUnits = kChunkRows / kRowStep;
  static_assert(kColumns <= 32 && kUnits * kRowStep == kChunkRows, "a row's units inside one warp");
  int row0, col;
  __device__ __forceinline__ int row(int k) const { return row0 + k * kRowStep; }
  __device__ __forceinline__ static ChunkUnits here() {
    const int tid = thread_index_here() % kQuantizers;
    return {tid / kColumns, tid % kColumns};
  }
};
template <int D>
struct EncodedChunk {
  uint2 codes[ChunkUnits<D>::kUnits];    // 8 codes per unit (zero past the document's end)
  uint8_t scale[ChunkUnits<D>::kUnits];  // its row's scale
};

// The codes and scales of kCount chunks from their BF16 rows (rows_valid[i] of chunk i's rows lie
// inside the document; 0: no chunk, codes zero): the quantizer's steps (quantize_mxfp8.cu, phases
// 1-3) on the same values, so the same bits. Block32: one amax per chunk (a warp max, then the four
// warps' through amax_slots); per token: one per row, over the row's lanes. One barrier for all of
// them, after which every quantizer has read the chunks: there `loaded()` runs (every thread), which
// may refill their staging slots.
template <int D, int kCount, class Loaded>
__device__ __forceinline__ void encode_chunks(const uint8_t* const (&staged)[kCount], const int (&rows_valid)[kCount],
                                              bool per_token, formats::ScaleRule rule,
                                              uint32_t (&amax_slots)[kCount][4], const ChunkUnits<D>& u,
                                              Loaded loaded, EncodedChunk<D> (&out)[kCount]) {
  using U = ChunkUnits<D>;
  uint4 v[kCount][U::kUnits];
  uint32_t amax[kCount][U::kUnits];
#pragma unroll
  for (int i = 0; i < kCount; ++i)
#pragma unroll
    for (int k = 0; k < U::kUnits; ++k) v[i][k] = *reinterpret_cast<const uint4*>(staged[i] + (u.row(k) * D + u.col * 8) * 2);
#pragma unroll
  for (int i = 0; i < kCount; ++i)
#pragma unroll
    for (int k = 0; k < U::kUnits; ++k)  // padding rows never raise a max
      amax[i][k] = u.row(k) < rows_valid[i] ? detail::max_abs_bits(v[i][k]) : 0u;
  if (per_token) {
#pragma unroll
    for (int i = 0; i < kCount; ++i)
#pragma unroll
      for (int k = 0; k < U::kUnits; ++k)
#pragma unroll
        for (int o = U::kColumns / 2; o >= 1; o /= 2)
          amax[i][k] = max(amax[i][k], __shfl_xor_sync(0xffffffffu, amax[i][k], o));
    named_barrier_sync(kQuantizerBarrier, kQuantizers);
  } else {
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      uint32_t local = 0;
#pragma unroll
      for (int k = 0; k < U::kUnits; ++k) local = max(local, amax[i][k]);
      local = __reduce_max_sync(0xffffffffu, local);
      if (threadIdx.x % 32 == 0) amax_slots[i][threadIdx.x / 32] = local;
    }
    named_barrier_sync(kQuantizerBarrier, kQuantizers);
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      const uint32_t all = max(max(amax_slots[i][0], amax_slots[i][1]), max(amax_slots[i][2], amax_slots[i][3]));
#pragma unroll
      for (int k = 0; k < U::kUnits; ++k) amax[i][k] = all;
    }
  }
  loaded();
#pragma unroll
  for (int i = 0; i < kCount; ++i)
#pragma unroll
    for (int k = 0; k < U::kUnits; ++k) {
      // Block32: one scale per chunk (the same amax in every unit; computed once).
      const uint8_t s = (per_token || k == 0) ? detail::scale_for_bf16_amax(amax[i][k], rule) : out[i].scale[0];
      const float inv = detail::inverse_scale(s);
      const uint32_t mask = detail::code_mask(inv);
      out[i].scale[k] = s;
      out[i].codes[k] = u.row(k) < rows_valid[i] ? make_uint2(detail::encode_e4m3x4(v[i][k].x, v[i][k].y, inv, mask),
                                                              detail::encode_e4m3x4(v[i][k].z, v[i][k].w, inv, mask))
                                                 : make_uint2(0u, 0u);
    }
}

// A chunk's codes into a rows-form tile (D-byte rows, swizzled as TMA writes them) from row row_base.
template <int D>
__device__ __forceinline__ void store_rows_form(uint8_t* tile, int row_base, const ChunkUnits<D>& u,
                                                const EncodedChunk<D>& e) {
#pragma unroll
  for (int k = 0; k < ChunkUnits<D>::kUnits; ++k)
    *reinterpret_cast<uint2*>(tile + swizzled_offset<D>((row_base + u.row(k)) * D + u.col * 8)) = e.codes[k];
}

// V chunk cc of a key tile, from its staged codes (v_rows, the chunk's 32 rows) into the tile's
// transposed form: slot 32 cc + kappa of feature row f holds position permuted_key(kappa) of the
// chunk (core/operand_layout.h), as the quantizer's phase 4 writes it: a unit (4 features, half of
// the step) reads its 16 rows' words, transposes them in 4x4 byte blocks and stores each feature's
// 16 slots at once.
template <int D>
__device__ __forceinline__ void transpose_v_chunk(const uint8_t* v_rows, uint8_t* vt, int cc, int tid) {
  constexpr int kPitch = kVRowPitch<D>;
  for (int unit = tid; unit < D / 4 * 2; unit += kQuantizers) {
    const int quad = unit / 2, half = unit % 2;
    const uint8_t* rows = v_rows + 16 * half * kPitch + 4 * quad;
    uint32_t w[4][4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        w[q][e] = *reinterpret_cast<const uint32_t*>(rows + layout::permuted_key(4 * q + e) * kPitch);
      detail::transpose_bytes_4x4(w[q]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int offset = (4 * quad + e) * kKeyTile + kChunkRows * cc + 16 * half;
      *reinterpret_cast<uint4*>(vt + swizzled_offset<kKeyTile>(offset)) = make_uint4(w[0][e], w[1][e], w[2][e], w[3][e]);
    }
  }
}

// --- quantizers ----------------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void quantize(const ShortArgs& a, ShortShared<D>& sm) {
  const ForwardParams& p = a.p;
  const int lane = int(threadIdx.x) % 32;
  const bool lead = threadIdx.x == 0;  // claims items and issues the TMA loads
  const int group = p.q_heads / p.kv_heads;
  const int items = __ldg(a.doc_count) * p.kv_heads;
  const formats::ScaleRule rule = a.floor_rule ? formats::ScaleRule::kFloor : formats::ScaleRule::kCeil;
  const bool per_token = !p.group_scales;
  auto sync = [] { named_barrier_sync(kQuantizerBarrier, kQuantizers); };

  // --- items (the lead thread's) and their chunks' loads ---
  // The item `item` (the longest documents first, each document's KV heads in turn) or the next with
  // work, claiming further ones; total 0: none left.
  auto find = [&](int item, const ShortItem& before) {
    ShortItem it{};
    it.first_use = before.first_use + before.total;
    it.tile_base = (before.tile_base + ChunkPlan{before.len, group, p.causal}.tiles()) % kTileBuffers;
    for (; item < items; item = next_work_item(p.work_counter)) {
      const int doc = __ldg(a.docs + item / p.kv_heads);
      const DocumentSpan span = document_span(p.cu_seqlens, doc, p.total_tokens);
      it.doc = doc, it.begin = span.begin, it.len = span.len, it.kvh = item % p.kv_heads;
      it.total = ChunkPlan{span.len, group, p.causal}.total();
      if (it.total > 0) return it;
    }
    it.total = 0;
    return it;
  };
  // Every chunk of an item into L2, a lane of warp 0 per chunk: K's, V's, then each query head's Q.
  auto prefetch = [&](const ShortItem& it) {
    const int chunks = ChunkPlan{it.len, group, p.causal}.chunks();
    for (int i = lane; i < (2 + group) * chunks; i += 32) {
      const int x = min(i / chunks, 2), g = i / chunks - 2;
      const ChunkPlan::Operand operand = x == 0 ? ChunkPlan::kKey : x == 1 ? ChunkPlan::kValue : ChunkPlan::kQuery;
      const int head = operand == ChunkPlan::kQuery ? it.kvh * group + g : it.kvh;
      tma_prefetch_l2(a.x_map[operand], 0, head, it.begin + (i % chunks) * kChunkRows);
    }
  };
  // The lead's loads into the staging ring: every use below `consumed + slots` of the items known
  // (the current and the next; n: the current item's number); sm.issued is the next use to load.
  auto load_ahead = [&](int n, int consumed) {
    if (!lead) return;
    for (int& issued = sm.issued; issued < consumed + kStagingSlots<D>; ++issued) {
      const ShortItem& cur = sm.items[n & 1];
      const ShortItem& next = sm.items[(n + 1) & 1];
      const ShortItem* it = issued < cur.first_use + cur.total ? &cur : &next;
      if (it->total == 0 || issued >= it->first_use + it->total) return;  // not known yet
      if (issued == it->first_use) sm.cursor = short_docs::ChunkCursor{};
      const ChunkPlan::Chunk c = sm.cursor.step(ChunkPlan{it->len, group, p.causal});
      const int slot = issued % kStagingSlots<D>;
      barrier_expect_bytes(sm.chunk_full[slot], kChunkBytes<D>);
      const int head = c.operand == ChunkPlan::kQuery ? it->kvh * group + c.head : it->kvh;
      tma_load(a.x_map[c.operand], sm.staging[slot], sm.chunk_full[slot], 0, head, it->begin + c.chunk * kChunkRows);
      barrier_arrive(sm.chunk_full[slot]);
    }
  };
  auto staged = [&](int use) -> const uint8_t* {
    barrier_wait(sm.chunk_full[use % kStagingSlots<D>], (use / kStagingSlots<D>) & 1);
    return sm.staging[use % kStagingSlots<D>];
  };

  // --- the first two items ---
  if (lead) {
    const ShortItem none{0, 0, 0, 0, 0, 0, 0};
    sm.items[0] = find(first_work_item(), none);
    sm.items[1] = sm.items[0].total ? find(next_work_item(p.work_counter), sm.items[0]) : none;
  }
  sync();
  if (threadIdx.x < 32) {
    if (sm.items[0].total) prefetch(sm.items[0]);
    if (sm.items[1].total) prefetch(sm.items[1]);
  }
  if (lead) sm.issued = 0;
  load_ahead(0, 0);

  int q_tile = 0;                // the Q tiles handed over so far
  int calls = 0;                 // encode calls so far
  uint32_t tile_use_parity = 0;  // bit b: the parity of buffer b's next use (see tile_free)
  for (int n = 0;; ++n) {
    const ShortItem it = sm.items[n & 1];
    if (it.total == 0) break;
    const ChunkPlan plan{it.len, group, p.causal};
    // Two chunks of the item (uses use0 and use1, chunks c0 and c1; use1 < 0: only the first): their
    // codes (the slots are refilled as soon as every thread has read them).
    auto encode = [&](int use0, int c0, int use1, int c1, EncodedChunk<D> (&e)[2]) {
      const uint8_t* const chunks[2] = {staged(it.first_use + use0), use1 < 0 ? nullptr : staged(it.first_use + use1)};
      const int rows[2] = {min(kChunkRows, it.len - c0 * kChunkRows), use1 < 0 ? 0 : min(kChunkRows, it.len - c1 * kChunkRows)};
      const uint8_t* const read[2] = {chunks[0], use1 < 0 ? chunks[0] : chunks[1]};  // no chunk: read the first again
      encode_chunks<D, 2>(read, rows, per_token, rule, sm.amax[calls & 1], ChunkUnits<D>::here(),
                          [&] { load_ahead(n, it.first_use + max(use0, use1) + 1); }, e);
      ++calls;  // consecutive calls take the two amax slot sets in turn
    };

    // Key tile j: K's and V's codes, the per-key factors and rho; chunks past the document's end
    // hold zero codes (finite, as forward.cu's tile loads past an end find them).
    auto key_tile = [&](int j) {
      const int b = (it.tile_base + j) % kTileBuffers;
      barrier_wait(sm.tile_free[b], ((tile_use_parity >> b) & 1) ^ 1);  // its last item was released
      tile_use_parity ^= 1u << b;
      KeyTileStage<D>& st = sm.tile[b];
      uint32_t rho_carry = j == 0 ? 0u : sm.rho[j * kKeyTile - 1];  // the running max before the tile
      for (int cc = 0; cc < kChunksPerTile; ++cc) {
        const int c = j * kChunksPerTile + cc, key0 = cc * kChunkRows;
        const int tid = thread_index_here();
        if (cc >= plan.tile_chunks(j)) {
          for (int i = tid; i < kChunkRows * D / 16; i += kQuantizers)
            reinterpret_cast<uint4*>(st.k + key0 * D)[i] = make_uint4(0u, 0u, 0u, 0u);  // whole rows
          for (int i = tid; i < D * 2; i += kQuantizers)
            *reinterpret_cast<uint4*>(st.vt + swizzled_offset<kKeyTile>((i / 2) * kKeyTile + key0 + 16 * (i % 2))) =
                make_uint4(0u, 0u, 0u, 0u);
          if (tid < kChunkRows) st.k_col[key0 + tid] = 0.f, st.v_scale[key0 + tid] = 0;
          continue;
        }
        const int rows_valid = min(kChunkRows, it.len - c * kChunkRows);
        const ChunkUnits<D> units = ChunkUnits<D>::here();
        EncodedChunk<D> e[2];  // K's and V's chunk c
        encode(plan.k_use(c), c, plan.v_use(c), c, e);
        store_rows_form<D>(st.k, key0, units, e[0]);
        uint8_t* rows = sm.v_rows[c & 1];  // consecutive V chunks of an item alternate
#pragma unroll
        for (int k = 0; k < ChunkUnits<D>::kUnits; ++k) {
          uint32_t* row = reinterpret_cast<uint32_t*>(rows + units.row(k) * kVRowPitch<D> + units.col * 8);
          row[0] = e[1].codes[k].x;
          row[1] = e[1].codes[k].y;
          if (units.col == 0) {
            const bool in_doc = units.row(k) < rows_valid;
            st.k_col[key0 + units.row(k)] = in_doc ? pow2_of_scale(e[0].scale[k]) : 0.f;
            st.v_scale[key0 + units.row(k)] = in_doc ? e[1].scale[k] : 0;
          }
        }
        sync();  // the chunk's V rows and scales
        transpose_v_chunk<D>(rows, st.vt, cc, tid);
        if (tid < 32) {  // rho: the running max of V's scale bytes (the NaN code 0xFF is the largest)
          const int pos = c * kChunkRows + tid;
          uint32_t s = pos < it.len ? st.v_scale[key0 + tid] : 0u;
#pragma unroll
          for (int o = 1; o < 32; o *= 2) {
            const uint32_t before = __shfl_up_sync(0xffffffffu, s, o);
            if (tid >= o) s = max(s, before);
          }
          s = max(s, rho_carry);
          if (pos < it.len) sm.rho[pos] = uint8_t(s);
          rho_carry = __shfl_sync(0xffffffffu, s, 31);
        }
      }
      fence_proxy_async_shared();  // the codes are read by wgmma
      sync();                      // rho and the tile, for every quantizer
    };

    // Q tile j of query head g: its codes, its rows' constants and its fold factors, handed over.
    const int tiles = plan.tiles();
    auto query_tile = [&](int g, int j) {
      const int t = q_tile++, buffer = t % kQueryBuffers;
      sm.q_ring.wait_empty(t);  // the buffer's previous Q tile is done
      const int q0 = j * kQueryRows;
      for (int ci = 0; ci < plan.tile_chunks(j); ci += 2) {  // two chunks at a time
        const int c = j * kChunksPerTile + ci;
        const bool pair = ci + 1 < plan.tile_chunks(j);
        const ChunkUnits<D> units = ChunkUnits<D>::here();
        EncodedChunk<D> e[2];
        encode(plan.q_use(g, c), c, pair ? plan.q_use(g, c + 1) : -1, c + 1, e);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          if (i == 1 && !pair) break;
          store_rows_form<D>(sm.q[buffer], (ci + i) * kChunkRows, units, e[i]);
          if (units.col == 0)
#pragma unroll
            for (int k = 0; k < ChunkUnits<D>::kUnits; ++k) sm.q_scale[(ci + i) * kChunkRows + units.row(k)] = e[i].scale[k];
        }
      }
      fence_proxy_async_shared();  // the codes are read by wgmma
      sync();                      // q_scale
      CtaWork cw;
      cw.doc = it.doc, cw.doc_begin = it.begin, cw.doc_end = it.begin + it.len, cw.len = it.len, cw.q0 = q0;
      cw.head = it.kvh * group + g, cw.kvh = it.kvh;
      cw.tiles = plan.key_tiles_for(j);
      cw.c_exp = scale_exponent(sm.rho[p.causal ? q0 : it.len - 1]);  // forward.cu's find_work
      ShortTileInfo& info = sm.info[buffer];
      {  // the row constants, a thread per row, as forward.cu's store_row_constants
        const int row = thread_index_here(), pos = q0 + row;
        const bool valid = pos < it.len;
        constexpr uint8_t kUnitScale = formats::kUe8m0Bias;  // rows past the end: any finite scale
        const uint8_t fold = sm.rho[p.causal ? (valid ? pos : 0) : it.len - 1];
        bool splits;
        info.q.row[row] = row_constants(p, cw, valid ? sm.q_scale[row] : kUnitScale, fold, valid, splits);
        const uint32_t split_rows = __ballot_sync(0xffffffffu, splits);  // consumer warps 2 w, 2 w + 1
        if (lane == 0) {
          info.q.split_fold[2 * (row / 32)] = (split_rows & 0xffffu) == 0xffffu;
          info.q.split_fold[2 * (row / 32) + 1] = (split_rows >> 16) == 0xffffu;
        }
      }
      if (threadIdx.x == 0) {
        info.q.work = cw;
        info.tile_base = it.tile_base;
        info.releases = j == tiles - 1 && g == group - 1;  // the item's last Q tile (either order)
      }
      // The fold factors of the split c in the tiles this Q tile reads, once the consumers are done
      // with the Q tile before (which may read other factors from the same tiles).
      sm.q_ring.wait_empty(t + 1);
      const int neg_c = cw.c_exp == kNaNExponent ? kNaNExponent : -cw.c_exp;
      const float inv_c = pow2i(neg_c);
      const int tid = thread_index_here();
      for (int k = tid; k < cw.tiles * kKeyTile; k += kQuantizers) {
        KeyTileStage<D>& st = sm.tile[(it.tile_base + k / kKeyTile) % kTileBuffers];
        st.v_pow[k % kKeyTile] = (k < it.len ? pow2_of_scale(st.v_scale[k % kKeyTile]) : 1.f) * inv_c;
      }
      for (int i = tid; i < cw.tiles * kTileGroups; i += kQuantizers) {
        KeyTileStage<D>& st = sm.tile[(it.tile_base + i / kTileGroups) % kTileBuffers];
        st.group_fold[i % kTileGroups] = group_fold_factor(st.v_scale[(i % kTileGroups) * tiling::kScaleBlock], neg_c);
      }
      sm.q_ring.arrive_full(t);  // every thread: its stores released to the consumers
    };

    // The chunks in use order (ChunkPlan): causal, each key tile just before its Q tiles; not causal,
    // every key tile before the first Q tile.
    for (int j = 0; j < tiles; ++j) {
      for (int k = j == 0 ? 0 : plan.key_tiles_for(j - 1); k < plan.key_tiles_for(j); ++k) key_tile(k);
      for (int g = 0; g < group; ++g) query_tile(g, j);
    }

    // The item after the next: claimed once every thread has read this one, then prefetched and
    // loaded as the ring allows.
    sync();
    if (lead) {
      const ShortItem& next = sm.items[(n + 1) & 1];
      sm.items[n & 1] = next.total ? find(next_work_item(p.work_counter), next) : ShortItem{0, 0, 0, 0, 0, 0, 0};
    }
    sync();
    if (threadIdx.x < 32 && sm.items[n & 1].total) prefetch(sm.items[n & 1]);
    load_ahead(n + 1, sm.items[(n + 1) & 1].first_use);
  }
  // No more items: a Q tile of 0 key tiles ends the consumers.
  sm.q_ring.wait_empty(q_tile);
  if (threadIdx.x == 0) sm.info[q_tile % kQueryBuffers].q.work.tiles = 0;
  sm.q_ring.arrive_full(q_tile);
}

// --- consumers -----------------------------------------------------------------------------------
// One Q tile's attention by one warpgroup against its item's resident key tiles (it.w.tiles of them,
// from the diagonal one, tile 0 of the loop, down): forward.cu's consume_items for one item, with
// the tile buffers in place of the ring's stages.
template <int D>
__device__ __forceinline__ void attend(const ForwardParams& p, const ShortShared<D>& sm, const ItemRows& it,
                                       int tile_base) {
  constexpr SmemLayout kRowsLayout = kSwizzleFor<D>, kVtLayout = kSwizzleFor<kKeyTile>;
  const uint8_t* q = sm.q[it.q_buffer] + consumer_thread().consumer * kWarpgroupRows * D;
  const timeline::StepClock clock{};
  auto tile = [&](int i) -> const KeyTileStage<D>& {
    return sm.tile[(tile_base + it.w.tiles - 1 - i) % kTileBuffers];
  };
  float o_acc[D / 2];             // the m64nD accumulator
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float s[kKeyTile / 2];          // S_i, then tile i's P operand values
  uint32_t pa[kKeyTile / 32][4];  // P~_{i-1}, read by the P.V in flight
  float alpha[2];
  wgmma_fence();
  rows_product<D, kKeyTile, kRowsLayout>(s, q, tile(0).k);
  wgmma_commit();
  wgmma_wait<0>();
  zero(o_acc);
  tile_softmax<D, false, true>(p, it, tile(0), 0, s, m, l, alpha, clock);  // O is still 0
  pack_a_operand<kKeyTile>(s, pa);
  for (int i = 1; i < it.w.tiles; ++i) {
    wgmma_fence();
    rows_product<D, kKeyTile, kRowsLayout>(s, q, tile(i).k);
    wgmma_commit();
    register_product<D, kKeyTile, kVtLayout>(o_acc, pa, tile(i - 1).vt);
    wgmma_commit();
    wgmma_wait<1>();  // S_i is done; P.V may still run
    interior_softmax<D, false>(p, it, tile(i), i, s, m, l, alpha, clock);  // only tile 0 can be masked
    wgmma_wait<0>();
    fence_accumulators(o_acc);
    rescale_output(o_acc, alpha);
    pack_a_operand<kKeyTile>(s, pa);
  }
  wgmma_fence();
  register_product<D, kKeyTile, kVtLayout>(o_acc, pa, tile(it.w.tiles - 1).vt);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(o_acc);
  store_item_output(p, it, o_acc, m, l);
}

// Each Q tile handed over, in turn: attend it (a warpgroup whose rows all lie past the document's
// end has nothing to do), release its buffer, and after an item's last Q tile its key tiles.
template <int D>
__device__ __forceinline__ void consume(const ShortArgs& a, ShortShared<D>& sm) {
  const ForwardParams& p = a.p;
  const ConsumerThread me = consumer_thread();
  for (int t = 0;; ++t) {
    sm.q_ring.wait_full(t);
    const ShortTileInfo& info = sm.info[t % kQueryBuffers];
    const CtaWork w = info.q.work;
    if (w.tiles == 0) return;
    const int tile_base = info.tile_base;
    const bool releases = info.releases;
    if (w.q0 + me.consumer * kWarpgroupRows < w.len)
      attend<D>(p, sm, item_rows(w, info.q, 0, t % kQueryBuffers), tile_base);
    __syncwarp();
    if (me.lane == 0) {
      sm.q_ring.arrive_empty(t);
      if (releases)
        for (int i = 0; i < w.tiles; ++i) barrier_arrive(sm.tile_free[(tile_base + i) % kTileBuffers]);
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1) forward_short_kernel(const __grid_constant__ ShortArgs args) {
  ShortShared<D>& sm = aligned_shared_storage<ShortShared<D>>();
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStagingSlots<D>; ++s) barrier_init(sm.chunk_full[s], 1);
    for (int b = 0; b < kTileBuffers; ++b) barrier_init(sm.tile_free[b], kConsumerWarps);
    sm.q_ring.init(kQuantizers, kConsumerWarps);
    barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < kQuantizers) {
    release_registers<kQuantizerRegisters>();
    quantize<D>(args, sm);
  } else {
    claim_registers<kAttendRegisters>();
    consume<D>(args, sm);
  }
}

}  // namespace

int launch_forward_short(const ShortForwardParams& sp, void* stream) {
  const ForwardParams& p = sp.forward;
  return for_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    ShortArgs args{};
    args.p = p;
    args.docs = sp.docs;
    args.doc_count = sp.doc_count;
    args.floor_rule = sp.floor_rule;
    cudaError_t e = bf16_rows_map(args.x_map[ChunkPlan::kQuery], sp.q, p.total_tokens, p.q_heads, D, sp.q_stride_token,
                                  sp.q_stride_head, kChunkRows);
    if (e == cudaSuccess)
      e = bf16_rows_map(args.x_map[ChunkPlan::kKey], sp.k, p.total_tokens, p.kv_heads, D, sp.k_stride_token,
                        sp.k_stride_head, kChunkRows);
    if (e == cudaSuccess)
      e = bf16_rows_map(args.x_map[ChunkPlan::kValue], sp.v, p.total_tokens, p.kv_heads, D, sp.v_stride_token,
                        sp.v_stride_head, kChunkRows);
    if (e != cudaSuccess) return e;
    // Every (document, KV head) bounds the items; the kernel stops at the list's length.
    const int64_t items = int64_t(p.num_docs) * p.kv_heads;
    return launch_persistent(forward_short_kernel<D>, args, kShortSharedBytes<D>, kThreads, items, p.work_counter,
                             static_cast<cudaStream_t>(stream));
  });
}

}  // namespace flamia::cuda::sm90
