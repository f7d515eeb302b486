// The forward's per-tile mathematics (forward.cu is the pipeline around it): the CTA's shape, one key
// tile's operands and factors as the consumers read them (KeyTileStage), a work item (CtaWork) and
// its rows' constants, and the consumer side of one tile: the masked and interior softmax paths,
// the online-softmax update and an item's output. Apart from the kernel's producers, stage ring and
// item loop, so that another kernel can attend with the same numbers (bitwise: the same functions
// on the same values; a short-document forward kernel built so was tried, docs/KERNELS.md).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "core/tiling.h"
#include "cuda/sm90/accumulator.cuh"
#include "cuda/sm90/forward.h"
#include "cuda/sm90/fp8_math.cuh"
#include "cuda/sm90/step_timeline.cuh"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flamia::cuda::sm90::forward_tile {

constexpr int kRowsPerWarp = 16;                     // one m16 MMA row block per warp
static_assert(kWarpgroupRows == 4 * kRowsPerWarp, "a warpgroup's four warps hold its rows");
constexpr int kQueryRows = kConsumers * kWarpgroupRows;  // 128 queries per CTA
constexpr int kKeyTile = tiling::kFwdKeyTile;        // 128 keys per online-softmax step
constexpr int kKeyBlocks = kKeyTile / 8;             // n8 blocks of S per tile
static_assert(kQueryRows == tiling::kFwdQueryTile && tiling::kFwdKeyTile % kQueryRows == 0,
              "a CTA's rows are one forward query tile and share their diagonal key tile");
// Registers per thread after the hand-over: 128 x 40 + 256 x 232 = 64512, what the launch allocates
// (168 x 384): an increase waits for registers that decreases gave back, so the two must balance.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
static_assert(kConsumers == 2, "the consumers take turns in pairs");

// One key tile's operands; stages of the ring are 1024-byte aligned, as the 128-byte swizzle of
// the TMA-written tiles requires.
template <int D>
struct alignas(1024) KeyTileStage {
  uint8_t k[kKeyTile * D];   // rows = keys, K = features (swizzled)
  uint8_t vt[D * kKeyTile];  // rows = features, K = keys, permuted (swizzled)
  float k_col[kKeyTile];     // 2^ek_j (0 past the document end)
  float v_pow[kKeyTile];     // 2^(ev_j - c): interior tiles' half of the V fold (see row_constants)
  uint8_t v_scale[kKeyTile];  // UE8M0 of V_j: masked tiles fold with its exponent
  float2 group_fold[kKeyTile / tiling::kScaleBlock];  // grouped tiles: {e_g, 2^-e_g} (see GroupFold)
};
// One work item: what the producer finds and hands the consumers with the item's Q tile.
struct CtaWork {
  int doc, doc_begin, doc_end, len, q0, head, kvh;
  int tiles;  // key tiles, from the diagonal one (tile 0 of the loop) down to the first; 0: no more
  int c_exp;  // the V fold split exponent c (see row_constants)
};
// The constants of one of an item's query rows (row_constants), computed by the publisher so that
// a consumer's start on an item is a few shared-memory loads.
struct alignas(16) RowConstants {
  float q_factor;  // 2^eq_i scale log2(e)
  float row_pow;   // 2^(fold_bias_i + c): the row's half of the split V fold
  float lsum_exp;  // b_i = fold_bias_i + c, clamped (GroupFold): l is kept in units of 2^b_i
  int fold_bias;   // boost - rho_i: the P operand is p * 2^(ev_j + fold_bias), never above 2^boost
};
struct QueryTileInfo {
  CtaWork work;
  RowConstants row[kQueryRows];         // past the document end: the document's first row's
  uint8_t split_fold[kConsumerWarps];  // per consumer warp (its 16 rows): see row_constants
};

