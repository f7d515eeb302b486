// Backward pass 2: dK and dV. A work item (document tile slot of 128 keys, KV head) owns those
// keys' gradients (64 keys per consumer warpgroup, sharing every query tile in shared memory); it
// walks the query heads of its KV group and, for each, the 64-query tiles (counted from the
// document start, tiling::kBwdQueryTile) that see its keys. Two schedules of the same code
// (DkdvSchedule): one CTA per item, or persistent like the forward (one CTA per SM takes items in
// turn, work_items.cuh) when documents are short. Per tile, with the keys as rows (S^T and E^T come
// out of the tensor cores already transposed):
//   S^T = K codes . Q codes^T,  p_ij = 2^(S_ij 2^(ek_j + eq_i) scale log2(e) - LSE_i log2(e))
//   E^T = V codes . dO codes^T, E_ij = E^T_ji 2^(ev_j + eg_i),  U_ij = p_ij (E_ij - D_i)
//   dV_j += sum_i E4M3(p_ij 2^(boost + eg_i - gamma)) cg_i          (times 2^(gamma - boost))
//   dK_j += 2^tau_j sum_i E4M3(U_ij 2^(eq_i - tau_j)) cq_i,  tau_j: ceil scale of max_i |U_ij 2^eq_i|
// with gamma the document's largest dO exponent over the group's query heads and tau_j one scale
// per (key, query tile), as
// docs/NUMERICS.md and the emulation (reference::mxfp8_backward) define them. dK is scaled by the
// softmax scale at the end.
// Warp-specialized like the forward (forward.cu, tma.cuh): warpgroup 0's producer warp loads each
// item's K and V rows (persistent: two key buffers, the next item's land while this one runs) with
// their scale bytes, and each step's Q and dO rows and Q^T, dO^T (the quantizer's transposed
// layouts) by TMA into a ring of stages that runs on across items, with the step's per-query
// constants; warpgroups 1 and 2 (64 keys each) compute, each at its own pace. With prefix
// isolation's interior codes (the kInteriorCodes instances) warp 1 loads the item's interior K and V
// rows as well, which the steps two frontier tiles or more from the keys read.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <iterator>
#include <utility>

#include "core/operand_layout.h"
#include "core/tiling.h"
#include "cuda/schedule/document_span.cuh"
#include "cuda/schedule/launch.cuh"
#include "cuda/schedule/work_items.cuh"
#include "cuda/sm90/accumulator.cuh"
#include "cuda/sm90/backward.h"
#include "cuda/sm90/dq_partials.cuh"
#include "cuda/sm90/fp8_math.cuh"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "formats/scales.h"

