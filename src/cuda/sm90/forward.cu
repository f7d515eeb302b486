// MXFP8 attention forward on Hopper: FP8 wgmma (m64nNk32 e4m3), one CTA of two warpgroups per
// (document, 128-query tile, query head), the tiles numbered by document tile slots
// (core/document_slots.h); each warpgroup owns 64 of the rows and both share every K and V^T tile
// in shared memory, which halves the L2 traffic of 64-row CTAs (it was 90% of L2 peak). It implements the emulation's numerics as docs/NUMERICS.md states them. Loads are double-buffered cp.async copies: the next key tile's K
// codes, V^T codes (written transposed and key-permuted by the quantizer) and scales are in flight
// while the current tile is computed. TMA, warp specialization and ping-pong softmax come next.
//
// Per key tile (128 keys, from the diagonal tile down, as the emulation):
//   S = (Q codes . K codes) * 2^eq_i * 2^ek_j * scale * log2(e)      scales factored out
//   m' = max(m, visible S);  l = l 2^(m - m') + sum p;  acc *= 2^(m - m')
//   P~ = E4M3(p * 2^ev_j * 2^(boost - rho_i));  acc += P~ . V codes     V fold before rounding
// O = acc * 2^(rho_i - boost) / l,  LSE = (m + log2 l) ln 2.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/operand_layout.h"
#include "core/tiling.h"
#include "cuda/sm90/accumulator.cuh"
#include "cuda/document_span.cuh"
#include "cuda/sm90/forward.h"
#include "cuda/sm90/fp8_math.cuh"
#include "cuda/sm90/launch.cuh"
#include "cuda/sm90/smem_stage.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "formats/scales.h"