// One item as a consumer thread sees it: the item, the ring use of its tile 0, and its two rows'
// constants (see item_rows).
struct ItemRows {
  CtaWork w;
  int key_uses;  // the ring use of the item's tile 0 (the ring runs on across items)
  int q_buffer;  // its Q tile's buffer
  int rows[2];   // document positions of the thread's two rows
  bool row_valid[2];
  float q_factor[2];  // 2^eq_i scale log2(e)
  int fold_bias[2];   // boost - rho_i: the P operand is p * 2^(ev_j + fold_bias), never above 2^boost
  float row_pow[2];   // 2^(fold_bias_i + c): the row's half of the split V fold
  float lsum_exp[2];  // b_i = fold_bias_i + c, clamped (GroupFold): l is kept in units of 2^b_i
  bool split_fold;    // masked tiles may fold with v_pow_j row_pow_i too (warp-uniform)
};

__device__ __forceinline__ int key_tile_start(const CtaWork& w, int i) { return (w.tiles - 1 - i) * kKeyTile; }
// The codes key tile i reads: 1, the interior codes, or 0. kInteriorCodes: the kernel instance for
// prefix isolation's interior codes (kernel_problem.h), which exist only where causal; then tile
// i lies i frontier tiles before the item's rows (tile 0 is the diagonal one; core/tiling.h), and
// its pairs are interior from tile kFrontierTiles on. (An instance, not a run-time choice: any code
// for it in the producer changed the consumers' code around it and cost the default's forward 2-3%.)
template <bool kInteriorCodes>
__device__ __forceinline__ int tile_codes(int i) {
  return kInteriorCodes && i >= tiling::kFrontierTiles;
}
// Whether key tile i, where it is interior, takes the grouped arithmetic (interior_tile_grouped):
// every 32-key group shares its K and V scales. The producer stores what that path reads.
template <bool kInteriorCodes>
__device__ __forceinline__ bool tile_grouped(const ForwardParams& p, int i) {
  return kInteriorCodes ? tile_codes<true>(i) == 1 : p.group_scales;
}

// The V fold of a grouped tile, taken into the exponent: P~ = E4M3(2^(s - m + e_g + b_i)) for
// group g and row i, with e_g = ev_g - c (the streamer's, per group) and b_i = boost - rho_i + c
// (the row's, per item), so that the tile's elements take no fold multiply (with the per-group
// stores below: forward kernel -2 to -4%, -8 to -9% in prefix isolation; docs/KERNELS.md). The
// row sum takes the unfolded p back exactly: l accumulates in units of 2^b_i (ItemRows::lsum_exp),
// each group's partial sum times 2^-e_g, a power of two. Both exponents are clamped to kGroupFoldFloor, which
// keeps every factor a normal float and changes no P~: an interior key has ev_g <= c <= rho_i, so
// e_g <= 0 and b_i <= boost, and where either lies below the floor the fold is below 2^(boost +
// kGroupFoldFloor) = 2^-24 before and after the clamp, which E4M3 encodes as 0. p below 2^(-126 -
// 2 kGroupFoldFloor) = 2^-62 may flush to 0 in l, far below l's precision (l >= 1). NaN exponents
// (V's NaN code) are taken as 0: a row that sees one has rho_i NaN, and store_item_output makes
// its O NaN, as the emulation does, while l stays V's-independent.
constexpr int kGroupFoldFloor = -32;
// An exponent sum (add_exponents) clamped into [kGroupFoldFloor, ceiling]; the NaN marker gives 0.
__device__ __forceinline__ int clamp_fold_exponent(int e, int ceiling) {
  return e >= kNaNExponent / 2 ? 0 : max(kGroupFoldFloor, min(e, ceiling));
}


// 32-key scale groups per key tile (a grouped tile's factors are one set per group).
constexpr int kTileGroups = kKeyTile / tiling::kScaleBlock;
static_assert(kTileGroups <= 32, "a lane per group");
// {e_g, 2^-e_g} of a grouped tile's group whose V scale byte is v_byte, for an item of split exponent
// c (neg_c = -c, or the NaN marker): what the streamers' store_group_factors stores per group.
__device__ __forceinline__ float2 group_fold_factor(uint8_t v_byte, int neg_c) {
  const int e = clamp_fold_exponent(add_exponents(scale_exponent(v_byte), neg_c), 0);
  return make_float2(float(e), exp2i_float(-e));
}


