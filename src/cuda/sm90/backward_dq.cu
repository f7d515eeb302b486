// Backward pass 3: dQ. A work item (tile of 128 queries of one document, query head; in the work
// order of core/schedule.h, as the forward's) owns those rows'
// dQ and walks the 128-key tiles (counted from the document start, tiling::kBwdKeyTile) that its
// rows see; persistent like the forward (one CTA per SM takes items in turn, work_items.cuh). Per
// key tile:
//   S = Q codes . K codes^T,  p_ij = 2^(S_ij 2^(eq_i + ek_j) scale log2(e) - LSE_i log2(e))
//   E = dO codes . V codes^T, E_ij = E_ij 2^(eg_i + ev_j),  U_ij = p_ij (E_ij - D_i)
//   dQ_i += 2^sigma_i sum_j E4M3(U_ij 2^(ek_j - sigma_i)) ck_j,  sigma_i: ceil scale of max_j |U_ij 2^ek_j|
// one sigma per (row, key tile), as the emulation defines it; dQ is scaled by the softmax scale at
// the end. A row reads only its visible keys, and its sum runs in a fixed order: dQ_i is
// deterministic and, in prefix mode, independent of everything after i.
// Warp-specialized like the forward (forward.cu, tma.cuh): warpgroup 0's producer warp loads each
// item's Q and dO rows (two row buffers: the next item's land while this one runs) with their
// per-row constants, and each key tile's K rows, V rows and K^T (the quantizer's transposed layout)
// by TMA into a ring of stages that runs on across items, with the keys' scale factors; warpgroups
// 1 and 2 (64 rows each) compute, taking turns at issuing their products with the grouped
// arithmetic on long documents (tma.cuh's ConsumerTurns, kernel_problem.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/operand_layout.h"
#include "core/tiling.h"
#include "cuda/schedule/document_span.cuh"
#include "cuda/schedule/launch.cuh"
#include "cuda/schedule/work_items.cuh"
#include "cuda/sm90/accumulator.cuh"
#include "cuda/sm90/backward.h"
#include "cuda/sm90/fp8_math.cuh"
#include "cuda/sm90/key_scales.cuh"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "formats/scales.h"