namespace flamia::cuda::sm90 {
namespace {

constexpr int kWarpgroups = 2;
constexpr int kWarps = 4 * kWarpgroups;
constexpr int kRowsPerWarp = 16;                     // one m16 MMA row block per warp
constexpr int kWarpgroupRows = 4 * kRowsPerWarp;     // 64: the m64 of every product
constexpr int kQueryRows = kWarps * kRowsPerWarp;    // 128 queries per CTA
constexpr int kKeyTile = tiling::kFwdKeyTile;        // 128 keys per online-softmax step
constexpr int kKeyBlocks = kKeyTile / 8;             // n8 blocks of S per tile
static_assert(kQueryRows == tiling::kFwdQueryTile && tiling::kFwdKeyTile % kQueryRows == 0,
              "a CTA's rows are one forward query tile and share their diagonal key tile");
constexpr int kCtasPerSm = 1;  // 8 warps of up to 255 registers
constexpr int kThreads = kWarps * 32;
static_assert(kThreads >= tiling::kFwdKeyTile, "one thread loads each key's scales");

// One key tile's operands: the double buffer holds two.
template <int D>
struct KeyTileStage {
  uint8_t k[kKeyTile * D];   // rows = keys, K = features
  uint8_t vt[D * kKeyTile];  // rows = features, K = keys (permuted)
  float k_col[kKeyTile];     // 2^ek_j (0 past the document end)
  float v_pow[kKeyTile];     // 2^(ev_j - c): interior tiles' half of the V fold (see forward_kernel)
  uint8_t v_scale[kKeyTile];  // UE8M0 of V_j: masked tiles fold with its exponent
};
template <int D>
struct SharedTiles {
  uint8_t q[kQueryRows * D];
  KeyTileStage<D> stage[2];
};
static_assert(kCtasPerSm * (sizeof(SharedTiles<128>) + 1024) <= 228 * 1024, "the CTAs of an SM must fit in shared memory");

// A key tile's per-key scale bytes, loaded into registers one tile ahead (thread = key; threads
// past the tile load nothing).
struct KeyScales {
  uint8_t k, v;
  bool in_doc;
};
__device__ __forceinline__ KeyScales load_key_scales(const ForwardParams& p, int doc_begin, int len, int kvh, int k0) {
  const int key = k0 + int(threadIdx.x);
  if (threadIdx.x >= kKeyTile || key >= len) return {0, 0, false};
  const size_t s = size_t(doc_begin + key) * p.kv_heads + kvh;
  return {p.k_scales[s], p.v_scales[s], true};
}
template <int D>
__device__ __forceinline__ void store_key_scales(const KeyScales& ks, int c_exp, KeyTileStage<D>& st) {
  const int key = int(threadIdx.x);
  if (key >= kKeyTile) return;
  const int v_exp = ks.in_doc ? scale_exponent(ks.v) : 0;
  st.k_col[key] = ks.in_doc ? pow2_of_scale(ks.k) : 0.f;
  st.v_scale[key] = ks.v;
  st.v_pow[key] = c_exp == kNaNExponent ? pow2i(kNaNExponent) : pow2i(add_exponents(v_exp, -c_exp));
}

// Starts the cp.async copies of key tile k0's K codes (rows form) and V^T codes (from the
// transposed layout, keys already permuted); keys past the document end are zero-filled.
template <int D>
__device__ __forceinline__ void copy_key_tile_async(const ForwardParams& p, int doc_begin, int64_t vt_doc_row, int len,
                                                    int kvh, int k0, KeyTileStage<D>& st) {
  const int64_t kv_pitch = int64_t(p.kv_heads) * D;
  copy_tile_async<kKeyTile, D, kThreads>(p.k_codes + (int64_t(doc_begin + k0) * p.kv_heads + kvh) * D, kv_pitch,
                                         len - k0, D, st.k);
  copy_tile_async<D, kKeyTile, kThreads>(p.v_codes_t + vt_doc_row + k0, p.vt_pitch, D, len - k0, st.vt);
}

// The online-softmax update of a tile with row maxima tile_max (already over the quad): new
// running max, l and O rescaled by 2^(m - m'). A warp skips the O rescale when none of its rows'
// max moved (alpha = 1 exactly), the common case once the max has settled.
template <int N>
__device__ __forceinline__ void update_running_max(const float (&tile_max)[2], float (&m)[2], float (&l)[2],
                                                   float (&o_acc)[N]) {
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = nan_max(m[r], tile_max[r]);
    // A row with nothing visible yet keeps m = -inf; its p are all 0.
    alpha[r] = m[r] == -INFINITY ? (m_new == -INFINITY ? 1.f : 0.f) : exp2f(m[r] - m_new);
    l[r] *= alpha[r];
    m[r] = m_new;
  }
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) scale_rows(o_acc, alpha);
}

// Both tile paths take 2^x as exp2_ftz: a p below 2^-126, times a fold factor of at most 2^boost,
// is far below E4M3's smallest subnormal (2^-9), and against l >= 1 (the row max contributes 1) it
// is lost in the FP32 sum anyway, so flushing it to 0 changes nothing that is kept.

// A masked tile (it holds keys some row must not see: the diagonal tile, a document's last),
// element by element as the emulation states it: s = S 2^eq_i 2^ek_j scale log2(e) on visible keys,
// -inf elsewhere; p = 2^(s - m); l sums unrounded p; P~ = E4M3(p 2^(ev_j + fold_bias_i)) packed as
// P.V's A operand. Masked keys contribute an exact 0, even when their V scale is NaN.
template <int D>
__device__ __forceinline__ void masked_tile(float (&s)[kKeyTile / 2], const KeyTileStage<D>& st,
                                            const float (&q_factor)[2], const int (&fold_bias)[2], int k0, int len,
                                            bool causal, const int (&rows)[2], const bool (&row_valid)[2], int t,
                                            float (&m)[2], float (&l)[2], float (&o_acc)[D / 2],
                                            uint32_t (&pa)[kKeyTile / 32][4]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nb = 0; nb < kKeyBlocks; ++nb) {
    const float2 kc = *reinterpret_cast<const float2*>(st.k_col + nb * 8 + 2 * t);  // keys 2t, 2t + 1
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, kpos = k0 + nb * 8 + 2 * t + (e & 1);
      const bool visible = row_valid[r] && kpos < len && (!causal || kpos <= rows[r]);
      float& x = s[nb * 4 + e];
      x = visible ? x * q_factor[r] * ((e & 1) ? kc.y : kc.x) : -INFINITY;
      tile_max[r] = nan_max(tile_max[r], x);
    }
  }
  for (int r = 0; r < 2; ++r) tile_max[r] = quad_nan_max(tile_max[r]);
  update_running_max(tile_max, m, l, o_acc);