// One row's constants. rho_i is V's running scale max at the row (not causal: at the document's
// end), c the item's split exponent (CtaWork::c_exp).
// Interior tiles (every key visible to every row) split the V fold 2^(ev_j + fold_bias_i) into
// v_pow_j = 2^(ev_j - c) (the producer's) and row_pow_i = 2^(fold_bias_i + c), with c = rho of
// the CTA's first row (of the document's last row when not causal). Every key of an interior
// tile has ev_j <= c <= rho_i, so both factors are at most 2^boost, and their product equals
// pow2i(ev_j + fold_bias_i) exactly: a product of two powers of two is exact down to 2^-149 and
// rounds to 0 below it, and where a factor is already 0 the true value is below 2^-141, which
// E4M3 encodes as 0 either way. (Rows past the document end get meaningless row_pow; their
// outputs are never stored, and rows do not mix in the products.)
// Masked tiles may fold with v_pow_j row_pow_i too, where every row of the warp has
// 0 <= rho_i - c <= kMaxFoldSplit (rows past the document end see no key): a visible key has
// ev_j <= rho_i, so v_pow_j = 2^(ev_j - c) <= 2^kMaxFoldSplit and row_pow_i = 2^(boost - rho_i + c)
// >= 2^-kMaxFoldSplit; where v_pow_j is normal the product is exact, and where it is below 2^-126
// the fold is below 2^(boost - 126) either way, which E4M3 encodes as 0. So P~ is bitwise the same
// on both ways, and a warp's choice (which rows after row i may sway) changes no bit of row i.
// `splits` says whether this row allows it.
constexpr int kMaxFoldSplit = 120;
__device__ __forceinline__ RowConstants row_constants(const ForwardParams& p, const CtaWork& w, uint8_t q_scale,
                                                      uint8_t fold_ref, bool valid, bool& splits) {
  RowConstants c;
  c.q_factor = pow2_of_scale(q_scale) * (p.softmax_scale * kLog2e);
  const int rho_exp = scale_exponent(fold_ref);
  c.fold_bias = rho_exp == kNaNExponent ? kNaNExponent : p.p_boost_log2 - rho_exp;
  const int folded = add_exponents(c.fold_bias, w.c_exp);
  c.row_pow = pow2i(folded);
  c.lsum_exp = float(clamp_fold_exponent(folded, p.p_boost_log2));
  splits = !valid || (rho_exp != kNaNExponent && w.c_exp != kNaNExponent && rho_exp - w.c_exp >= 0 &&
                      rho_exp - w.c_exp <= kMaxFoldSplit);
  return c;
}

// alpha = 2^(m_old - m_new) by `exp2`, O's and l's factor when the running max moves from m_old
// to m_new. A row with nothing visible yet keeps m = -inf; its p are all 0.
template <class Exp2>
__device__ __forceinline__ float rescale_factor(float m_old, float m_new, Exp2 exp2) {
  return m_old == -INFINITY ? (m_new == -INFINITY ? 1.f : 0.f) : exp2(m_old - m_new);
}

// The online-softmax update of a tile with row maxima tile_max (already over the quad): new
// running max and l; alpha = 2^(m - m') is what O must be multiplied by once the product that is
// still adding the previous tile into it has finished (rescale_output).
__device__ __forceinline__ void update_running_max(const float (&tile_max)[2], float (&m)[2], float (&l)[2],
                                                   float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = nan_max(m[r], tile_max[r]);
    alpha[r] = rescale_factor(m[r], m_new, [](float x) { return exp2f(x); });
    l[r] *= alpha[r];
    m[r] = m_new;
  }
}
// The online softmax's state of a thread's two rows, as the tile functions update it: the item's
// running max m and sum l, and alpha, what O is to be multiplied by (update_running_max).
struct SoftmaxRows {
  float (&m)[2];
  float (&l)[2];
  float (&alpha)[2];
};
// A warp skips the rescale when none of its rows' max moved (alpha = 1 exactly), the common case
// once the max has settled.
template <int N>
__device__ __forceinline__ void rescale_output(float (&o_acc)[N], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) scale_rows(o_acc, alpha);
}