namespace flamia::cuda::sm90 {
namespace {

constexpr int kQueryRows = kWarpgroupRows * kConsumers;  // rows per CTA
constexpr int kKeyTile = tiling::kBwdKeyTile;  // keys per step: sigma's group
constexpr int kStages = 3;
constexpr int kRowBuffers = 2;  // item n's Q and dO rows in buffer n % 2
static_assert(kKeyTile == 128, "S is one m64n128 product per k-step");
static_assert(kKeyTile % kQueryRows == 0, "a CTA's rows share their diagonal key tile");
// Registers per thread after the hand-over: 128 x 24 + 256 x 240 = 64512 of the SM's 65536 (the
// consumers hold S, E and dQ: 232 spilled).
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
constexpr int kProducerLanes = 32;  // the rows ring's producer warp (the publisher)

// The key tile's factors 2^ek_j and 2^ev_j lie in shared memory in the key permutation's order
// (core/operand_layout.h: the order of the P operand's registers): accumulator lane (g, t) holds keys
// 2t, 2t + 1 of every n8 block, and those of blocks 2b and 2b + 1 sit side by side, so the per-key
// interior path fetches a lane's four factors with one 16-byte load (in key order it took an 8-byte
// load per n8 block and array, and dQ was 2-3% slower in prefix isolation; the forward,
// whose per-key path uses each array in another phase, was 1.5-2% slower with 16-byte loads). The
// grouped path reads the factor of key 32g, which stays at slot 32g.
// {.x, .y}: keys 2t, 2t + 1 of n8 block 2 b2; {.z, .w}: the same of block 2 b2 + 1.
__device__ __forceinline__ float4 lane_key_factors(const float* factors, int b2, int t) {
  return *reinterpret_cast<const float4*>(factors + 16 * b2 + 4 * t);
}
// Keys 2t, 2t + 1 of n8 block nb.
__device__ __forceinline__ float2 lane_key_factor_pair(const float* factors, int nb, int t) {
  return *reinterpret_cast<const float2*>(factors + 16 * (nb >> 1) + 4 * t + 2 * (nb & 1));
}
constexpr bool lane_factor_slots_follow_the_permutation() {
  for (int b2 = 0; b2 < kKeyTile / 16; ++b2)
    for (int t = 0; t < 4; ++t)
      for (int e = 0; e < 4; ++e)
        if (layout::permuted_position(16 * b2 + 8 * (e >> 1) + 2 * t + (e & 1)) != 16 * b2 + 4 * t + e) return false;
  for (int g = 0; g < kKeyTile / tiling::kScaleBlock; ++g)
    if (layout::permuted_position(g * tiling::kScaleBlock) != g * tiling::kScaleBlock) return false;
  for (int key = 0; key < 32; ++key)  // what the producer's lane_slot relies on: period 32
    if (layout::permuted_position(32 + key) != 32 + layout::permuted_position(key)) return false;
  return true;
}
static_assert(lane_factor_slots_follow_the_permutation(), "the consumers' loads read the permuted order");

// One key tile's codes and scales (1024-byte aligned for the 128-byte swizzle).
template <int D>
struct alignas(1024) DqKeyStage {
  uint8_t k[kKeyTile * D];   // rows form (B of S)
  uint8_t v[kKeyTile * D];   // rows form (B of E)
  uint8_t kt[D * kKeyTile];  // transposed form, keys permuted (B of dQ)
  float k_pow[kKeyTile];     // 2^ek_j, at layout::permuted_position(j)
  float v_pow[kKeyTile];     // 2^ev_j, the same
};
// One work item, what the producer finds and hands the consumers with its rows.
struct DqWork {
  DocumentSpan d;
  int doc, q0, head, kvh;
  int tiles;  // key tiles 0 .. tiles-1, from the document start; 0: no more items
};
// An item with the per-row constants of its 128 rows (rows past the document end: its last row's).
struct DqRowInfo {
  DqWork work;
  uint8_t q_scale[kQueryRows], g_scale[kQueryRows];
  float lse[kQueryRows], delta[kQueryRows];
};
template <int D>
struct DqShared {
  alignas(1024) uint8_t q[kRowBuffers][kQueryRows * D];  // rows form (A of S)
  alignas(1024) uint8_t g[kRowBuffers][kQueryRows * D];  // rows form (A of E)
  DqKeyStage<D> stage[kStages];
  DqRowInfo info[kRowBuffers];
  StageRing<kStages> ring;            // key tiles, use i = the CTA's i-th over all its items
  StageRing<kRowBuffers> rows_ring;   // Q and dO rows, use n = the CTA's n-th item
};
template <int D>
constexpr size_t kDqSharedBytes = sizeof(DqShared<D>) + 1024;  // + the alignment of the dynamic base
static_assert(kDqSharedBytes<128> <= 227 * 1024, "a CTA must fit in shared memory");

struct DqArgs {
  BackwardParams p;
  CUtensorMap q_map, g_map;        // rows form, box kQueryRows
  CUtensorMap k_map[2], v_map[2];  // rows form, box kKeyTile; [1]: the interior codes
  CUtensorMap kt_map[2];           // transposed form, box kKeyTile; [1]: the interior codes
};

// The codes key tile i reads: 1, the interior codes, or 0. kInteriorCodes: the kernel instance for
// prefix isolation's interior codes (kernel_problem.h), which exist only where causal; then the
// item's last tile is its diagonal one, tile i lies tiles - 1 - i frontier tiles before its rows
// (core/tiling.h), and its pairs are interior from kFrontierTiles back. (An instance, as in the
// forward; and the interior test itself, per tile, made the 24-register producer spill.)
static_assert(kKeyTile == tiling::kFrontierTile && kQueryRows == tiling::kFrontierTile,
              "an item's rows and each key tile are one frontier tile");
template <bool kInteriorCodes>
__device__ __forceinline__ int tile_codes(const DqWork& w, int i) {
  return kInteriorCodes && i + tiling::kFrontierTiles < w.tiles;
}

// Per-row constants of the U computation.
struct DqRows {
  float q_factor[2];  // 2^eq_i scale log2(e)
  float g_pow[2];     // 2^eg_i
  float lse2[2];      // LSE_i log2(e)
  float delta[2];     // D_i
};

// The keys a thread's two rows see: row r those before end[r] (document positions; none past the
// document end).
struct VisibleKeys {
  int end[2];
  __device__ static VisibleKeys of(const int (&rows)[2], const DocumentSpan& d, bool causal) {
    VisibleKeys v;
    for (int r = 0; r < 2; ++r) v.end[r] = rows[r] >= d.len ? 0 : causal ? rows[r] + 1 : d.len;
    return v;
  }
};

// A masked tile (keys some row must not see; the tile's first key k0): the interior tile's
// arithmetic (below) on visible pairs, U = 0 elsewhere, with the NaN-propagating row max. s becomes
// U_ij 2^ek_j, amax its row max of |.|.
template <int D>
__device__ __forceinline__ void masked_u(float (&s)[kKeyTile / 2], const float (&e)[kKeyTile / 2], const DqKeyStage<D>& st,
                                         const DqRows& rw, const VisibleKeys& visible, int k0, int t,
                                         float (&amax)[2]) {
  const float neg_lse2[2] = {-rw.lse2[0], -rw.lse2[1]};
#pragma unroll
  for (int nb = 0; nb < kKeyTile / 8; ++nb) {
    const float2 kp = lane_key_factor_pair(st.k_pow, nb, t), vp = lane_key_factor_pair(st.v_pow, nb, t);
#pragma unroll
    for (int el = 0; el < 4; ++el) {
      const int r = el >> 1, x = nb * 4 + el, key = k0 + nb * 8 + 2 * t + (el & 1);
      const float k_pow = (el & 1) ? kp.y : kp.x, v_pow = (el & 1) ? vp.y : vp.x;
      const float pij = exp2_ftz(fmaf(s[x] * k_pow, rw.q_factor[r], neg_lse2[r]));
      const float w = pij * (e[x] * v_pow * rw.g_pow[r] - rw.delta[r]) * k_pow;
      s[x] = key < visible.end[r] ? w : 0.f;
      amax[r] = nan_max(amax[r], fabsf(s[x]));
    }
  }
}

// An interior tile (every key visible to every row): the same numbers with fewer instructions per
// element, which bound the kernel: no mask; the exponent s 2^ek q_factor - lse2 as one fused
// multiply-add (one rounding instead of two); 2^x on the MUFU unit with subnormal results flushed
// (p < 2^-126 moves dQ by less than 2^-126 |E - D| 2^ek, nothing next to the tiles that hold the
// row's probability mass, which sums to 1); fmaxf for the row max (a NaN U element still makes
// its E4M3 code, and so the row's dQ, NaN).
template <int D>
__device__ __forceinline__ void interior_u(float (&s)[kKeyTile / 2], const float (&e)[kKeyTile / 2],
                                           const DqKeyStage<D>& st, const DqRows& rw, int t, float (&amax)[2]) {
  const float neg_lse2[2] = {-rw.lse2[0], -rw.lse2[1]};
  // Two partial maxima per row (exact in any order): shorter dependency chains.
  float part_max[2][2] = {{amax[0], amax[0]}, {amax[1], amax[1]}};
#pragma unroll
  for (int b2 = 0; b2 < kKeyTile / 16; ++b2) {
    const float4 kp = lane_key_factors(st.k_pow, b2, t), vp = lane_key_factors(st.v_pow, b2, t);  // blocks 2 b2, +1
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int el = 0; el < 4; ++el) {
        const int r = el >> 1, x = (2 * b2 + h) * 4 + el;
        const float k_pow = h ? ((el & 1) ? kp.w : kp.z) : ((el & 1) ? kp.y : kp.x);
        const float v_pow = h ? ((el & 1) ? vp.w : vp.z) : ((el & 1) ? vp.y : vp.x);
        const float pij = exp2_ftz(fmaf(s[x] * k_pow, rw.q_factor[r], neg_lse2[r]));
        const float w = pij * (e[x] * v_pow * rw.g_pow[r] - rw.delta[r]) * k_pow;
        s[x] = w;
        part_max[r][h] = fmaxf(part_max[r][h], fabsf(w));
      }
  }
  for (int r = 0; r < 2; ++r) amax[r] = fmaxf(part_max[r][0], part_max[r][1]);
}

// The interior tile when every 32-key group shares its K and V scales (block32 geometry): the same
// numbers as interior_u with two multiplies per element fewer. The exponent is
// fmaf(S, 2^ek_g q_factor_i, -lse2) (2^ek_g q_factor_i is exact, so the one rounding is
// interior_u's), and E 2^ev 2^eg - D is fmaf(E, 2^(ev_g + eg_i), -D) (E 2^ev 2^eg is exact, so
// again one rounding of the same value): bitwise interior_u's U except where those products of
// powers of two leave the float range (scales near 2^+-126).
template <int D>
__device__ __forceinline__ void interior_u_grouped(float (&s)[kKeyTile / 2], const float (&e)[kKeyTile / 2],
                                                   const DqKeyStage<D>& st, const DqRows& rw, float (&amax)[2]) {
  constexpr int kGroups = kKeyTile / tiling::kScaleBlock, kBlocksPerGroup = kKeyTile / 8 / kGroups;
  const float neg_lse2[2] = {-rw.lse2[0], -rw.lse2[1]};
  float part_max[2][2] = {{amax[0], amax[0]}, {amax[1], amax[1]}};
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const float k_pow = st.k_pow[layout::permuted_position(g * tiling::kScaleBlock)];
    const float v_pow = st.v_pow[layout::permuted_position(g * tiling::kScaleBlock)];
    const float exponent_factor[2] = {k_pow * rw.q_factor[0], k_pow * rw.q_factor[1]};
    const float e_factor[2] = {v_pow * rw.g_pow[0], v_pow * rw.g_pow[1]};
#pragma unroll
    for (int nb = g * kBlocksPerGroup; nb < (g + 1) * kBlocksPerGroup; ++nb)
#pragma unroll
      for (int el = 0; el < 4; ++el) {
        const int r = el >> 1, x = nb * 4 + el;
        const float pij = exp2_ftz(fmaf(s[x], exponent_factor[r], neg_lse2[r]));
        const float w = pij * fmaf(e[x], e_factor[r], -rw.delta[r]) * k_pow;
        s[x] = w;
        part_max[r][nb & 1] = fmaxf(part_max[r][nb & 1], fabsf(w));
      }
  }
  for (int r = 0; r < 2; ++r) amax[r] = fmaxf(part_max[r][0], part_max[r][1]);
}

