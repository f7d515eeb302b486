// Backward pass 3: dQ. One CTA per (document tile slot of 128 queries, query head) owns those rows'
// dQ and walks the 128-key tiles (counted from the document start, tiling::kBwdKeyTile) that its
// rows see. Per key tile:
//   S = Q codes . K codes^T,  p_ij = 2^(S_ij 2^(eq_i + ek_j) scale log2(e) - LSE_i log2(e))
//   E = dO codes . V codes^T, E_ij = E_ij 2^(eg_i + ev_j),  U_ij = p_ij (E_ij - D_i)
//   dQ_i += 2^sigma_i sum_j E4M3(U_ij 2^(ek_j - sigma_i)) ck_j,  sigma_i: ceil scale of max_j |U_ij 2^ek_j|
// one sigma per (row, key tile), as the emulation defines it; dQ is scaled by the softmax scale at
// the end. A row reads only its visible keys, and its sum runs in a fixed order: dQ_i is
// deterministic and, in prefix mode, independent of everything after i.
// Warp-specialized like the forward (forward.cu, tma.cuh): warpgroup 0's producer warp loads the
// CTA's Q and dO rows once and each key tile's K rows, V rows and K^T (the quantizer's transposed
// layout) by TMA into a ring of stages, with the keys' scale factors; warpgroups 1 and 2 (64 rows
// each) compute, each at its own pace.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/operand_layout.h"
#include "core/tiling.h"
#include "cuda/document_span.cuh"
#include "cuda/sm90/accumulator.cuh"
#include "cuda/sm90/backward.h"
#include "cuda/sm90/fp8_math.cuh"
#include "cuda/sm90/key_scales.cuh"
#include "cuda/sm90/launch.cuh"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "formats/scales.h"