// Both tile paths take 2^x as exp2_ftz: a p below 2^-126, times a fold factor of at most 2^boost,
// is far below E4M3's smallest subnormal (2^-9), and against l >= 1 (the row max contributes 1) it
// is lost in the FP32 sum anyway, so flushing it to 0 changes nothing that is kept.

// A masked tile (it holds keys some row must not see: the diagonal tile, a document's last),
// element by element as the emulation states it: s = S 2^eq_i 2^ek_j scale log2(e) on visible keys,
// -inf elsewhere; p = 2^(s - m); l sums unrounded p; s is left holding p 2^(ev_j + fold_bias_i),
// which pack_a_operand rounds to P~. Masked keys contribute an exact 0, even when their V scale is NaN.
// The fold factor 2^(ev_j + fold_bias_i) is v_pow_j row_pow_i, as on interior tiles, when the warp's
// rows allow it (split_fold: see row_constants; bitwise the same factor), else built from the exponents.
// With kSkipUnseenSpans, keys come in spans of kSpanKeys, and a span that no row of the warp sees
// (on the diagonal tile the keys after the warp's last row, the keys past the document end) skips
// the exponentials: its P~ is 0 and it adds nothing to l, exactly what the element path gives it
// (its max is -inf either way). (The first pass skipping unseen spans as well spilled in every
// instance; which instances skip: forward.cu's consume_items' kLeanSteps.)
constexpr int kSpanKeys = 16;  // a warp's rows: on the diagonal tile consumer c's warp w sees spans 0 .. 4c + w
constexpr int kSpans = kKeyTile / kSpanKeys, kBlocksPerSpan = kSpanKeys / 8;
__device__ __forceinline__ void skip_span(float (&s)[kKeyTile / 2], int span) {
#pragma unroll
  for (int e = 0; e < 4 * kBlocksPerSpan; ++e) s[span * 4 * kBlocksPerSpan + e] = 0.f;
}
template <int D, bool kSkipUnseenSpans>
__device__ __forceinline__ void masked_tile(float (&s)[kKeyTile / 2], const KeyTileStage<D>& st, const ItemRows& it,
                                            int k0, bool causal, const float (&lsum_pow)[2],
                                            const SoftmaxRows& softmax, const timeline::StepClock& clock) {
  const float(&q_factor)[2] = it.q_factor, (&row_pow)[2] = it.row_pow;
  const int(&fold_bias)[2] = it.fold_bias, (&rows)[2] = it.rows;
  const bool(&row_valid)[2] = it.row_valid, split_fold = it.split_fold;
  const int len = it.w.len, t = consumer_thread().t;
  auto& [m, l, alpha] = softmax;
  // Key k0 + 2t + c (c = 8 nb + (e & 1)) is visible to row r iff c < key_limit[r]: inside the
  // document and, causal, at or before the row (one compare per element).
  int key_limit[2];
  for (int r = 0; r < 2; ++r)
    key_limit[r] = (row_valid[r] ? (causal ? min(len, rows[r] + 1) : len) : 0) - k0 - 2 * t;
  // The warp's keys: tile keys 0 .. seen - 1 hold every key some row of it sees.
  int seen_spans = kSpans;
  if constexpr (kSkipUnseenSpans) {
    const int seen = __reduce_max_sync(0xffffffffu, max(key_limit[0], key_limit[1]) + 2 * t);
    seen_spans = seen <= 0 ? 0 : min((seen + kSpanKeys - 1) / kSpanKeys, kSpans);
  }
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nb = 0; nb < kKeyBlocks; ++nb) {
    const float2 kc = *reinterpret_cast<const float2*>(st.k_col + nb * 8 + 2 * t);  // keys 2t, 2t + 1
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      float& x = s[nb * 4 + e];
      x = nb * 8 + (e & 1) < key_limit[r] ? x * q_factor[r] * ((e & 1) ? kc.y : kc.x) : -INFINITY;
      tile_max[r] = nan_max(tile_max[r], x);
    }
  }
  for (int r = 0; r < 2; ++r) tile_max[r] = quad_nan_max(tile_max[r]);
  update_running_max(tile_max, m, l, alpha);
  clock.stamp(timeline::kMaxUpdated);
  // The tile's sum of unrounded p, added to l in l's units (lsum_pow: see GroupFold) at the end.
  float tile_l[2] = {0.f, 0.f};
  auto add_tile_sum = [&] {
    for (int r = 0; r < 2; ++r) l[r] = fmaf(tile_l[r], lsum_pow[r], l[r]);
  };

  // The exponentials, span by span, with the fold factor 2^(ev_j + fold_bias_i) as v_pow_j row_pow_i
  // (split: std::true_type) or built from the exponents (std::false_type). This shape, the early
  // return below included, compiles to the SASS of the two loops written out; a lambda per factor or
  // one call after an if/else rescheduled every instance.
  auto exponentials = [&](auto split) {
#pragma unroll
    for (int span = 0; span < kSpans; ++span) {
      if (span >= seen_spans) {
        skip_span(s, span);
        continue;
      }
#pragma unroll
      for (int nb = span * kBlocksPerSpan; nb < (span + 1) * kBlocksPerSpan; ++nb) {
        float2 vp;
        uchar2 vs;
        if constexpr (split.value) vp = *reinterpret_cast<const float2*>(st.v_pow + nb * 8 + 2 * t);
        else vs = *reinterpret_cast<const uchar2*>(st.v_scale + nb * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          float& x = s[nb * 4 + e];
          const bool visible = x != -INFINITY;
          const float pe = exp2_ftz(x - m[r]);  // NaN where x and m are both -inf: selected away below
          tile_l[r] += visible ? pe : 0.f;
          if constexpr (split.value) {
            x = visible ? pe * (((e & 1) ? vp.y : vp.x) * row_pow[r]) : 0.f;
          } else {
            // Built from the exponent where it is a normal float, else pow2i's branches (rare: the
            // NaN marker of either exponent, or a fold outside the normal range).
            const int fold_exp = scale_exponent((e & 1) ? vs.y : vs.x) + fold_bias[r];
            float fold = __uint_as_float(uint32_t(fold_exp + 127) << 23);
            if (unsigned(fold_exp + 126) > 253u) fold = pow2i(fold_exp);
            x = visible ? pe * fold : 0.f;
          }
        }
      }
    }
  };
  if (split_fold) {
    exponentials(std::true_type{});
    add_tile_sum();
    return;
  }
  exponentials(std::false_type{});
  add_tile_sum();
}