// --- producer ----------------------------------------------------------------------------------
// An item's key tiles, the ring's uses key_uses.. on, by tile streamer kStreamer (work_items.cuh):
// wait for an empty stage, TMA its K, V and K^T codes (streamer 0's lane 0), store the streamer's
// share of its keys' scale factors (the next tile's bytes are loaded meanwhile) and arrive on
// "full". Keys past the document end load the next document's codes, transposed slots the quantizer
// zeroed, or TMA's zeros past the tensor: finite E4M3 codes (docs/KERNELS.md, "Loads") that meet an
// exact-zero U in dQ = U.K, and columns of S and E that the masked path drops.
template <int D, int kStreamer, bool kInteriorCodes>
__device__ __forceinline__ void produce_key_tiles(const DqArgs& args, const DqWork& w, int key_uses, DqShared<D>& sm) {
  using Share = StreamerShare<kStreamer, LaneScaleBytes<kKeyTile>::kKeysPerLane>;
  const BackwardParams& p = args.p;
  const int lane = int(threadIdx.x) % 32;
  const int kt_doc_start = int(layout::transposed_document_start(w.d.begin, w.doc));
  auto load_scales = [&](int i) {
    // One shift for both (a pointer each per tile made the 24-register producer spill).
    const int64_t shift = tile_codes<kInteriorCodes>(w, i) * p.interior_scales_shift;
    return load_lane_scale_bytes<kKeyTile, Share::kFirst, Share::kCount>(p.k_scales + shift, p.v_scales + shift,
                                                                         p.kv_heads, w.kvh, w.d.begin, w.d.len,
                                                                         i * kKeyTile, lane);
  };
  LaneScaleBytes<kKeyTile> next = load_scales(0);
  // The lane's keys j * 32 + lane go to slots j * 32 + lane_slot (the permutation has a period of 32
  // keys and maps the warp's 32 lanes onto 32 distinct words: no bank conflict).
  const int lane_slot = layout::permuted_position(lane);
  for (int i = 0; i < w.tiles; ++i) {
    const int k0 = i * kKeyTile, use = key_uses + i;
    DqKeyStage<D>& st = sm.stage[sm.ring.stage(use)];
    const LaneScaleBytes<kKeyTile> bytes = next;
    sm.ring.wait_empty(use);
    if (kStreamer == 0 && lane == 0) {
      uint64_t& full = sm.ring.full_barrier(use);
      const int codes = tile_codes<kInteriorCodes>(w, i);
      barrier_expect_bytes(full, 3 * kKeyTile * D);
      tma_load_rows(args.k_map[codes], st.k, full, w.kvh, w.d.begin + k0);
      tma_load_rows(args.v_map[codes], st.v, full, w.kvh, w.d.begin + k0);
      tma_load_transposed(args.kt_map[codes], st.kt, full, w.kvh, D, kt_doc_start + k0);
    }
    if (i + 1 < w.tiles) next = load_scales(i + 1);
#pragma unroll
    for (int j = Share::kFirst; j < Share::kFirst + Share::kCount; ++j) {
      const int slot = j * 32 + lane_slot;  // layout::permuted_position(j * 32 + lane)
      st.k_pow[slot] = pow2_of_scale(bytes.k_byte(j));
      st.v_pow[slot] = pow2_of_scale(bytes.v_byte(j));
    }
    sm.ring.arrive_full(use);
  }
}