namespace flamia::cuda::sm90 {
namespace {

constexpr int kKeyRows = kWarpgroupRows * kConsumers;  // keys per CTA
constexpr int kQueryTile = tiling::kBwdQueryTile;   // queries per step: tau's group
constexpr int kStages = 3;
static_assert(kQueryTile == 64, "S^T is one m64n64 product per k-step");
static_assert(tiling::kBwdKeyTile % kKeyRows == 0, "a CTA's keys lie inside one backward key tile");
constexpr int kProducerLanes = 32;  // the key buffers' producer warp (the publisher)
constexpr int kQueriesPerLane = kQueryTile / 32;  // per step and producer lane (query = j 32 + lane)

// The two schedules (launch_backward_dkdv picks one per call). Registers per thread after the
// hand-over: 128 x 24 + 256 x 240 = 128 x 40 + 256 x 232 = 64512 of the SM's 65536.
//  - grid: one CTA per item, its K and V rows in one buffer, 240 registers per consumer;
//  - persistent: one CTA per SM takes items in turn (work_items.cuh), item n's K and V rows in
//    buffer n % 2 (the next item's land while this one runs). Its producer carries the item loop:
//    at 24 registers it spills in the step loop (+20% on long documents), so it gets 40 and the
//    consumers 232, which costs ~5% per step on long documents (H200): long documents run the grid,
//    short ones (fixed costs per item dominate) the persistent kernel (backward.h,
//    dkdv_runs_persistent).
template <bool kPersistent>
struct DkdvSchedule {
  static constexpr int kKeyBuffers = kPersistent ? 2 : 1;
  static constexpr int kProducerRegisters = kPersistent ? 40 : 24;
  static constexpr int kConsumerRegisters = kPersistent ? 232 : 240;
};

// Per-query constants of a tile. c[i] = {2^eq_i, 2^(eg_i + eq_i), 2^(boost + eg_i - gamma),
// 2^(sigma_i + beta_i)} (the last: the FP16 dQ partial's factor, FP16 partials only). pair[m] holds
// the lane pair of queries 2m, 2m + 1 (an accumulator lane's two columns, one 16-byte load):
// {-LSE log2(e) of both, D 2^eq of both}. D_i and E carry 2^eq_i, so that U 2^eq = p (E 2^(ev + eg + eq)
// - D 2^eq) is one fused multiply-add and one multiply per element (the products of powers of two
// are exact, except where they leave the float range: scales near 2^+-126). With FP16 dQ partials
// dq_fold[i] = 2^(-eq_i - sigma_i), U~'s fold from the dK operand (queries 2t, 2t + 1 side by side).
struct QueryTileConsts {
  float4 c[kQueryTile];
  float4 pair[kQueryTile / 2];
  float dq_fold[kQueryTile];
};
// Query i's -LSE_i log2(e) and D_i 2^eq_i in the pair layout.
__device__ __forceinline__ float& pair_lse2(QueryTileConsts& c, int i) { return (&c.pair[i >> 1].x)[i & 1]; }
__device__ __forceinline__ float& pair_delta(QueryTileConsts& c, int i) { return (&c.pair[i >> 1].x)[2 + (i & 1)]; }
__device__ __forceinline__ float pair_lse2(const QueryTileConsts& c, int i) { return (&c.pair[i >> 1].x)[i & 1]; }
__device__ __forceinline__ float pair_delta(const QueryTileConsts& c, int i) { return (&c.pair[i >> 1].x)[2 + (i & 1)]; }

// One query tile's operands (1024-byte aligned for the 128-byte swizzle of the rows-form tiles).
template <int D>
struct alignas(1024) DkdvQueryStage {
  uint8_t q[kQueryTile * D];   // rows form (B of S^T)
  uint8_t g[kQueryTile * D];   // rows form (B of E^T)
  uint8_t qt[D * kQueryTile];  // transposed form, queries permuted (B of dK)
  uint8_t gt[D * kQueryTile];  // transposed form, queries permuted (B of dV)
  QueryTileConsts consts;
};
// The (query head, query tile) steps of an item, in order: each head of the KV group, and for it the
// 64-query tiles (counted from the document start) from q_begin to the document end. A step's
// (head, tile) comes from a cursor walked step by step (first, next) or from the step's number
// (at: a division by a runtime value, ~25 instructions).
struct QuerySteps {
  int first_head, q_begin, q_end;  // q_end: q_begin + the tiles per head * kQueryTile
  struct Cursor {
    int head, q0;
  };
  __device__ Cursor first() const { return {first_head, q_begin}; }
  __device__ Cursor next(Cursor c) const {
    c.q0 += kQueryTile;
    if (c.q0 == q_end) c = {c.head + 1, q_begin};
    return c;
  }
  __device__ Cursor at(int step) const {
    const int tiles_per_head = (q_end - q_begin) / kQueryTile;
    return {first_head + step / tiles_per_head, q_begin + step % tiles_per_head * kQueryTile};
  }
};
// One work item, what the producer finds and hands the consumers with its key rows.
struct DkdvWork {
  DocumentSpan d;
  int doc, k0, kvh;
  int gamma;  // the document's largest dO exponent over the group's query heads
  QuerySteps steps;
  int tiles;  // the item's steps (query tiles over the group's heads); 0: no more items
};
// Interior codes (prefix isolation, block32; kInteriorCodes: the kernel instance for them,
// kernel_problem.h, so that the default's kernels keep their code): the steps whose queries lie
// kFrontierTiles frontier tiles or more after the item's keys (core/tiling.h; the item's keys are
// one) read the K and V rows of the interior codes, which an item with such steps loads into the
// interior key buffer. Causal (prefix isolation always is), each head's steps start at the item's
// first key, so step kFirstInteriorStep is the first of them.
static_assert(kKeyRows == tiling::kFrontierTile, "an item's keys are one frontier tile");
constexpr int kInteriorFrom = tiling::kFrontierTiles * kKeyRows;  // queries from k0 + kInteriorFrom on
constexpr int kFirstInteriorStep = kInteriorFrom / kQueryTile;
template <bool kInteriorCodes>
__device__ __forceinline__ bool has_interior_steps(const DkdvWork& w) {
  return kInteriorCodes && w.d.len > w.k0 + kInteriorFrom;
}
template <bool kInteriorCodes>
__device__ __forceinline__ bool reads_interior_codes(const DkdvWork& w, int q0) {
  return kInteriorCodes && q0 >= w.k0 + kInteriorFrom;
}
// Bytes from one array of the kernel's shared storage to another (members of one struct, so the
// compiler folds the difference).
__device__ __forceinline__ int smem_distance(const uint8_t* from, const uint8_t* to) {
  return int(reinterpret_cast<uintptr_t>(to) - reinterpret_cast<uintptr_t>(from));
}
// Releases of a key buffer: the consumer warps, and in the persistent schedule with interior codes
// the interior loader warp (produce_items).
template <bool kPersistent, bool kInteriorCodes>
constexpr int kKeyRingReleases = kConsumerWarps + (kPersistent && kInteriorCodes ? 1 : 0);
// An item with its keys' scale bytes (keys past the document end: its last key's).
struct DkdvKeyInfo {
  DkdvWork work;
  uint8_t k_scale[kKeyRows], v_scale[kKeyRows];
};
// The K and V rows of an item's interior codes with their scale bytes (keys past the document end:
// its last key's). One buffer: the next item's land once this item's consumers are done.
template <int D>
struct alignas(1024) DkdvInteriorKeys {
  uint8_t k[kKeyRows * D], v[kKeyRows * D];  // rows form
  uint8_t k_scale[kKeyRows], v_scale[kKeyRows];
};
// dQ by boosted FP16 partials (core/dq_partials.h; the kDqPartials instance, D = 128). Each step also
// forms its 64 queries' dQ partial over the item's 128 keys,
//   dQ_i += 2^(sigma_i + beta_i) sum_j U~_ij ck_j,  U~_ij = E4M3(U_ij 2^(ek_j - sigma_i)),
// with sigma_i and beta_i fixed before the pass, so the two consumers never exchange a row max: each
// writes its 64 keys' U~ transposed (queries as rows) into one tile, they meet at a named barrier, and
// each multiplies the tile with half of the item's K^T (kDqFeatures features). The FP16 partial goes
// to shared memory, and TMA reduce-adds (one per warp) add it into dQ's FP16 accumulator (dq's own
// buffer).
constexpr int kDqFeatures = 64;             // dQ features per consumer
constexpr int kDqWarpRows = kQueryTile / 4;  // a warp's rows of a consumer's FP16 partial (one TMA reduce-add)
template <int D>
struct alignas(1024) DqPartialBuffers {
  uint8_t kt[D * kKeyRows];                  // the item's K codes transposed, keys permuted (B of dQ)
  uint8_t u[2][kQueryTile * kKeyRows];       // U~ per step, queries as rows (A of dQ); by use parity
  uint16_t out[kConsumers][2][kQueryTile * kDqFeatures];  // FP16 partials per consumer, by use parity
};
// The shared storage's last member: prefix isolation's interior keys or the dQ partials' buffers
// (never both: FP16 partials run in document isolation), only as large as the launch asks.
template <int D>
union DkdvTail {
  DkdvInteriorKeys<D> interior;
  DqPartialBuffers<D> partials;
};
template <int D, int kKeyBuffers>
struct DkdvShared {
  alignas(1024) uint8_t k[kKeyBuffers][kKeyRows * D];  // rows form (A of S^T)
  alignas(1024) uint8_t v[kKeyBuffers][kKeyRows * D];  // rows form (A of E^T)
  DkdvQueryStage<D> stage[kStages];
  DkdvKeyInfo info[kKeyBuffers];
  StageRing<kStages> ring;            // query steps, use i = the CTA's i-th over all its items
  StageRing<kKeyBuffers> keys_ring;   // K and V rows, use n = the CTA's n-th item
  StageRing<1> interior_ring;         // interior keys, use m = the CTA's m-th item with interior steps
  DkdvTail<D> tail;                   // last: a launch that uses neither member leaves it out
};
template <int D, bool kPersistent>
using DkdvSharedFor = DkdvShared<D, DkdvSchedule<kPersistent>::kKeyBuffers>;
// The dynamic shared memory of a launch: the storage up to its tail, the tail member it uses, and the
// alignment of the dynamic base.
enum class DkdvTailUse { kNone, kInteriorKeys, kDqPartials };
template <int D, bool kPersistent, DkdvTailUse kUse>
constexpr size_t kDkdvSharedBytes =
    sizeof(DkdvSharedFor<D, kPersistent>) - sizeof(DkdvTail<D>) +
    (kUse == DkdvTailUse::kInteriorKeys ? sizeof(DkdvInteriorKeys<D>)
     : kUse == DkdvTailUse::kDqPartials ? sizeof(DqPartialBuffers<D>)
                                        : 0) +
    1024;
static_assert(kDkdvSharedBytes<128, true, DkdvTailUse::kInteriorKeys> <= 227 * 1024 &&
                  kDkdvSharedBytes<128, false, DkdvTailUse::kDqPartials> <= 227 * 1024,
              "a CTA must fit in shared memory");

struct DkdvArgs {
  BackwardParams p;
  CUtensorMap k_map, v_map;    // rows form, box kKeyRows
  CUtensorMap q_map, g_map;    // rows form, box kQueryTile
  CUtensorMap qt_map, gt_map;  // transposed form, box kQueryTile
  CUtensorMap k_interior_map, v_interior_map;  // the interior codes' rows, box kKeyRows
  CUtensorMap kt_map;  // FP16 partials: K transposed, box kKeyRows
  CUtensorMap dq_map;  // FP16 partials: dQ's FP16 accumulator, box kDqWarpRows tokens x kDqFeatures
};

// A producer lane's queries' inputs to the constants (queries lane + 32 j of the tile, j in the
// tile streamer's Share (work_items.cuh), clamped into the document: masked queries' values are
// unused), loaded one step ahead.
struct QueryInputs {
  uint8_t q_scale[kQueriesPerLane], g_scale[kQueriesPerLane];
  float lse[kQueriesPerLane], delta[kQueriesPerLane];
  uint8_t dq_sigma[kQueriesPerLane];  // FP16 partials only
  int8_t dq_beta[kQueriesPerLane];
};
template <class Share, bool kDqPartials>
__device__ __forceinline__ QueryInputs load_query_inputs(const BackwardParams& p, const DocumentSpan& d, int h, int q0,
                                                         int lane) {
  QueryInputs in;
#pragma unroll
  for (int j = Share::kFirst; j < Share::kFirst + Share::kCount; ++j) {
    const int64_t token = d.begin + min(q0 + j * 32 + lane, d.len - 1);
    const int64_t s = token * p.q_heads + h;
    in.q_scale[j] = __ldg(p.q_scales + s);
    in.g_scale[j] = __ldg(p.g_scales + s);
    in.lse[j] = __ldg(p.lse + int64_t(h) * p.total_tokens + token);
    in.delta[j] = __ldg(p.delta + int64_t(h) * p.total_tokens + token);  // D_i, read-only here
    if (kDqPartials) {
      in.dq_sigma[j] = __ldg(p.dq_sigma + int64_t(h) * p.total_tokens + token);
      in.dq_beta[j] = __ldg(p.dq_beta + int64_t(h) * p.total_tokens + token);
    }
  }
  return in;
}
// 2^e for U~'s fold 2^(-eq - sigma), its exponent clamped to the float range: where it would leave
// it, U 2^eq is 0 (a zero dO row's sigma is the smallest scale) or the inputs are beyond any real
// activation's range.
__device__ __forceinline__ float clamped_pow2(int e) { return pow2i(e > 127 ? 127 : e); }
template <class Share, bool kDqPartials>
__device__ __forceinline__ void store_query_consts(const QueryInputs& in, int gamma, int p_boost_log2, int lane,
                                                   QueryTileConsts& c) {
#pragma unroll
  for (int j = Share::kFirst; j < Share::kFirst + Share::kCount; ++j) {
    const int i = j * 32 + lane, eg = scale_exponent(in.g_scale[j]), eq = scale_exponent(in.q_scale[j]);
    const float q_pow = pow2_of_scale(in.q_scale[j]);
    const float p_fold = pow2i(gamma == kNaNExponent ? kNaNExponent : add_exponents(eg, p_boost_log2 - gamma));
    float dq_out = 0.f;
    if (kDqPartials) {
      const bool nan = formats::ue8m0_is_nan(in.q_scale[j]) || formats::ue8m0_is_nan(in.dq_sigma[j]);
      const int sigma = scale_exponent(in.dq_sigma[j]);
      c.dq_fold[i] = nan ? pow2i(kNaNExponent) : clamped_pow2(-eq - sigma);
      dq_out = pow2i(add_exponents(sigma, in.dq_beta[j]));
    }
    c.c[i] = make_float4(q_pow, pow2i(add_exponents(eg, eq)), p_fold, dq_out);
    pair_lse2(c, i) = -(in.lse[j] * kLog2e);
    pair_delta(c, i) = in.delta[j] * q_pow;
  }
}

// Key row r sees the queries q_first[r] <= query < d.len: one unsigned compare per pair.
__device__ __forceinline__ bool visible(int query, int q_first, int len) {
  return unsigned(query - q_first) < unsigned(len - q_first);
}
// The visible pairs of a masked step: key row r sees queries q_first[r] <= q0 + i < len.
struct VisiblePairs {
  int q0, q_first0, q_first1, len;
  __device__ bool operator()(int i, int r) const { return visible(q0 + i, r ? q_first1 : q_first0, len); }
};
// A consumer thread's two key rows (g and g + 8 of its warp's 16): their factors in the exponent and E.
struct KeyRowFactors {
  float k_factor[2];  // 2^ek_j scale log2(e)
  float v_pow[2];     // 2^ev_j
};

// A masked tile (pairs some key must not enter), element by element as the emulation states it:
// P~ = E4M3(p 2^(boost + eg - gamma)) packed into pa (dV's A operand) step by step, so that S^T's
// registers free up early (dK, dV and S^T, E^T would not fit in registers together at D = 128);
// e becomes U 2^eq (dK's, before tau); both 0 on invisible pairs; amax the key row's max of |U 2^eq|.
__device__ __forceinline__ void masked_pu(const float (&s)[kQueryTile / 2], float (&e)[kQueryTile / 2],
                                          const QueryTileConsts& qc, const KeyRowFactors& keys,
                                          const VisiblePairs& pairs, int t, float (&amax)[2],
                                          uint32_t (&pa)[kQueryTile / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < kQueryTile / 32; ++kk) {
    float pf[4][4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
#pragma unroll
      for (int el = 0; el < 4; ++el) {
        const int x = (kk * 4 + b) * 4 + el;
        const int r = el >> 1, i = (kk * 4 + b) * 8 + 2 * t + (el & 1);
        // Computed on every pair, an invisible pair's values then dropped by the selects (a branch
        // per element had cost dK dV 9% on tiny-unaligned).
        const bool pair_visible = pairs(i, r);
        const float4 c = qc.c[i];  // 2^eq, 2^(eg + eq), dV fold
        const float pij = exp2f(s[x] * keys.k_factor[r] * c.x + pair_lse2(qc, i));
        const float eij = e[x] * keys.v_pow[r] * c.y;  // E 2^eq
        const float w = pair_visible ? pij * (eij - pair_delta(qc, i)) : 0.f;
        pf[b][el] = pair_visible ? pij * c.z : 0.f;
        e[x] = w;
        amax[r] = nan_max(amax[r], fabsf(w));
      }
    }
    pack_a_step(pf, pa[kk]);
  }
}

// An interior tile (every pair visible): the same numbers with fewer instructions per element, as
// in backward_dq.cu's interior_u: no mask, the exponent as one fused multiply-add, 2^x on the MUFU
// unit with subnormal results flushed (p < 2^-126 moves dK and dV by less than 2^-126 times
// |E - D| 2^eq or 2^(boost + eg - gamma): nothing next to the rows' probability mass), fmaxf for
// the max (a NaN U element still makes its E4M3 code, and so the key's dK, NaN).
__device__ __forceinline__ void interior_pu(const float (&s)[kQueryTile / 2], float (&e)[kQueryTile / 2],
                                            const QueryTileConsts& qc, const KeyRowFactors& keys, int t,
                                            float (&amax)[2], uint32_t (&pa)[kQueryTile / 32][4]) {
  // Two partial maxima per row (exact in any order): shorter dependency chains.
  float part_max[2][2] = {{amax[0], amax[0]}, {amax[1], amax[1]}};
#pragma unroll
  for (int kk = 0; kk < kQueryTile / 32; ++kk) {
    float pf[4][4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int nb = kk * 4 + b;
      const float4 c2[2] = {qc.c[nb * 8 + 2 * t], qc.c[nb * 8 + 2 * t + 1]};
#pragma unroll
      for (int el = 0; el < 4; ++el) {
        const int r = el >> 1, x = nb * 4 + el, i = nb * 8 + 2 * t + (el & 1);
        const float4 c = c2[el & 1];
        const float pij = exp2_ftz(fmaf(s[x] * c.x, keys.k_factor[r], pair_lse2(qc, i)));
        const float w = pij * fmaf(e[x] * keys.v_pow[r], c.y, -pair_delta(qc, i));
        pf[b][el] = pij * c.z;
        e[x] = w;
        part_max[r][b & 1] = fmaxf(part_max[r][b & 1], fabsf(w));
      }
    }
    pack_a_step(pf, pa[kk]);
  }
  for (int r = 0; r < 2; ++r) amax[r] = fmaxf(part_max[r][0], part_max[r][1]);
}

// The interior step when every 32-query group shares its Q and dO scales (block32 geometry): the
// same numbers as interior_pu with two multiplies per element fewer: the exponent as
// fmaf(S, 2^eq_g k_factor_j, -lse2) and (E 2^ev 2^eg - D) 2^eq as fmaf(E, 2^(ev_j + eg_g + eq_g),
// -D 2^eq), the products of powers of two exact, so each keeps interior_pu's one rounding (except
// where those products leave the float range: scales near 2^+-126).
__device__ __forceinline__ void interior_pu_grouped(const float (&s)[kQueryTile / 2], float (&e)[kQueryTile / 2],
                                                    const QueryTileConsts& qc, const KeyRowFactors& keys, int t,
                                                    float (&amax)[2], uint32_t (&pa)[kQueryTile / 32][4]) {
  static_assert(tiling::kScaleBlock == 32, "one 32-query group per k32 step of the P operand");
  float part_max[2][2] = {{amax[0], amax[0]}, {amax[1], amax[1]}};
#pragma unroll
  for (int kk = 0; kk < kQueryTile / 32; ++kk) {  // step kk holds query group kk
    const float4 cg = qc.c[kk * 32];  // the group's 2^eq, 2^(eg + eq), dV fold (its first query's)
    const float exponent_factor[2] = {cg.x * keys.k_factor[0], cg.x * keys.k_factor[1]};
    const float e_factor[2] = {keys.v_pow[0] * cg.y, keys.v_pow[1] * cg.y};
    float pf[4][4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int nb = kk * 4 + b;
      const float4 lse_delta = qc.pair[nb * 4 + t];  // -LSE log2(e) and D 2^eq of queries 2t, 2t + 1
#pragma unroll
      for (int el = 0; el < 4; ++el) {
        const int r = el >> 1, x = nb * 4 + el;
        const float pij = exp2_ftz(fmaf(s[x], exponent_factor[r], (el & 1) ? lse_delta.y : lse_delta.x));
        const float w = pij * fmaf(e[x], e_factor[r], -((el & 1) ? lse_delta.w : lse_delta.z));
        pf[b][el] = pij * cg.z;
        e[x] = w;
        part_max[r][b & 1] = fmaxf(part_max[r][b & 1], fabsf(w));
      }
    }
    pack_a_step(pf, pa[kk]);
  }
  for (int r = 0; r < 2; ++r) amax[r] = fmaxf(part_max[r][0], part_max[r][1]);
}

// U~'s codes for the dQ partial, E4M3((U 2^eq) 2^ek_j 2^(-eq_i - sigma_i)) from e = U 2^eq (dK's,
// before tau), four per word as store_u_transposed takes them; kMasked: 0 on invisible pairs.
template <bool kMasked>
__device__ __forceinline__ void dq_partials_u_codes(const float (&e)[kQueryTile / 2], const QueryTileConsts& qc,
                                                    const float (&k_pow)[2], int t, const VisiblePairs& pairs,
                                                    uint32_t (&u_words)[kQueryTile / 8]) {
#pragma unroll
  for (int n = 0; n < kQueryTile / 8; ++n) {
    const float2 fold = *reinterpret_cast<const float2*>(qc.dq_fold + 8 * n + 2 * t);
    float x[4];
#pragma unroll
    for (int el = 0; el < 4; ++el) {
      const int r = el >> 1, i = 8 * n + 2 * t + (el & 1);
      x[el] = e[4 * n + el] * k_pow[r] * ((el & 1) ? fold.y : fold.x);
      if (kMasked) x[el] = pairs(i, r) ? x[el] : 0.f;
    }
    u_words[n] = pack_e4m3x4(x[0], x[1], x[2], x[3]);
  }
}

// --- producer ----------------------------------------------------------------------------------
// The item's interior K and V rows into the interior buffer (use m of its ring), once the previous
// item's consumers are done with it, by the interior loader warp (warp 1 of warpgroup 0; lane 0:
// the TMA loads, every lane: the scale bytes). A warp of its own: in a tile streamer's step loop
// its registers made the 24-register producer spill, and at the item's start its wait would hold
// up the item's first steps.
template <int D, int kKeyBuffers>
__device__ __forceinline__ void load_interior_keys(const DkdvArgs& args, const DkdvWork& w, int m,
                                                   DkdvShared<D, kKeyBuffers>& sm) {
  const BackwardParams& p = args.p;
  const int lane = int(threadIdx.x) % 32;
  sm.interior_ring.wait_empty(m);
  if (lane == 0) {
    uint64_t& full = sm.interior_ring.full_barrier(m);
    barrier_expect_bytes(full, 2 * kKeyRows * D);
    tma_load_rows(args.k_interior_map, sm.tail.interior.k, full, w.kvh, w.d.begin + w.k0);
    tma_load_rows(args.v_interior_map, sm.tail.interior.v, full, w.kvh, w.d.begin + w.k0);
  }
#pragma unroll
  for (int j = 0; j < kKeyRows / 32; ++j) {
    const int key = j * 32 + lane;
    const int64_t s = int64_t(w.d.begin + min(w.k0 + key, w.d.len - 1)) * p.kv_heads + w.kvh;
    sm.tail.interior.k_scale[key] = __ldg(p.k_scales + p.interior_scales_shift + s);
    sm.tail.interior.v_scale[key] = __ldg(p.v_scales + p.interior_scales_shift + s);
  }
  sm.interior_ring.arrive_full(m);
}

// An item's steps, the ring's uses step_uses.. on, by tile streamer kStreamer (work_items.cuh):
// wait for an empty stage, TMA its Q, dO, Q^T and dO^T codes (streamer 0's lane 0), store the
// streamer's share of the step's per-query constants (the next step's inputs are loaded meanwhile)
// and arrive on "full". Queries past the document end load the next document's codes,
// transposed slots the quantizer zeroed, or TMA's zeros past the tensor: finite E4M3 codes
// (docs/KERNELS.md, "Loads") that meet exact-zero P~ and U in dV and dK, and columns of S^T and E^T
// that the masked path drops.
template <int D, int kStreamer, int kKeyBuffers, bool kDqPartials = false>
__device__ __forceinline__ void produce_steps(const DkdvArgs& args, const DkdvWork& w, int step_uses,
                                              DkdvShared<D, kKeyBuffers>& sm) {
  using Share = StreamerShare<kStreamer, kQueriesPerLane>;
  const BackwardParams& p = args.p;
  const int lane = int(threadIdx.x) % 32;
  const int doc_slot = int(layout::transposed_document_start(w.d.begin, w.doc));
  auto load_inputs = [&](QuerySteps::Cursor c) {
    return load_query_inputs<Share, kDqPartials>(p, w.d, c.head, c.q0, lane);
  };
  QuerySteps::Cursor at = w.steps.first();
  QueryInputs next = load_inputs(at);
  for (int step = 0; step < w.tiles; ++step) {
    const int h = at.head, q0 = at.q0, use = step_uses + step;
    at = w.steps.next(at);
    DkdvQueryStage<D>& st = sm.stage[sm.ring.stage(use)];
    const QueryInputs inputs = next;
    sm.ring.wait_empty(use);
    if (kStreamer == 0 && lane == 0) {
      uint64_t& full = sm.ring.full_barrier(use);
      barrier_expect_bytes(full, 4 * kQueryTile * D);
      tma_load_rows(args.q_map, st.q, full, h, w.d.begin + q0);
      tma_load_rows(args.g_map, st.g, full, h, w.d.begin + q0);
      tma_load_transposed(args.qt_map, st.qt, full, h, D, doc_slot + q0);
      tma_load_transposed(args.gt_map, st.gt, full, h, D, doc_slot + q0);
    }
    if (step + 1 < w.tiles) next = load_inputs(at);
    store_query_consts<Share, kDqPartials>(inputs, w.gamma, p.p_boost_log2, lane, st.consts);
    sm.ring.arrive_full(use);
  }
}

// Work item `item`, found by a whole warp; false for an idle slot. The grid schedule numbers its
// items as the grid's key tile slots x KV heads (head-major; within a document the first key tiles,
// the costliest causal, first). The persistent schedule takes them in the work order of
// core/schedule.h (the entries before the idle ones x KV heads, head-major: each head's
// costliest key tiles over all documents first): on the short documents that run it (8192+224x256:
// dK dV -5%, H200). The grid schedule keeps the slot order: there the work order made
// the equal-length rows 2.5-4% slower (16x4096, 8x8192), with 16 documents' Q and dO in flight at
// once where the slot order has a few.
static_assert(kKeyRows == order::kWorkTile, "an item's keys are one tile of the work order");
template <bool kPersistent>
__device__ __forceinline__ bool find_work(const BackwardParams& p, int item, int items_per_head, DkdvWork& w) {
  DocumentTile tile;
  const bool found = kPersistent
                         ? ordered_tile<TileFrom::kEnd>(p.work_order, p.cu_seqlens, p.total_tokens,
                                                        item % items_per_head, tile)
                         : document_tile_warp(p.cu_seqlens, p.num_docs, p.total_tokens, kKeyRows,
                                              item % items_per_head, tile);
  if (!found) return false;
  w.d = tile.span;
  w.doc = tile.doc;
  w.k0 = tile.tile * kKeyRows;
  w.kvh = item / items_per_head;
  const int group = p.q_heads / p.kv_heads;
  // gamma: each head's running max of dO's scale exponents at the document's last token; UE8M0
  // bytes order like exponents, NaN (0xFF) the largest.
  uint8_t gamma_code = 0;
  for (int h = w.kvh * group; h < (w.kvh + 1) * group; ++h)
    gamma_code = uint8_t(max(int(gamma_code), int(p.g_scale_prefix_max[int64_t(w.d.end - 1) * p.q_heads + h])));
  w.gamma = scale_exponent(gamma_code);
  const int q_begin = p.causal ? w.k0 : 0;  // k0 is a multiple of kQueryTile: a query tile start
  const int tiles_per_head = (w.d.len - q_begin + kQueryTile - 1) / kQueryTile;
  w.steps = QuerySteps{w.kvh * group, q_begin, q_begin + tiles_per_head * kQueryTile};
  w.tiles = group * tiles_per_head;
  return true;
}

// The scale bytes of an item's keys (lane = key mod 32), so that the consumers start an item
// without a global load.
__device__ __forceinline__ void store_key_bytes(const BackwardParams& p, const DkdvWork& w, int lane,
                                                DkdvKeyInfo& info) {
#pragma unroll
  for (int j = 0; j < kKeyRows / 32; ++j) {
    const int key = j * 32 + lane;
    const int64_t s = int64_t(w.d.begin + min(w.k0 + key, w.d.len - 1)) * p.kv_heads + w.kvh;
    info.k_scale[key] = __ldg(p.k_scales + s);
    info.v_scale[key] = __ldg(p.v_scales + s);
  }
}

// Item n's K and V rows into key buffer n % kKeyBuffers (lane 0: the item and the TMA loads; with
// FP16 dQ partials K^T too, into the one buffer of the grid schedule) and its keys' scale bytes
// (every lane); the caller then arrives on the buffer's "full".
template <int D, int kKeyBuffers, bool kDqPartials = false>
__device__ __forceinline__ void publish_item(const DkdvArgs& args, const DkdvWork& w, int n,
                                             DkdvShared<D, kKeyBuffers>& sm) {
  static_assert(!kDqPartials || kKeyBuffers == 1, "FP16 dQ partials run the grid schedule");
  const int b = sm.keys_ring.stage(n), lane = int(threadIdx.x) % 32;
  if (lane == 0) {
    uint64_t& full = sm.keys_ring.full_barrier(n);
    barrier_expect_bytes(full, (kDqPartials ? 3 : 2) * kKeyRows * D);
    tma_load_rows(args.k_map, sm.k[b], full, w.kvh, w.d.begin + w.k0);
    tma_load_rows(args.v_map, sm.v[b], full, w.kvh, w.d.begin + w.k0);
    if (kDqPartials)
      tma_load_transposed(args.kt_map, sm.tail.partials.kt, full, w.kvh, D,
                          int(layout::transposed_document_start(w.d.begin, w.doc)) + w.k0);
  }
  store_key_bytes(args.p, w, lane, sm.info[b]);
}

// Persistent: tile streamer 0 (warp 0) runs the CTA's items (work_items.cuh's
// produce_work_items), per item its key buffer, then its share of the steps; streamer 1 (warp 2)
// streams its share of each published item's steps.
template <int D, int kKeyBuffers, bool kInteriorCodes>
__device__ __forceinline__ void produce_items(const DkdvArgs& args, DkdvShared<D, kKeyBuffers>& sm) {
  const BackwardParams& p = args.p;
  const bool streamed = run_as_tile_streamer([&](auto streamer) {
    if constexpr (decltype(streamer)::value == 0) {
      const int tiles = __ldg(p.work_order_tiles);
      produce_work_items<DkdvWork>(
          p.work_counter, tiles * p.kv_heads, sm.keys_ring, sm.info,
          [&](int item, DkdvWork& w) { return find_work<true>(p, item, tiles, w); },
          [&](const DkdvWork& w, int n) { publish_item(args, w, n, sm); },
          [&](const DkdvWork&, int n, int step_uses) {
            // The item as lane 0 stored it, read from shared memory at each step rather than held
            // in registers through the step loop (the producer's registers are few; this warp alone
            // writes it).
            __syncwarp();
            produce_steps<D, 0>(args, sm.info[sm.keys_ring.stage(n)].work, step_uses, sm);
          });
    } else {
      // A copy in registers: streamer 0 may overwrite the buffer's item once the consumers are
      // done with it, which this warp's last arrival allows.
      stream_work_items<DkdvWork>(sm.keys_ring, sm.info, [&](const DkdvWork& w, int, int step_uses) {
        produce_steps<D, 1>(args, w, step_uses, sm);
      });
    }
  });
  if (streamed || !kInteriorCodes) return;
  // Warp 1, the interior loader: each published item in turn, its interior keys when it has
  // interior steps; it releases each key buffer too (kKeyRingReleases), so that streamer 0 cannot
  // publish over an item it has not read yet.
  int interior_uses = 0;  // the CTA's items with interior steps so far
  for_each_published_item<DkdvWork, true>(sm.keys_ring, sm.info, [&](const DkdvWork& w, int, int) {
    if (has_interior_steps<kInteriorCodes>(w)) load_interior_keys(args, w, interior_uses++, sm);
  });
}

// --- consumers ---------------------------------------------------------------------------------
// A step's dQ partial rows: the query head, the tile's first token and this thread's two rows'
// factors 2^(sigma_i + beta_i) (0 past the document end).
struct DqPartialRows {
  int head;
  int first_token;
  float factor0, factor1;
};
// The step's dQ partial (FP16 partials): U~ . K for this consumer's kDqFeatures features, times the
// rows' factors, as FP16 into this consumer's out tile; each warp's lane 0 adds the warp's 16 rows
// into dQ's accumulator (TMA reduce-add) once its lanes wrote them, with no barrier across the
// warpgroup. dq_tile: the accumulator registers to use.
template <int D>
__device__ __forceinline__ void add_dq_partial(const DkdvArgs& args, DqPartialBuffers<D>& partials,
                                               const DqPartialRows& rows, int use,
                                               float (&dq_tile)[kDqFeatures / 2]) {
  const auto [consumer, warp, lane, g, t] = consumer_thread();
  const int warp_in_group = warp % 4;
  const float row_factor[2] = {rows.factor0, rows.factor1};
  wgmma_fence();
  rows_product<kKeyRows, kDqFeatures, SmemLayout::kSwizzle128B>(dq_tile, partials.u[use & 1],
                                                                 partials.kt + consumer * kDqFeatures * kKeyRows);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(dq_tile);
  const uint32_t out = smem_address(partials.out[consumer][use & 1]);
  dq_partials::store_partial_fp16(out, dq_tile, row_factor, warp_in_group, lane);
  dq_partials::fence_shared_for_async();
  __syncwarp();
  if (lane == 0) {
    dq_partials::tma_reduce_add(args.dq_map, out + warp_in_group * kDqWarpRows * dq_partials::kRowBytes,
                                consumer * kDqFeatures, rows.head, rows.first_token + warp_in_group * kDqWarpRows);
    dq_partials::bulk_commit();
    dq_partials::bulk_wait_read<1>();  // the out tile of use - 1 is free for use + 1
  }
}

// The epilogue: an item's dK (times the softmax scale) and dV (times 2^(gamma - boost), undoing
// P~'s fold) rows as BF16; keys past the document end are not stored.
template <int D>
__device__ __forceinline__ void store_dk_dv(const BackwardParams& p, const DkdvWork& w, const int (&keys)[2],
                                            const float (&dk_acc)[D / 2], const float (&dv_acc)[D / 2], int t) {
  const float dv_factor = w.gamma == kNaNExponent ? pow2i(kNaNExponent) : pow2i(w.gamma - p.p_boost_log2);
  auto* dk = static_cast<__nv_bfloat16*>(p.dk);
  auto* dv = static_cast<__nv_bfloat16*>(p.dv);
  for (int r = 0; r < 2; ++r) {
    const bool in_doc = keys[r] < w.d.len;
    const int64_t token = w.d.begin + (in_doc ? keys[r] : 0);
    store_row_bf16(dk_acc, r, p.softmax_scale, dk + token * p.dk_stride_token + w.kvh * p.dk_stride_head, t, in_doc);
    store_row_bf16(dv_acc, r, dv_factor, dv + token * p.dv_stride_token + w.kvh * p.dv_stride_head, t, in_doc);
  }
}

// A warpgroup of 64 keys of one item (key buffer b, steps at the ring's uses step_uses..); per step:
// S^T and E^T, P~ and U (into pa and e), tau, dV += P~^T.dO and dK += 2^tau U~^T.Q, then the stage
// is released.
// interior_use: the item's use of the interior ring (with interior steps), released after its last
// step. kDqPartials: each step also adds its dQ partial (DqPartialBuffers).
template <int D, int kKeyBuffers, bool kTurns, bool kInteriorCodes, bool kDqPartials = false>
__device__ __forceinline__ void consume(const DkdvArgs& args, const DkdvWork& w, int b, int step_uses,
                                        int interior_use, DkdvShared<D, kKeyBuffers>& sm,
                                        const ConsumerTurns<kTurns>& turns) {
  const BackwardParams& p = args.p;
  const DocumentSpan& d = w.d;
  const auto [consumer, warp, lane, g, t] = consumer_thread();
  const int wg_key = consumer * kWarpgroupRows;  // this warpgroup's first key in the block
  const int block_keys[2] = {warp * 16 + g, warp * 16 + g + 8};  // of the item's 128
  const int keys[2] = {w.k0 + block_keys[0], w.k0 + block_keys[1]};
  const float scale_log2e = p.softmax_scale * kLog2e;
  KeyRowFactors key_rows;
  auto key_factors = [&](const uint8_t* k_scale, const uint8_t* v_scale) {
    for (int r = 0; r < 2; ++r) {
      key_rows.k_factor[r] = pow2_of_scale(k_scale[block_keys[r]]) * scale_log2e;
      key_rows.v_pow[r] = pow2_of_scale(v_scale[block_keys[r]]);
    }
  };
  key_factors(sm.info[b].k_scale, sm.info[b].v_scale);
  bool factors_interior = false;  // whose factors key_rows holds
  constexpr SmemLayout kRowsLayout = kSwizzleFor<D>, kTransposedLayout = kSwizzleFor<kQueryTile>;
  const uint8_t* k_rows = sm.k[b] + wg_key * D;
  const uint8_t* v_rows = sm.v[b] + wg_key * D;

  int q_first[2];  // key row r sees the queries q_first[r] <= query < d.len (d.len: none)
  for (int r = 0; r < 2; ++r) q_first[r] = keys[r] >= d.len ? d.len : p.causal ? keys[r] : 0;
  static_assert(!kDqPartials || (D == kConsumers * kDqFeatures && !kInteriorCodes && kKeyBuffers == 1),
                "FP16 dQ partials: D = 128, document isolation, the grid schedule");

  float dk_acc[D / 2], dv_acc[D / 2];
  zero(dk_acc);
  zero(dv_acc);
  // The step's query tile: by cursor in the grid kernel (the division per step was ~4% of its
  // time at 16x4096), by division in the persistent one (at 232 registers it measured 5% slower
  // on tiny-unaligned carrying the cursor from step to step).
  constexpr bool kPersistent = kKeyBuffers == DkdvSchedule<true>::kKeyBuffers;
  // With kTurns, S^T and E^T of a step are issued in a turn (tma.cuh; a turn around dV's and dK's
  // products as well measured 0.3-6% slower).
  QuerySteps::Cursor at = w.steps.first();
  for (int step = 0; step < w.tiles; ++step, at = w.steps.next(at)) {
    const int q0 = kPersistent ? w.steps.at(step).q0 : at.q0, use = step_uses + step;
    const DkdvQueryStage<D>& st = sm.stage[sm.ring.stage(use)];
    // The step's K and V rows and factors: the interior codes' on interior steps.
    const bool interior_codes = reads_interior_codes<kInteriorCodes>(w, q0);
    if (interior_codes != factors_interior) {  // twice per head at most; never without interior codes
      if (step == kFirstInteriorStep) sm.interior_ring.wait_full(interior_use);
      factors_interior = interior_codes;
      if (interior_codes) key_factors(sm.tail.interior.k_scale, sm.tail.interior.v_scale);
      else key_factors(sm.info[b].k_scale, sm.info[b].v_scale);
    }
    // As shifts from key buffer b's rows: selecting whole pointers per step made the consumers spill.
    const uint8_t* k_step = k_rows + (interior_codes ? smem_distance(sm.k[b], sm.tail.interior.k) : 0);
    const uint8_t* v_step = v_rows + (interior_codes ? smem_distance(sm.v[b], sm.tail.interior.v) : 0);
    sm.ring.wait_full(use);

    // S^T = K . Q^T and E^T = V . dO^T: 64 keys x 64 queries each, D/32 k-steps.
    float s[kQueryTile / 2], e[kQueryTile / 2];
    score_products<D, kQueryTile, kRowsLayout>(s, k_step, st.q, e, v_step, st.g, turns);

    // P~ into pa (dV's operand), e in place becomes dK's before tau. Interior: every (key, query)
    // pair of the warpgroup visible (queries inside the document and, causal, its last key before
    // the first query; the branch is uniform over the warpgroup).
    float amax[2] = {0.f, 0.f};
    uint32_t pa[kQueryTile / 32][4], ua[kQueryTile / 32][4];
    const bool interior = q0 + kQueryTile <= d.len && (!p.causal || w.k0 + wg_key + kWarpgroupRows - 1 <= q0);
    const VisiblePairs pairs{q0, q_first[0], q_first[1], d.len};
    if (interior) {
      if (p.group_scales) interior_pu_grouped(s, e, st.consts, key_rows, t, amax, pa);
      else interior_pu(s, e, st.consts, key_rows, t, amax, pa);
    } else {
      masked_pu(s, e, st.consts, key_rows, pairs, t, amax, pa);
    }
    const RowScales tau = ceil_row_scales(amax);
    pack_a_operand_scaled<kQueryTile>(e, tau.inv, ua);
    if constexpr (kDqPartials) {
      // U~ = E4M3((U 2^eq) 2^ek_j 2^(-eq_i - sigma_i)), 0 on invisible pairs (the select also keeps a
      // NaN scale of a key or row the pair never sees out), into the step's U~ tile. (Stored after
      // the products below are issued instead, it held more registers through them: 3% slower.)
      uint32_t u_words[kQueryTile / 8];
      float k_pow[2];  // 2^ek_j, read again at each step rather than held in registers through the loop
      for (int r = 0; r < 2; ++r) k_pow[r] = pow2_of_scale(sm.info[b].k_scale[block_keys[r]]);
      // Interior steps have no invisible pair: a loop of their own without the selects.
      if (interior) dq_partials_u_codes<false>(e, st.consts, k_pow, t, VisiblePairs{}, u_words);
      else dq_partials_u_codes<true>(e, st.consts, k_pow, t, pairs, u_words);
      dq_partials::store_u_transposed<kQueryTile>(smem_address(sm.tail.partials.u[use & 1]), u_words, warp, lane);
    }

    // dV += P~^T . dO codes;  dK += 2^tau (U~^T . Q codes) (B: the transposed, permuted forms).
    // With FP16 dQ partials, dK's product runs in two parts of D / 2 features through one tile of
    // that size, so that the tile holds 32 registers next to dK and dV, not 64 (with the dQ step's
    // registers, one tile of D features spilled dK's accumulators): part 0 and dV are issued, part 0
    // is added while dV runs, then part 1. (The deterministic instances keep one tile of D features:
    // for them the second wait per step measured 2-4% slower.)
    constexpr int kDkParts = kDqPartials ? 2 : 1;
    constexpr int kDkPartFeatures = D / kDkParts;
    float part_tile[kDkPartFeatures / 2];  // dK's parts, then (FP16 partials) the dQ partial
    zero(part_tile);
    fence_accumulators(dv_acc);
    wgmma_fence();
    register_product<kDkPartFeatures, kQueryTile, kTransposedLayout>(part_tile, ua, st.qt);
    wgmma_commit();
    register_product<D, kQueryTile, kTransposedLayout>(dv_acc, pa, st.gt);
    wgmma_commit();
    // Both consumers' U~ halves in the tile (while the products run). The fence that makes this
    // thread's U~ stores visible to the dQ product waits for them to drain (MEMBAR): after the
    // products' issue, so that they do not wait with it.
    if (kDqPartials) {
      dq_partials::fence_shared_for_async();
      named_barrier_sync(NamedBarrier::kDqPartialsUTile, 2 * 128);
    }
    if constexpr (kDkParts == 1) wgmma_wait<0>();
    else wgmma_wait<1>();  // part 0 done, dV may still run
    fence_accumulators(part_tile);
    add_scaled_rows(dk_acc, part_tile, tau.pow);
    if constexpr (kDkParts == 2) {
      zero(part_tile);  // the first k-step accumulates
      wgmma_fence();
      register_product<kDkPartFeatures, kQueryTile, kTransposedLayout>(part_tile, ua,
                                                                      st.qt + kDkPartFeatures * kQueryTile);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(part_tile);
      add_scaled_rows<kDkPartFeatures / 2>(dk_acc, part_tile, tau.pow);
    }
    fence_accumulators(dv_acc);
    if constexpr (kDqPartials) {
      float row_factor[2];  // 2^(sigma_i + beta_i) of this thread's rows, 0 past the document end
      for (int r = 0; r < 2; ++r) {
        const int row = 16 * (warp % 4) + g + 8 * r;
        row_factor[r] = q0 + row < d.len ? st.consts.c[row].w : 0.f;
      }
      if (lane == 0) sm.ring.arrive_empty(use);  // this warp is done with the step's tiles
      // In part_tile's registers: its dK sums come first, not sunk below the dQ product's issue
      // (a tile of its own there raised the step's register peak by 32).
      static_assert(kDqFeatures == kDkPartFeatures, "the dQ partial reuses dK's part tile");
      add_dq_partial(args, sm.tail.partials, DqPartialRows{at.head, d.begin + q0, row_factor[0], row_factor[1]}, use,
                     part_tile);
    } else {
      if (lane == 0) sm.ring.arrive_empty(use);  // this warp is done with the step's tiles
    }
  }
  if (kDqPartials && lane == 0) dq_partials::bulk_wait_all();
  // and with the interior keys
  if (has_interior_steps<kInteriorCodes>(w) && lane == 0) sm.interior_ring.arrive_empty(interior_use);

  store_dk_dv<D>(p, w, keys, dk_acc, dv_acc, t);
}

// kTurns: the grid schedule's consumers take turns (kernel_problem.h's consumers_take_turns); the
// persistent schedule, for short documents, never does (the launcher), as turns cost short items.
// kDqPartials: the FP16 dQ partials (grid schedule, no turns: the consumers meet at every step).
template <int D, bool kPersistent, bool kTurns, bool kInteriorCodes, bool kDqPartials = false>
__global__ void __launch_bounds__(kThreads, 1) backward_dkdv_kernel(const __grid_constant__ DkdvArgs args) {
  static_assert(!(kPersistent && kTurns), "the persistent schedule (short documents) takes no turns");
  static_assert(!(kDqPartials && (kPersistent || kTurns || kInteriorCodes)), "FP16 partials: grid, no turns");
  static_assert(!(kTurns && kInteriorCodes), "interior codes are prefix isolation's: its dK dV takes no turns");
  using Schedule = DkdvSchedule<kPersistent>;
  auto& sm = aligned_shared_storage<DkdvSharedFor<D, kPersistent>>();
  auto init = [&] {
    sm.ring.init(kStreamerLanes, kConsumerWarps);
    sm.keys_ring.init(kProducerLanes, kKeyRingReleases<kPersistent, kInteriorCodes>);
    // The interior loader's lanes fill the interior keys.
    if (kInteriorCodes) sm.interior_ring.init(kProducerLanes, kConsumerWarps);
  };
  if constexpr (kPersistent) {
    run_roles<Schedule::kProducerRegisters, Schedule::kConsumerRegisters, kStreamerRoleWarps>(
        init, [&] { produce_items<D, Schedule::kKeyBuffers, kInteriorCodes>(args, sm); },
        [&] {
          int interior_uses = 0;  // the CTA's items with interior steps so far
          consume_work_items<DkdvWork>(sm.keys_ring, sm.info, [&](const DkdvWork& w, int n, int step_uses) {
            consume<D, Schedule::kKeyBuffers, false, kInteriorCodes>(args, w, sm.keys_ring.stage(n), step_uses,
                                                                     interior_uses, sm, ConsumerTurns<false>{});
            interior_uses += has_interior_steps<kInteriorCodes>(w);
          });
        });
  } else {
    // One item per CTA (launch_over_tile_slots: blockIdx.x its key tile slot, blockIdx.y its KV
    // head), found by every warp; an idle slot's CTA leaves before any barrier.
    DkdvWork w;
    if (!find_work<false>(args.p, int(blockIdx.y * gridDim.x + blockIdx.x), int(gridDim.x), w)) return;
    run_roles<Schedule::kProducerRegisters, Schedule::kConsumerRegisters, kStreamerRoleWarps>(
        init,
        [&] {
          run_as_tile_streamer([&](auto streamer) {
            if constexpr (decltype(streamer)::value == 0) {
              publish_item<D, Schedule::kKeyBuffers, kDqPartials>(args, w, 0, sm);
              sm.keys_ring.arrive_full(0);
            }
            produce_steps<D, decltype(streamer)::value, Schedule::kKeyBuffers, kDqPartials>(args, w, 0, sm);
          });
          // Warp 1, the interior loader (see produce_items).
          if (threadIdx.x / 32 == 1 && has_interior_steps<kInteriorCodes>(w))
            load_interior_keys(args, w, 0, sm);
        },
        [&] {
          const ConsumerTurns<kTurns> turns{consumer_thread().consumer};
          turns.open();
          sm.keys_ring.wait_full(0);
          consume<D, Schedule::kKeyBuffers, kTurns, kInteriorCodes, kDqPartials>(args, w, 0, 0, 0, sm, turns);
          turns.close();
        });
  }
}

// The shared-memory tail an instance uses.
constexpr DkdvTailUse tail_use(DkdvInstance k) {
  return k.dq_partials ? DkdvTailUse::kDqPartials : k.interior_codes ? DkdvTailUse::kInteriorKeys : DkdvTailUse::kNone;
}
// Launches instance kDkdvInstances[I] at head dim D (the FP16 partials' exists at D = 128 only).
template <int D, size_t I>
cudaError_t launch_instance(const DkdvArgs& args, cudaStream_t stream) {
  constexpr DkdvInstance k = kDkdvInstances[I];
  if constexpr (k.dq_partials && D != kConsumers * kDqFeatures) {
    return cudaErrorInvalidValue;
  } else {
    const BackwardParams& p = args.p;
    const auto kernel = backward_dkdv_kernel<D, k.persistent, k.turns, k.interior_codes, k.dq_partials>;
    constexpr size_t kSmem = kDkdvSharedBytes<D, k.persistent, tail_use(k)>;
    if constexpr (k.persistent) {
      const int64_t items = order::table_entries(p.total_tokens, p.num_docs) * p.kv_heads;
      return launch_persistent(kernel, args, kSmem, kThreads, items, p.work_counter, stream);
    } else {
      return launch_over_tile_slots(kernel, args, kSmem, kThreads, p.total_tokens, p.num_docs, kKeyRows, p.kv_heads,
                                    stream);
    }
  }
}
// Launches the table's entry equal to `chosen`.
template <int D, size_t... I>
cudaError_t launch_chosen(DkdvInstance chosen, const DkdvArgs& args, cudaStream_t stream, std::index_sequence<I...>) {
  cudaError_t e = cudaErrorInvalidValue;
  (void)((chosen == kDkdvInstances[I] && (e = launch_instance<D, I>(args, stream), true)) || ...);
  return e;
}

}  // namespace

int launch_backward_dkdv(const BackwardParams& p, void* stream) {
  return for_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    DkdvArgs args{};
    args.p = p;
    cudaError_t e = rows_form_maps(args.k_map, args.k_interior_map, p.k_codes, p.k_interior_codes, p.total_tokens,
                                   p.kv_heads, D, kKeyRows);
    if (e == cudaSuccess)
      e = rows_form_maps(args.v_map, args.v_interior_map, p.v_codes, p.v_interior_codes, p.total_tokens, p.kv_heads,
                         D, kKeyRows);
    if (e == cudaSuccess) e = rows_form_map(args.q_map, p.q_codes, p.total_tokens, p.q_heads, D, kQueryTile);
    if (e == cudaSuccess) e = rows_form_map(args.g_map, p.g_codes, p.total_tokens, p.q_heads, D, kQueryTile);
    if (e == cudaSuccess) e = transposed_form_map(args.qt_map, p.q_codes_t, p.t_pitch, p.q_heads, D, kQueryTile);
    if (e == cudaSuccess) e = transposed_form_map(args.gt_map, p.g_codes_t, p.t_pitch, p.q_heads, D, kQueryTile);
    if (e != cudaSuccess) return e;
    if (p.dq_partials) {  // the FP16 partials' maps: K transposed (B of dQ) and dQ's FP16 accumulator
      if (!dq_partials_supported(D, p.causal, p.interior_codes, p.total_tokens, p.num_docs))
        return cudaErrorInvalidValue;
      e = transposed_form_map(args.kt_map, p.k_codes_t, p.t_pitch, p.kv_heads, D, kKeyRows);
      if (e == cudaSuccess)
        e = fp16_rows_map(args.dq_map, p.dq, p.total_tokens, p.q_heads, D, p.dq_stride_token, p.dq_stride_head,
                          kDqWarpRows, kDqFeatures);
      if (e != cudaSuccess) return e;
    }
    return launch_chosen<D>(dkdv_instance(p), args, static_cast<cudaStream_t>(stream),
                            std::make_index_sequence<std::size(kDkdvInstances)>{});
  });
}

}  // namespace flamia::cuda::sm90