// An interior tile (every key visible to every row): the same numbers with the fewest
// instructions per element, which bound the kernel (the softmax runs between the two products):
//   - no mask, and S 2^ek_j (exact) is what the max runs over: s = (S 2^ek_j) q_factor_i is
//     monotone in it, so the row max of s is q_factor_i times that max (fmaxf: NaN scores make
//     p NaN below, and so the row's O and LSE, as on masked tiles);
//   - s - m as one fused multiply-add (one rounding instead of two: well inside the tolerances);
//   - the V fold 2^(ev_j + fold_bias_i) as the product v_pow_j row_pow_i of two powers of two
//     (bitwise the same factor: see row_constants).
template <int D>
__device__ __forceinline__ void interior_tile(float (&s)[kKeyTile / 2], const KeyTileStage<D>& st,
                                              const float (&q_factor)[2], const float (&row_pow)[2],
                                              const float (&lsum_pow)[2], int t, const SoftmaxRows& softmax,
                                              const timeline::StepClock& clock) {
  auto& [m, l, alpha] = softmax;
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
  update_running_max(tile_max, m, l, alpha);
  clock.stamp(timeline::kMaxUpdated);
  // -m, except where every score so far overflowed to -inf (p = 0 then, not NaN).
  for (int r = 0; r < 2; ++r) neg_m[r] = m[r] == -INFINITY ? 0.f : -m[r];

  // l sums the tile's p in one partial sum per row and 32-key step (short dependency chains; the
  // order of an FP32 sum of positive terms moves it by a few ulp at most).
  float part_sum[2][kKeyTile / 32] = {};
#pragma unroll
  for (int nb = 0; nb < kKeyBlocks; ++nb) {
    const float2 vp = *reinterpret_cast<const float2*>(st.v_pow + nb * 8 + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      float& x = s[nb * 4 + e];
      const float pe = exp2_ftz(fmaf(x, q_factor[r], neg_m[r]));
      part_sum[r][nb / 4] += pe;
      x = pe * (((e & 1) ? vp.y : vp.x) * row_pow[r]);
    }
  }
  static_assert(kKeyTile / 32 == 4, "four partial sums per row");
  for (int r = 0; r < 2; ++r)
    l[r] = fmaf((part_sum[r][0] + part_sum[r][1]) + (part_sum[r][2] + part_sum[r][3]), lsum_pow[r], l[r]);
}