#pragma unroll
  for (int kk = 0; kk < kKeyTile / 32; ++kk) {
    float pf[4][4];  // [n8 block within the step][element]
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int nb = kk * 4 + b;
      const uchar2 vs = *reinterpret_cast<const uchar2*>(st.v_scale + nb * 8 + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const float x = s[nb * 4 + e];
        const bool visible = x != -INFINITY;
        const float pe = visible ? exp2_ftz(x - m[r]) : 0.f;
        l[r] += pe;
        const int v_exp = scale_exponent((e & 1) ? vs.y : vs.x);
        const float fold = pow2i(v_exp == kNaNExponent ? kNaNExponent : v_exp + fold_bias[r]);
        pf[b][e] = visible ? pe * fold : 0.f;
      }
    }
    pack_a_step(pf, pa[kk]);
  }
}

// An interior tile (every key visible to every row): the same numbers with the fewest
// instructions per element, which bound the kernel (the softmax runs between the two products):
//   - no mask, and S 2^ek_j (exact) is what the max runs over: s = (S 2^ek_j) q_factor_i is
//     monotone in it, so the row max of s is q_factor_i times that max (fmaxf: NaN scores make
//     p NaN below, and so the row's O and LSE, as on masked tiles);
//   - s - m as one fused multiply-add (one rounding instead of two: well inside the tolerances);
//   - the V fold 2^(ev_j + fold_bias_i) as the product v_pow_j row_pow_i of two powers of two
//     (bitwise the same factor: see forward_kernel).
template <int D>
__device__ __forceinline__ void interior_tile(float (&s)[kKeyTile / 2], const KeyTileStage<D>& st,
                                              const float (&q_factor)[2], const float (&row_pow)[2], int t,
                                              float (&m)[2], float (&l)[2], float (&o_acc)[D / 2],
                                              uint32_t (&pa)[kKeyTile / 32][4]) {
  // Four partial maxima per row (the max is exact in any order), so that no chain of dependent
  // instructions runs through all 32 of a row's elements.
  float part_max[2][4];
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 4; ++k) part_max[r][k] = -INFINITY;
#pragma unroll
  for (int nb = 0; nb < kKeyBlocks; ++nb) {
    const float2 kc = *reinterpret_cast<const float2*>(st.k_col + nb * 8 + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float& x = s[nb * 4 + e];
      x *= (e & 1) ? kc.y : kc.x;
      float& pm = part_max[e >> 1][(nb & 1) * 2 + (e & 1)];
      pm = fmaxf(pm, x);
    }
  }
  float tile_max[2], neg_m[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(fmaxf(part_max[r][0], part_max[r][1]), fmaxf(part_max[r][2], part_max[r][3]));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2)) * q_factor[r];
  }
  update_running_max(tile_max, m, l, o_acc);
  // -m, except where every score so far overflowed to -inf (p = 0 then, not NaN).
  for (int r = 0; r < 2; ++r) neg_m[r] = m[r] == -INFINITY ? 0.f : -m[r];

  // l sums the tile's p in one partial sum per row and 32-key step (short dependency chains; the
  // order of an FP32 sum of positive terms moves it by a few ulp at most).
  float part_sum[2][kKeyTile / 32] = {};