// The per-row constants of an item (lane = row mod 32), so that the consumers start an item
// without a global load.
__device__ __forceinline__ void store_row_constants(const BackwardParams& p, const DqWork& w, int lane,
                                                    DqRowInfo& info) {
#pragma unroll
  for (int j = 0; j < kQueryRows / 32; ++j) {
    const int row = j * 32 + lane;
    const int64_t token = w.d.begin + min(w.q0 + row, w.d.len - 1);
    const int64_t s = token * p.q_heads + w.head;
    info.q_scale[row] = __ldg(p.q_scales + s);
    info.g_scale[row] = __ldg(p.g_scales + s);
    info.lse[row] = __ldg(p.lse + int64_t(w.head) * p.total_tokens + token);
    info.delta[row] = p.delta[int64_t(w.head) * p.total_tokens + token];  // from dO's quantizer
  }
}

// Three warps over the CTA's items (work_items.cuh): warp 1 publishes each item, its DqWork and row
// constants into row buffer n % 2 with its Q and dO rows; the tile streamers (warps 0 and 2) stream
// the published item's key tiles. Apart, finding the next item and loading its constants (dependent
// global loads) overlap the key tiles (one warp did both: on short documents the consumers waited
// for it, 35% of dQ's stall samples on tiny-unaligned).
constexpr int kProducerWarps = kStreamerRoleWarps;
template <int D, bool kInteriorCodes>
__device__ __forceinline__ void produce(const DqArgs& args, DqShared<D>& sm) {
  const bool streamed = run_as_tile_streamer([&](auto streamer) {
    stream_work_items<DqWork>(sm.rows_ring, sm.info, [&](const DqWork& w, int, int key_uses) {
      produce_key_tiles<D, decltype(streamer)::value, kInteriorCodes>(args, w, key_uses, sm);
    });
  });
  if (streamed) return;
  const BackwardParams& p = args.p;
  const int lane = int(threadIdx.x) % 32;
  static_assert(kQueryRows == order::kWorkTile, "an item's rows are one tile of the work order");
  const int tiles = __ldg(p.work_order_tiles);
  publish_work_items<DqWork>(
      p.work_counter, tiles * p.q_heads, sm.rows_ring, sm.info,
      [&](int item, DqWork& w) {
        QueryTileItem it;
        if (!find_query_tile_item(p, item, tiles, it)) return false;
        w.d = it.span;
        w.doc = it.doc;
        w.q0 = it.q0;
        w.head = it.head;
        w.kvh = it.kvh;
        w.tiles = it.key_tiles(p.causal, kQueryRows, kKeyTile);
        return true;
      },
      [&](const DqWork& w, int n) {
        const int b = sm.rows_ring.stage(n);
        if (lane == 0) {
          uint64_t& full = sm.rows_ring.full_barrier(n);
          barrier_expect_bytes(full, 2 * kQueryRows * D);
          tma_load_rows(args.q_map, sm.q[b], full, w.head, w.d.begin + w.q0);
          tma_load_rows(args.g_map, sm.g[b], full, w.head, w.d.begin + w.q0);
        }
        store_row_constants(p, w, lane, sm.info[b]);
      });
}