// The interior tile when every 32-key group shares its K and V scales (block32 geometry; a tile
// holds kKeyTile / 32 whole groups, counted from the document start like the tiles): the same
// numbers with three multiplies per score fewer.
//   - the max runs over the raw S of each group, times the group's 2^ek (exact: a positive power
//     of two commutes with the max);
//   - s - m as fmaf(S, 2^ek_g q_factor_i, -m): the product 2^ek_g q_factor_i is exact, so the FMA's
//     one rounding is that of fmaf(S 2^ek, q_factor_i, -m) above (outside the float range of
//     2^ek q_factor, i.e. scales near 2^+-126, the two may differ by that rounding);
//   - the V fold in the exponent (GroupFold): p~ = 2^(fmaf(S, 2^ek_g q_factor_i, (b_i - m) + e_g)),
//     whose argument carries up to two more roundings of a few 2^-24 than s - m, and l in units of
//     2^b_i from each group's sum of p~ times 2^-e_g.
// `turn`: the consumers' softmax turns (forward.cu's consume_items), taken from the max to the last
// exponential.
template <int D, class Turn>
__device__ __forceinline__ void interior_tile_grouped(float (&s)[kKeyTile / 2], const KeyTileStage<D>& st,
                                                      const float (&q_factor)[2], const float (&lsum_exp)[2],
                                                      const SoftmaxRows& softmax, const timeline::StepClock& clock,
                                                      const Turn& turn) {
  auto& [m, l, alpha] = softmax;
  constexpr int kGroups = kTileGroups, kBlocksPerGroup = kKeyBlocks / kGroups;
  static_assert(kGroups == 4, "four groups per tile: four partial maxima per row");
  turn.begin();
  // Each chain (a row's group max here, its group sum below) starts from the group's first element of
  // the row, not from -inf or 0: 16 instructions fewer per tile on the step's critical path (with
  // the softmax turns, forward.cu: forward kernel -2.3% at 4x16384). Bitwise the same
  // values: fmaxf drops a NaN operand either way, and 0 + p = p (a row whose every score is NaN
  // gets a NaN max instead of -inf, and NaN outputs either way).
  auto first_of_group = [](int nb, int e) { return nb % kBlocksPerGroup == 0 && (e & 1) == 0; };
  float group_max[2][kGroups];
  for (int r = 0; r < 2; ++r)
    for (int g = 0; g < kGroups; ++g) group_max[r][g] = s[g * kBlocksPerGroup * 4 + 2 * r];
#pragma unroll
  for (int nb = 0; nb < kKeyBlocks; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (first_of_group(nb, e)) continue;
      float& gm = group_max[e >> 1][nb / kBlocksPerGroup];
      gm = fmaxf(gm, s[nb * 4 + e]);
    }
  float k_col[kGroups];  // the group's 2^ek (its first key's; all keys share it)
  float2 fold[kGroups];  // {e_g, 2^-e_g}
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    k_col[g] = st.k_col[g * tiling::kScaleBlock];
    fold[g] = st.group_fold[g];
  }
  float tile_max[2], bias[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(fmaxf(group_max[r][0] * k_col[0], group_max[r][1] * k_col[1]),
                        fmaxf(group_max[r][2] * k_col[2], group_max[r][3] * k_col[3]));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2)) * q_factor[r];
  }
  // The running max first, the exponentials' addends from it, then alpha (by exp2_ftz, off the
  // exponentials' path): forward kernel -1 to -2.7% on the long rows, bitwise
  // the same outputs. An alpha below 2^-126 flushed to 0 drops the earlier keys' weights, each below
  // 2^-126 of the new max key's 1, as the exponentials' own flush does.
  const float m_old[2] = {m[0], m[1]};
  for (int r = 0; r < 2; ++r) m[r] = nan_max(m[r], tile_max[r]);
  clock.stamp(timeline::kMaxUpdated);
  // b_i - m, with -m taken as 0 where every score so far overflowed to -inf (p = 0 then, not NaN).
  for (int r = 0; r < 2; ++r) bias[r] = lsum_exp[r] - (m[r] == -INFINITY ? 0.f : m[r]);
  for (int r = 0; r < 2; ++r) {
    alpha[r] = rescale_factor(m_old[r], m[r], [](float x) { return exp2_ftz(x); });
    l[r] *= alpha[r];
  }

  float part_sum[2][kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const float exponent_factor[2] = {k_col[g] * q_factor[0], k_col[g] * q_factor[1]};
    const float addend[2] = {bias[0] + fold[g].x, bias[1] + fold[g].x};
#pragma unroll
    for (int nb = g * kBlocksPerGroup; nb < (g + 1) * kBlocksPerGroup; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float& x = s[nb * 4 + e];
        x = exp2_ftz(fmaf(x, exponent_factor[r], addend[r]));
        part_sum[r][g] = first_of_group(nb, e) ? x : part_sum[r][g] + x;
      }
  }
  turn.end();
  for (int r = 0; r < 2; ++r)
    l[r] += fmaf(part_sum[r][0], fold[0].y, part_sum[r][1] * fold[1].y) +
            fmaf(part_sum[r][2], fold[2].y, part_sum[r][3] * fold[3].y);
}