#pragma unroll
  for (int kk = 0; kk < kKeyTile / 32; ++kk) {
    float pf[4][4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int nb = kk * 4 + b;
      const float2 vp = *reinterpret_cast<const float2*>(st.v_pow + nb * 8 + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const float pe = exp2_ftz(fmaf(s[nb * 4 + e], q_factor[r], neg_m[r]));
        part_sum[r][kk] += pe;
        pf[b][e] = pe * (((e & 1) ? vp.y : vp.x) * row_pow[r]);
      }
    }
    pack_a_step(pf, pa[kk]);
  }
  static_assert(kKeyTile / 32 == 4, "four partial sums per row");
  for (int r = 0; r < 2; ++r) l[r] += (part_sum[r][0] + part_sum[r][1]) + (part_sum[r][2] + part_sum[r][3]);
}

template <int D>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) forward_kernel(const ForwardParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  SharedTiles<D>& sm = *reinterpret_cast<SharedTiles<D>*>(smem);

  const int h = blockIdx.y;
  DocumentTile work;
  if (!document_tile(p.cu_seqlens, p.num_docs, p.total_tokens, kQueryRows, blockIdx.x, work)) return;
  const int doc = work.doc;
  const auto [doc_begin, doc_end, len] = work.span;
  const int q0 = (work.tiles - 1 - work.tile) * kQueryRows;  // later (costlier, causal) tiles launch first
  const int kvh = h / (p.q_heads / p.kv_heads);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows[2] = {q0 + warp * kRowsPerWarp + g, q0 + warp * kRowsPerWarp + g + 8};
  const bool row_valid[2] = {rows[0] < len, rows[1] < len};
  const float scale_log2e = p.softmax_scale * 1.4426950408889634f;

  float q_factor[2];
  int fold_bias[2];  // boost - rho_i: the P operand is p * 2^(ev_j + fold_bias), never above 2^boost
  for (int r = 0; r < 2; ++r) {
    const int tok = doc_begin + (row_valid[r] ? rows[r] : 0);
    q_factor[r] = pow2_of_scale(p.q_scales[size_t(tok) * p.q_heads + h]) * scale_log2e;
    // rho_i: the running max of V's exponents over visible keys (the whole document if not causal).
    const int ref_tok = p.causal ? tok : doc_end - 1;
    const uint8_t rho = p.v_fold_ref[size_t(ref_tok) * p.kv_heads + kvh];
    const int rho_exp = scale_exponent(rho);
    fold_bias[r] = rho_exp == kNaNExponent ? kNaNExponent : p.p_boost_log2 - rho_exp;
  }
  // Interior tiles (every key visible to every row) split the V fold 2^(ev_j + fold_bias_i) into
  // v_pow_j = 2^(ev_j - c) and row_pow_i = 2^(fold_bias_i + c), with c = rho of the CTA's first row
  // (of the document's last row when not causal). Every key of an interior tile has ev_j <= c <=
  // rho_i, so both factors are at most 2^boost, and their product equals pow2i(ev_j + fold_bias_i)
  // exactly: a product of two powers of two is exact down to 2^-149 and rounds to 0 below it, and
  // where a factor is already 0 the true value is below 2^-141, which E4M3 encodes as 0 either way.
  // (Rows past the document end get meaningless row_pow; their outputs are never stored, and rows
  // do not mix in the products.)
  const int c_exp = scale_exponent(p.v_fold_ref[size_t(p.causal ? doc_begin + q0 : doc_end - 1) * p.kv_heads + kvh]);
  float row_pow[2];
  for (int r = 0; r < 2; ++r) row_pow[r] = pow2i(add_exponents(fold_bias[r], c_exp));

  float o_acc[D / 2];  // the m64nD accumulator: [n8 block][4] flattened
  zero(o_acc);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  // Key tiles run from the diagonal one down to the first; tile i of the loop uses stage i % 2.
  // Prologue: the CTA's Q rows (once) and the first key tile, zero-filled past the document end.
  const int last_row = min(q0 + kQueryRows, len) - 1;
  const int last_key = p.causal ? last_row : len - 1;
  const int64_t vt_doc_row = int64_t(kvh) * D * p.vt_pitch + layout::transposed_document_start(doc_begin, doc);
  copy_tile_async<kQueryRows, D, kThreads>(p.q_codes + (int64_t(doc_begin + q0) * p.q_heads + h) * D,
                                           int64_t(p.q_heads) * D, len - q0, D, sm.q);
  copy_key_tile_async(p, doc_begin, vt_doc_row, len, kvh, last_key / kKeyTile * kKeyTile, sm.stage[0]);
  cp_async_commit();
  store_key_scales(load_key_scales(p, doc_begin, len, kvh, last_key / kKeyTile * kKeyTile), c_exp, sm.stage[0]);

  for (int kt = last_key / kKeyTile, i = 0; kt >= 0; --kt, ++i) {
    const int k0 = kt * kKeyTile;
    const KeyTileStage<D>& st = sm.stage[i % 2];
    cp_async_wait_all();
    fence_smem_for_async_proxy();  // the copies are generic-proxy writes; wgmma reads via the async proxy
    __syncthreads();  // tile kt is in shared memory, and every thread is done with tile kt + 1's stage
    // Tile kt - 1 flows into the other stage while this one is computed.
    KeyScales next_scales{};
    if (kt > 0) {
      copy_key_tile_async(p, doc_begin, vt_doc_row, len, kvh, k0 - kKeyTile, sm.stage[(i + 1) % 2]);
      cp_async_commit();
      next_scales = load_key_scales(p, doc_begin, len, kvh, k0 - kKeyTile);
    }

    // S = Q . K^T: 64 rows x 128 keys, D/32 k-steps on the tensor cores.
    float s[kKeyTile / 2];
    wgmma_fence();
    rows_product<D, kKeyTile>(s, sm.q + threadIdx.x / 128 * kWarpgroupRows * D, st.k);  // this warpgroup's rows
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(s);

    // Softmax and the P operand. A tile is interior when every key is visible to every row: inside
    // the document and, causal, at or before the CTA's first row. Only visible keys enter the
    // running max, so it never looks past a row.
    const bool interior = k0 + kKeyTile <= len && (!p.causal || k0 + kKeyTile - 1 <= q0);
    uint32_t pa[kKeyTile / 32][4];
    if (interior) {
      interior_tile(s, st, q_factor, row_pow, t, m, l, o_acc, pa);
    } else {
      masked_tile(s, st, q_factor, fold_bias, k0, len, p.causal, rows, row_valid, t, m, l, o_acc, pa);
    }

    // O += P~ . V codes on the tensor cores, B = V^T from shared memory.
    fence_accumulators(o_acc);
    wgmma_fence();
    register_product<D, kKeyTile>(o_acc, pa, st.vt);
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(o_acc);
    // Nobody reads the other stage until the next iteration's barrier.
    if (kt > 0) store_key_scales(next_scales, c_exp, sm.stage[(i + 1) % 2]);
  }

  // Finish: full row sums across the 4 lanes of a row, then O and LSE.
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = quad_sum(l[r]);
  auto* o = static_cast<__nv_bfloat16*>(p.o);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!row_valid[r]) continue;
    const int tok = doc_begin + rows[r];
    // 2^(rho_i - boost) undoes the fold; / l normalizes.
    const float out_factor = fold_bias[r] == kNaNExponent ? pow2i(kNaNExponent) : pow2i(-fold_bias[r]);
    const float f = out_factor / l[r];
    store_row_bf16(o_acc, r, f, o + tok * p.o_stride_token + h * p.o_stride_head, t);
    if (t == 0) p.lse[size_t(h) * p.total_tokens + tok] = (m[r] + log2f(l[r])) * 0.6931471805599453f;
  }
}

}  // namespace

int launch_forward(const ForwardParams& p, void* stream) {
  return for_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return launch_over_tile_slots(forward_kernel<D>, p, sizeof(SharedTiles<D>), kThreads, kQueryRows, p.q_heads,
                                  static_cast<cudaStream_t>(stream));
  });
}

}  // namespace flamia::cuda::sm90