// --- consumers ---------------------------------------------------------------------------------
// A warpgroup of 64 query rows of one item (rows buffer b, key tiles at the ring's uses key_uses..);
// per key tile: S and E, U (into s), sigma, dQ_tile = U~.K, then the stage is released and dQ_tile
// added at 2^sigma.
template <int D, bool kTurns, bool kInteriorCodes>
__device__ __forceinline__ void consume(const DqArgs& args, const DqWork& w, int b, int key_uses, DqShared<D>& sm,
                                        const ConsumerTurns<kTurns>& turns) {
  const BackwardParams& p = args.p;
  const DocumentSpan& d = w.d;
  const DqRowInfo& info = sm.info[b];
  const auto [consumer, warp, lane, g, t] = consumer_thread();
  const int h = w.head;
  const int tile_rows[2] = {warp * 16 + g, warp * 16 + g + 8};  // of the item's 128
  const int rows[2] = {w.q0 + tile_rows[0], w.q0 + tile_rows[1]};
  const float scale_log2e = p.softmax_scale * kLog2e;
  DqRows rw;
  for (int r = 0; r < 2; ++r) {
    rw.q_factor[r] = pow2_of_scale(info.q_scale[tile_rows[r]]) * scale_log2e;
    rw.g_pow[r] = pow2_of_scale(info.g_scale[tile_rows[r]]);
    rw.lse2[r] = info.lse[tile_rows[r]] * kLog2e;
    rw.delta[r] = info.delta[tile_rows[r]];
  }
  constexpr SmemLayout kRowsLayout = kSwizzleFor<D>, kKtLayout = kSwizzleFor<kKeyTile>;
  const uint8_t* q_rows = sm.q[b] + consumer * kWarpgroupRows * D;
  const uint8_t* g_rows = sm.g[b] + consumer * kWarpgroupRows * D;

  // With kTurns, each of a step's two issues is a turn (tma.cuh).
  float dq_acc[D / 2];
  zero(dq_acc);
  // Step i; kMaybeMasked: only the item's last tile can be masked (the diagonal one, causal, or the
  // document's last), every tile before it lies inside the document and, causal, before the item's
  // first row, so the loop over those runs the interior arithmetic alone.
  auto step = [&](int i, auto maybe_masked) {
    constexpr bool kMaybeMasked = decltype(maybe_masked)::value;
    const int k0 = i * kKeyTile, use = key_uses + i;
    const DqKeyStage<D>& st = sm.stage[sm.ring.stage(use)];
    sm.ring.wait_full(use);

    // S = Q . K^T and E = dO . V^T: 64 queries x 128 keys each, D/32 k-steps.
    float s[kKeyTile / 2], e[kKeyTile / 2];
    score_products<D, kKeyTile, kRowsLayout>(s, q_rows, st.k, e, g_rows, st.v, turns);

    // In place: s becomes U 2^ek (dQ's operand before sigma). Interior: every key visible to every
    // row (inside the document and, causal, at or before the CTA's first row; rows past the
    // document end compute values that are never stored, and rows do not mix in dQ = U.K).
    float amax[2] = {0.f, 0.f};
    const bool interior =
        !kMaybeMasked || (k0 + kKeyTile <= d.len && (!p.causal || k0 + kKeyTile - 1 <= w.q0));
    if (interior) {  // with kInteriorCodes, grouped where the tile reads the interior codes
      if (kInteriorCodes ? tile_codes<true>(w, i) == 1 : p.group_scales) interior_u_grouped(s, e, st, rw, amax);
      else interior_u(s, e, st, rw, t, amax);
    } else {
      masked_u(s, e, st, rw, VisibleKeys::of(rows, d, p.causal), k0, t, amax);
    }
    const RowScales sigma = ceil_row_scales(amax);
    uint32_t ua[kKeyTile / 32][4];
    pack_a_operand_scaled<kKeyTile>(s, sigma.inv, ua);

    // dQ_tile = U~ . K codes (B: K transposed, keys permuted).
    float dq_tile[D / 2];
    zero(dq_tile);
    turns.begin();
    wgmma_fence();
    register_product<D, kKeyTile, kKtLayout>(dq_tile, ua, st.kt);
    wgmma_commit();
    turns.end();
    wgmma_wait<0>();
    fence_accumulators(dq_tile);
    if (lane == 0) sm.ring.arrive_empty(use);  // this warp is done with the tile
    add_scaled_rows(dq_acc, dq_tile, sigma.pow);
  };
  for (int i = 0; i + 1 < w.tiles; ++i) step(i, std::false_type{});
  step(w.tiles - 1, std::true_type{});  // an item has at least one tile

  auto* dq = static_cast<__nv_bfloat16*>(p.dq);
  for (int r = 0; r < 2; ++r) {
    const bool in_doc = rows[r] < d.len;
    const int64_t token = d.begin + (in_doc ? rows[r] : 0);
    store_row_bf16(dq_acc, r, p.softmax_scale, dq + token * p.dq_stride_token + h * p.dq_stride_head, t, in_doc);
  }
}