namespace flamia::cuda::sm90 {
namespace {

constexpr int kConsumers = 2;                  // consumer warpgroups
constexpr int kThreads = 128 * (1 + kConsumers);  // warpgroup 0 produces
constexpr int kWarpgroupRows = 64;             // the m64 of every product
constexpr int kQueryRows = kWarpgroupRows * kConsumers;  // rows per CTA
constexpr int kKeyTile = tiling::kBwdKeyTile;  // keys per step: sigma's group
constexpr int kStages = 3;
static_assert(kKeyTile == 128, "S is one m64n128 product per k-step");
static_assert(kKeyTile % kQueryRows == 0, "a CTA's rows share their diagonal key tile");
// Registers per thread after the hand-over: 128 x 24 + 256 x 240 = 64512 of the SM's 65536 (the
// consumers hold S, E and dQ: 232 spilled).
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
constexpr int kProducerLanes = 32;

// One key tile's codes and scales (1024-byte aligned for the 128-byte swizzle).
template <int D>
struct alignas(1024) DqKeyStage {
  uint8_t k[kKeyTile * D];   // rows form (B of S)
  uint8_t v[kKeyTile * D];   // rows form (B of E)
  uint8_t kt[D * kKeyTile];  // transposed form, keys permuted (B of dQ)
  float k_pow[kKeyTile];     // 2^ek_j
  float v_pow[kKeyTile];     // 2^ev_j
};
template <int D>
struct DqShared {
  alignas(1024) uint8_t q[kQueryRows * D];  // rows form (A of S)
  alignas(1024) uint8_t g[kQueryRows * D];  // rows form (A of E)
  DqKeyStage<D> stage[kStages];
  StageRing<kStages> ring;
  uint64_t rows_full;  // Q and dO rows landed
};
template <int D>
constexpr size_t kDqSharedBytes = sizeof(DqShared<D>) + 1024;  // + the alignment of the dynamic base
static_assert(kDqSharedBytes<128> <= 227 * 1024, "a CTA must fit in shared memory");

struct DqArgs {
  BackwardParams p;
  CUtensorMap q_map, g_map;  // rows form, box kQueryRows
  CUtensorMap k_map, v_map;  // rows form, box kKeyTile
  CUtensorMap kt_map;        // transposed form, box kKeyTile
};

// Per-row constants of the U computation.
struct DqRows {
  float q_factor[2];  // 2^eq_i scale log2(e)
  float g_pow[2];     // 2^eg_i
  float lse2[2];      // LSE_i log2(e)
  float delta[2];     // D_i
};

// A masked tile (keys some row must not see): the interior tile's arithmetic (below) on visible
// pairs, U = 0 elsewhere, with the NaN-propagating row max. s becomes U_ij 2^ek_j, amax its row
// max of |.|.
template <int D>
__device__ __forceinline__ void masked_u(float (&s)[kKeyTile / 2], const float (&e)[kKeyTile / 2], const DqKeyStage<D>& st,
                                         const DqRows& rw, const int (&rows)[2], const DocumentSpan& d, int k0,
                                         bool causal, int t, float (&amax)[2]) {
  const float neg_lse2[2] = {-rw.lse2[0], -rw.lse2[1]};
  int key_end[2];  // row r sees the keys before key_end[r] (document positions)
  for (int r = 0; r < 2; ++r) key_end[r] = rows[r] >= d.len ? 0 : causal ? rows[r] + 1 : d.len;
#pragma unroll
  for (int nb = 0; nb < kKeyTile / 8; ++nb) {
    const float2 kp = *reinterpret_cast<const float2*>(st.k_pow + nb * 8 + 2 * t);
    const float2 vp = *reinterpret_cast<const float2*>(st.v_pow + nb * 8 + 2 * t);
#pragma unroll
    for (int el = 0; el < 4; ++el) {
      const int r = el >> 1, x = nb * 4 + el, key = k0 + nb * 8 + 2 * t + (el & 1);
      const float k_pow = (el & 1) ? kp.y : kp.x, v_pow = (el & 1) ? vp.y : vp.x;
      const float pij = exp2_ftz(fmaf(s[x] * k_pow, rw.q_factor[r], neg_lse2[r]));
      const float w = pij * (e[x] * v_pow * rw.g_pow[r] - rw.delta[r]) * k_pow;
      s[x] = key < key_end[r] ? w : 0.f;
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
  for (int nb = 0; nb < kKeyTile / 8; ++nb) {
    const float2 kp = *reinterpret_cast<const float2*>(st.k_pow + nb * 8 + 2 * t);
    const float2 vp = *reinterpret_cast<const float2*>(st.v_pow + nb * 8 + 2 * t);
#pragma unroll
    for (int el = 0; el < 4; ++el) {
      const int r = el >> 1, x = nb * 4 + el;
      const float k_pow = (el & 1) ? kp.y : kp.x, v_pow = (el & 1) ? vp.y : vp.x;
      const float pij = exp2_ftz(fmaf(s[x] * k_pow, rw.q_factor[r], neg_lse2[r]));
      const float w = pij * (e[x] * v_pow * rw.g_pow[r] - rw.delta[r]) * k_pow;
      s[x] = w;
      part_max[r][nb & 1] = fmaxf(part_max[r][nb & 1], fabsf(w));
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
    const float k_pow = st.k_pow[g * tiling::kScaleBlock], v_pow = st.v_pow[g * tiling::kScaleBlock];
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

// What both the producer and the consumers know about the CTA's work.
struct DqWork {
  DocumentSpan d;
  int doc, q0, kvh;
  int tiles;  // key tiles 0 .. tiles-1, from the document start
};

// --- producer ----------------------------------------------------------------------------------
// One warp: the Q and dO rows once, then per key tile: wait for an empty stage, TMA its K, V and
// K^T codes (lane 0), store its keys' scale factors (the next tile's bytes are loaded meanwhile)
// and arrive on "full". Keys past the document end load the next document's codes, transposed
// slots the quantizer zeroed, or TMA's zeros past the tensor: finite E4M3 codes (docs/KERNELS.md,
// "Loads") that meet an exact-zero U in dQ = U.K, and columns of S and E that the masked path drops.
template <int D>
__device__ __forceinline__ void produce(const DqArgs& args, const DqWork& w, DqShared<D>& sm) {
  const BackwardParams& p = args.p;
  const int lane = int(threadIdx.x) % 32, h = blockIdx.y;
  if (lane == 0) {
    barrier_expect_bytes(sm.rows_full, 2 * kQueryRows * D);
    tma_load_rows(args.q_map, sm.q, sm.rows_full, h, w.d.begin + w.q0);
    tma_load_rows(args.g_map, sm.g, sm.rows_full, h, w.d.begin + w.q0);
    barrier_arrive(sm.rows_full);
  }
  const int kt_doc_start = int(layout::transposed_document_start(w.d.begin, w.doc));
  auto load_scales = [&](int i) {
    return load_lane_scale_bytes<kKeyTile>(p.k_scales, p.v_scales, p.kv_heads, w.kvh, w.d.begin, w.d.len,
                                           i * kKeyTile, lane);
  };
  LaneScaleBytes<kKeyTile> next = load_scales(0);
  for (int i = 0; i < w.tiles; ++i) {
    const int k0 = i * kKeyTile;
    DqKeyStage<D>& st = sm.stage[sm.ring.stage(i)];
    const LaneScaleBytes<kKeyTile> bytes = next;
    sm.ring.wait_empty(i);
    if (lane == 0) {
      uint64_t& full = sm.ring.full_barrier(i);
      barrier_expect_bytes(full, 3 * kKeyTile * D);
      tma_load_rows(args.k_map, st.k, full, w.kvh, w.d.begin + k0);
      tma_load_rows(args.v_map, st.v, full, w.kvh, w.d.begin + k0);
      tma_load_transposed(args.kt_map, st.kt, full, w.kvh, D, kt_doc_start + k0);
    }
    if (i + 1 < w.tiles) next = load_scales(i + 1);
#pragma unroll
    for (int j = 0; j < LaneScaleBytes<kKeyTile>::kKeysPerLane; ++j) {
      st.k_pow[j * 32 + lane] = pow2_of_scale(bytes.k_byte(j));
      st.v_pow[j * 32 + lane] = pow2_of_scale(bytes.v_byte(j));
    }
    sm.ring.arrive_full(i);
  }
}

// --- consumers ---------------------------------------------------------------------------------
// A warpgroup of 64 query rows; per key tile: S and E, U (into s), sigma, dQ_tile = U~.K, then
// the stage is released and dQ_tile added at 2^sigma.
template <int D>
__device__ __forceinline__ void consume(const DqArgs& args, const DqWork& w, DqShared<D>& sm) {
  const BackwardParams& p = args.p;
  const DocumentSpan& d = w.d;
  const auto [consumer, warp, lane, g, t] = consumer_thread();
  const int h = blockIdx.y;
  const int rows[2] = {w.q0 + warp * 16 + g, w.q0 + warp * 16 + g + 8};
  const float scale_log2e = p.softmax_scale * kLog2e;
  DqRows rw;
  for (int r = 0; r < 2; ++r) {
    const int64_t token = d.begin + min(rows[r], d.len - 1);
    const int64_t s = token * p.q_heads + h;
    rw.q_factor[r] = pow2_of_scale(p.q_scales[s]) * scale_log2e;
    rw.g_pow[r] = pow2_of_scale(p.g_scales[s]);
    rw.lse2[r] = p.lse[int64_t(h) * p.total_tokens + token] * kLog2e;
    rw.delta[r] = p.delta[int64_t(h) * p.total_tokens + token];
  }
  constexpr SmemLayout kRowsLayout = kSwizzleFor<D>, kKtLayout = kSwizzleFor<kKeyTile>;
  const uint8_t* q_rows = sm.q + consumer * kWarpgroupRows * D;
  const uint8_t* g_rows = sm.g + consumer * kWarpgroupRows * D;

  float dq_acc[D / 2];
  zero(dq_acc);
  barrier_wait(sm.rows_full, 0);
  for (int i = 0; i < w.tiles; ++i) {
    const int k0 = i * kKeyTile;
    const DqKeyStage<D>& st = sm.stage[sm.ring.stage(i)];
    sm.ring.wait_full(i);

    // S = Q . K^T and E = dO . V^T: 64 queries x 128 keys each, D/32 k-steps.
    float s[kKeyTile / 2], e[kKeyTile / 2];
    wgmma_fence();
    rows_product<D, kKeyTile, kRowsLayout>(s, q_rows, st.k);
    rows_product<D, kKeyTile, kRowsLayout>(e, g_rows, st.v);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(s);
    fence_accumulators(e);

    // In place: s becomes U 2^ek (dQ's operand before sigma). Interior: every key visible to every
    // row (inside the document and, causal, at or before the CTA's first row; rows past the
    // document end compute values that are never stored, and rows do not mix in dQ = U.K).
    float amax[2] = {0.f, 0.f};
    const bool interior = k0 + kKeyTile <= d.len && (!p.causal || k0 + kKeyTile - 1 <= w.q0);
    if (interior) {
      if (p.group_scales) interior_u_grouped(s, e, st, rw, amax);
      else interior_u(s, e, st, rw, t, amax);
    } else {
      masked_u(s, e, st, rw, rows, d, k0, p.causal, t, amax);
    }
    const RowScales sigma = ceil_row_scales(amax);
    uint32_t ua[kKeyTile / 32][4];
    pack_a_operand_scaled<kKeyTile>(s, sigma.inv, ua);

    // dQ_tile = U~ . K codes (B: K transposed, keys permuted).
    float dq_tile[D / 2];
    zero(dq_tile);
    wgmma_fence();
    register_product<D, kKeyTile, kKtLayout>(dq_tile, ua, st.kt);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(dq_tile);
    if (lane == 0) sm.ring.arrive_empty(i);  // this warp is done with the tile
    add_scaled_rows(dq_acc, dq_tile, sigma.pow);
  }

  auto* dq = static_cast<__nv_bfloat16*>(p.dq);
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= d.len) continue;
    const int64_t token = d.begin + rows[r];
    store_row_bf16(dq_acc, r, p.softmax_scale, dq + token * p.dq_stride_token + h * p.dq_stride_head, t);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1) backward_dq_kernel(const __grid_constant__ DqArgs args) {
  DqShared<D>& sm = aligned_shared_storage<DqShared<D>>();
  const BackwardParams& p = args.p;

  DocumentTile tile;
  if (!document_tile(p.cu_seqlens, p.num_docs, p.total_tokens, kQueryRows, blockIdx.x, tile)) return;
  DqWork w;
  w.d = tile.span;
  w.doc = tile.doc;
  w.q0 = (tile.tiles - 1 - tile.tile) * kQueryRows;  // later (costlier, causal) tiles launch first
  w.kvh = int(blockIdx.y) / (p.q_heads / p.kv_heads);
  const int last_key = p.causal ? min(w.q0 + kQueryRows, w.d.len) - 1 : w.d.len - 1;
  w.tiles = last_key / kKeyTile + 1;

  run_roles<kProducerRegisters, kConsumerRegisters>(
      [&] {
        sm.ring.init(kProducerLanes, 4 * kConsumers);  // consumers: one arrival per warp
        barrier_init(sm.rows_full, 1);
      },
      [&] { produce(args, w, sm); }, [&] { consume(args, w, sm); });
}

}  // namespace

int launch_backward_dq(const BackwardParams& p, void* stream) {
  return for_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    DqArgs args{};
    args.p = p;
    cudaError_t e = rows_form_map(args.q_map, p.q_codes, p.total_tokens, p.q_heads, D, kQueryRows);
    if (e == cudaSuccess) e = rows_form_map(args.g_map, p.g_codes, p.total_tokens, p.q_heads, D, kQueryRows);
    if (e == cudaSuccess) e = rows_form_map(args.k_map, p.k_codes, p.total_tokens, p.kv_heads, D, kKeyTile);
    if (e == cudaSuccess) e = rows_form_map(args.v_map, p.v_codes, p.total_tokens, p.kv_heads, D, kKeyTile);
    if (e == cudaSuccess) e = transposed_form_map(args.kt_map, p.k_codes_t, p.t_pitch, p.kv_heads, D, kKeyTile);
    if (e != cudaSuccess) return e;
    return launch_over_tile_slots(backward_dq_kernel<D>, args, kDqSharedBytes<D>, kThreads, p.total_tokens,
                                  p.num_docs, kQueryRows, p.q_heads, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace flamia::cuda::sm90