// --- consumers ---------------------------------------------------------------------------------
// 2^e for a float e that holds an integer in [-126, 127], exactly: e + 1.5 2^23 holds e in its low
// mantissa bits.
__device__ __forceinline__ float pow2_of_integral(float e) {
  return __int_as_float((__float_as_int(e + 12582912.f) - 0x4B400000 + 127) << 23);
}
__device__ __forceinline__ void lsum_units(const ItemRows& it, float (&lsum_pow)[2]) {
  for (int r = 0; r < 2; ++r) lsum_pow[r] = pow2_of_integral(it.lsum_exp[r]);
}

__device__ __forceinline__ ItemRows item_rows(const CtaWork& w, const QueryTileInfo& info, int key_uses,
                                              int q_buffer) {
  const ConsumerThread me = consumer_thread();
  ItemRows it;
  it.w = w;
  it.key_uses = key_uses;
  it.q_buffer = q_buffer;
  const int tile_rows[2] = {me.warp * kRowsPerWarp + me.g, me.warp * kRowsPerWarp + me.g + 8};  // of the 128
  for (int r = 0; r < 2; ++r) {
    it.rows[r] = w.q0 + tile_rows[r];
    it.row_valid[r] = it.rows[r] < w.len;
    const RowConstants c = info.row[tile_rows[r]];
    it.q_factor[r] = c.q_factor;
    it.fold_bias[r] = c.fold_bias;
    it.row_pow[r] = c.row_pow;
    it.lsum_exp[r] = c.lsum_exp;
  }
  it.split_fold = __all_sync(0xffffffffu, info.split_fold[me.warp]);  // a vote: warp-uniform to the compiler
  return it;
}