template <int D, bool kTurns, bool kInteriorCodes>
__global__ void __launch_bounds__(kThreads, 1) backward_dq_kernel(const __grid_constant__ DqArgs args) {
  DqShared<D>& sm = aligned_shared_storage<DqShared<D>>();
  run_roles<kProducerRegisters, kConsumerRegisters, kProducerWarps>(
      [&] {
        sm.ring.init(kStreamerLanes, kConsumerWarps);
        sm.rows_ring.init(kProducerLanes, kConsumerWarps);
      },
      [&] { produce<D, kInteriorCodes>(args, sm); },
      [&] {
        const ConsumerTurns<kTurns> turns{consumer_thread().consumer};
        turns.open();
        consume_work_items<DqWork>(sm.rows_ring, sm.info, [&](const DqWork& w, int n, int key_uses) {
          consume<D, kTurns, kInteriorCodes>(args, w, sm.rows_ring.stage(n), key_uses, sm, turns);
        });
        turns.close();
      });
}

}  // namespace

int launch_backward_dq(const BackwardParams& p, void* stream) {
  return for_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    DqArgs args{};
    args.p = p;
    cudaError_t e = rows_form_map(args.q_map, p.q_codes, p.total_tokens, p.q_heads, D, kQueryRows);
    if (e == cudaSuccess) e = rows_form_map(args.g_map, p.g_codes, p.total_tokens, p.q_heads, D, kQueryRows);
    if (e == cudaSuccess)
      e = rows_form_maps(args.k_map[0], args.k_map[1], p.k_codes, p.k_interior_codes,
                         p.total_tokens, p.kv_heads, D, kKeyTile);
    if (e == cudaSuccess)
      e = rows_form_maps(args.v_map[0], args.v_map[1], p.v_codes, p.v_interior_codes,
                         p.total_tokens, p.kv_heads, D, kKeyTile);
    if (e == cudaSuccess)
      e = transposed_form_maps(args.kt_map[0], args.kt_map[1], p.k_codes_t, p.k_interior_codes_t,
                               p.t_pitch, p.kv_heads, D, kKeyTile);
    if (e != cudaSuccess) return e;
    const int64_t items = order::table_entries(p.total_tokens, p.num_docs) * p.q_heads;
    const bool turns = consumers_take_turns(p.group_scales || p.interior_codes, p.total_tokens, p.num_docs);
    const auto kernel = p.interior_codes
                            ? (turns ? backward_dq_kernel<D, true, true> : backward_dq_kernel<D, false, true>)
                            : (turns ? backward_dq_kernel<D, true, false> : backward_dq_kernel<D, false, false>);
    return launch_persistent(kernel, args, kDqSharedBytes<D>, kThreads, items, p.work_counter,
                             static_cast<cudaStream_t>(stream));
  });
}

}  // namespace flamia::cuda::sm90