// The softmax of an interior tile (every key visible to every row) of item `it` on S_i (waited for),
// leaving its P operand values in s and O's rescale factors in alpha. With kInteriorCodes the tiles
// that read the interior codes take the grouped arithmetic, the others (the frontier's, per-token
// codes) the per-key one.
// `turn`: the consumers' softmax turns of the tile loop, which the grouped path takes (a no-op
// ConsumerTurns elsewhere).
using NoTurn = ConsumerTurns<false>;
template <int D, bool kInteriorCodes, class Turn = NoTurn>
__device__ __forceinline__ void interior_softmax(const ForwardParams& p, const ItemRows& it,
                                                 const KeyTileStage<D>& st, int i, float (&s)[kKeyTile / 2],
                                                 const SoftmaxRows& softmax, const timeline::StepClock& clock,
                                                 const Turn& turn = {}) {
  fence_accumulators(s);
  if (tile_grouped<kInteriorCodes>(p, i)) {
    interior_tile_grouped(s, st, it.q_factor, it.lsum_exp, softmax, clock, turn);
  } else {
    float lsum_pow[2];
    lsum_units(it, lsum_pow);
    interior_tile(s, st, it.q_factor, it.row_pow, lsum_pow, consumer_thread().t, softmax, clock);
  }
}
// Tile i's softmax, masked or interior. A tile is interior when every key is visible to every row:
// inside the document and, causal, at or before the CTA's first row. Only visible keys enter the
// running max, so it never looks past a row. Only tile 0 can be masked: it is the diagonal tile
// (causal; its keys start at the item's first row) or the document's last (not causal), and every
// tile i >= 1 lies inside the document and, causal, before the item's first row, so the tile loop
// may run interior_softmax alone (forward.cu's consume_items' kLeanSteps).
template <int D, bool kInteriorCodes, bool kSkipUnseenSpans, class Turn = NoTurn>
__device__ __forceinline__ void tile_softmax(const ForwardParams& p, const ItemRows& it, const KeyTileStage<D>& st,
                                             int i, float (&s)[kKeyTile / 2], const SoftmaxRows& softmax,
                                             const timeline::StepClock& clock, const Turn& turn = {}) {
  const int k0 = key_tile_start(it.w, i);
  if (k0 + kKeyTile <= it.w.len && (!p.causal || k0 + kKeyTile - 1 <= it.w.q0)) {
    interior_softmax<D, kInteriorCodes>(p, it, st, i, s, softmax, clock, turn);
    return;
  }
  fence_accumulators(s);
  float lsum_pow[2];
  lsum_units(it, lsum_pow);
  masked_tile<D, kSkipUnseenSpans>(s, st, it, k0, p.causal, lsum_pow, softmax, clock);
}

// An item's end: full row sums across the 4 lanes of a row (back from units of 2^b_i: exact), then
// O and LSE.
template <int N>
__device__ __forceinline__ void store_item_output(const ForwardParams& p, const ItemRows& it, const float (&o_acc)[N],
                                                  const float (&m)[2], float (&l)[2]) {
  const int t = consumer_thread().t;
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = quad_sum(l[r]) * pow2_of_integral(-it.lsum_exp[r]);
  auto* o = static_cast<__nv_bfloat16*>(p.o);
  const int h = it.w.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int tok = it.w.doc_begin + (it.row_valid[r] ? it.rows[r] : 0);
    // 2^(rho_i - boost) undoes the fold; / l normalizes.
    const float out_factor = it.fold_bias[r] == kNaNExponent ? pow2i(kNaNExponent) : pow2i(-it.fold_bias[r]);
    const float f = out_factor / l[r];
    store_row_bf16(o_acc, r, f, o + tok * p.o_stride_token + h * p.o_stride_head, t, it.row_valid[r]);
    if (it.row_valid[r] && t == 0) {
      p.lse[size_t(h) * p.total_tokens + tok] = (m[r] + log2f(l[r])) * kLn2;
      if (p.row_max_prob != nullptr) p.row_max_prob[size_t(h) * p.total_tokens + tok] = 1.f / l[r];
    }
  }
}

}  // namespace flamia::cuda::sm90::forward_tile
