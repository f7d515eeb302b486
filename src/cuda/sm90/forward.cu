// MXFP8 attention forward on Hopper: FP8 wgmma (m64nNk32 e4m3), warp-specialized and persistent.
// A work item is a (tile of 128 queries of one document, query head), in the work order of
// core/schedule.h (each head's costliest tiles first); one CTA per SM takes items in turn from a
// counter (launch.cuh's launch_persistent). A CTA has three warpgroups:
//   - warpgroup 0 is the producer: one warp finds each item's document, loads its Q tile (into one
//     of two buffers, so the next item's Q lands while this one runs) with its rows' scale bytes,
//     and then each key tile (K rows and V^T, written transposed and key-permuted by the quantizer)
//     with TMA into a ring of kStages shared-memory stages that runs on across items, and the key
//     tile's scale factors with ordinary loads;
//   - warpgroups 1 and 2 are consumers, 64 query rows each, reading every stage in turn.
// Q tiles and stages pass between them through mbarriers (tma.cuh): "full" when the loads landed,
// "empty" when both consumers are done. Each consumer overlaps its softmax with the tensor cores:
// in step i it issues S_i = Q.K_i and O += P~_{i-1}.V_{i-1} together, and computes the softmax of
// S_i while the second product runs (FA3's intra-warpgroup overlap); with the grouped arithmetic on
// long documents the two consumers take turns at issuing (FA3's ping-pong: tma.cuh's ConsumerTurns),
// and at the tile loop's softmax.
// It implements the emulation's numerics as docs/NUMERICS.md states them. In prefix isolation with
// block32 geometry (the kInteriorCodes instances) the tiles kFrontierTiles or more before the
// diagonal one read K's and V's block32 codes and take the grouped arithmetic, the others their
// per-token codes (core/tiling.h's interior pairs).
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
#include <cstdlib>

#include "core/operand_layout.h"
#include "core/tiling.h"
#include "cuda/schedule/document_span.cuh"
#include "cuda/schedule/launch.cuh"
#include "cuda/schedule/work_items.cuh"
#include "cuda/sm90/accumulator.cuh"
#include "cuda/sm90/forward.h"
#include "cuda/sm90/forward_tile.cuh"
#include "cuda/sm90/fp8_math.cuh"
#include "cuda/sm90/key_scales.cuh"
#include "cuda/sm90/step_timeline.cuh"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "formats/scales.h"

namespace flamia::cuda::sm90 {
namespace {

using namespace forward_tile;

constexpr int kStages = 5;  // tile i's K and V, tile i-1's V (still in P.V), tiles i+1.. landing
constexpr int kQueryBuffers = 2;  // item n's Q tile in buffer n % 2: item n + 1's loads while n runs
constexpr int kProducerLanes = 32;   // the Q ring's producer warp (the publisher)

template <int D>
struct SharedTiles {
  alignas(1024) uint8_t q[kQueryBuffers][kQueryRows * D];
  KeyTileStage<D> stage[kStages];
  QueryTileInfo info[kQueryBuffers];
  StageRing<kStages> ring;         // key tiles, use i = the CTA's i-th key tile over all its items
  StageRing<kQueryBuffers> q_ring;  // Q tiles, use n = the CTA's n-th item
};
// The dynamic shared memory's base is only 16-byte aligned: the kernel rounds it up.
template <int D>
constexpr size_t kSharedBytes = sizeof(SharedTiles<D>) + 1024;
static_assert(kSharedBytes<128> <= 227 * 1024, "one CTA per SM must fit in shared memory");

// The TMA tensor maps of the codes, besides the plain parameters.
struct ForwardArgs {
  ForwardParams p;
  CUtensorMap q_map;      // Q codes [T, Hq, D]: box D x 1 x kQueryRows
  CUtensorMap k_map[2];   // K codes [T, Hkv, D]: box D x 1 x kKeyTile; [1]: the interior codes
  CUtensorMap vt_map[2];  // V^T codes [Hkv * D, vt_pitch]: box kKeyTile x D; [1]: the interior codes
};

// --- producer ----------------------------------------------------------------------------------
using TileScaleBytes = LaneScaleBytes<kKeyTile>;
// The per-key factors of the softmax paths (keys past the document end: k_col 0, so masked).
// v_pow_j = 2^(ev_j - c) is 2^ev_j (ev_j = 0 past the document end) times the item's inv_c = 2^-c: a
// product of two powers of two, exactly pow2i(ev_j - c) (the kernels do not flush subnormals: a product
// down to 2^-149 is exact, below it rounds to 0 like pow2i; above 2^127 it is inf; NaN stays NaN; a
// build with -ftz would break this).
// (pow2i's compare chain per key cost the forward ~1% on long documents: the producer's
// instructions share an SM sub-partition's issue slots with two consumer warps.)
template <int D, int kFirst, int kCount>
__device__ __forceinline__ void store_lane_scales(const TileScaleBytes& b, const CtaWork& w, float inv_c, int k0,
                                                  int lane, KeyTileStage<D>& st) {
#pragma unroll
  for (int j = kFirst; j < kFirst + kCount; ++j) {
    const int key = j * 32 + lane;
    const bool in_doc = k0 + key < w.len;
    st.k_col[key] = in_doc ? pow2_of_scale(b.k_byte(j)) : 0.f;
    st.v_scale[key] = in_doc ? b.v_byte(j) : 0;
    st.v_pow[key] = (in_doc ? pow2_of_scale(b.v_byte(j)) : 1.f) * inv_c;
  }
}

// A grouped tile's factors (tile_grouped), by streamer 0's lanes g < kTileGroups, one group each:
// 2^ek_g at the group's first key (where interior_tile_grouped reads it; on tile 0 the per-key
// stores hold it) and {e_g, 2^-e_g} of the V fold in the exponent (GroupFold above).
template <int D>
__device__ __forceinline__ void store_group_factors(uint32_t group_bytes, int neg_c, bool with_k_col, int lane,
                                                    KeyTileStage<D>& st) {
  if (lane >= kTileGroups) return;
  const uint8_t k_byte = uint8_t(group_bytes), v_byte = uint8_t(group_bytes >> 8);
  if (with_k_col) st.k_col[lane * tiling::kScaleBlock] = pow2_of_scale(k_byte);
  st.group_fold[lane] = group_fold_factor(v_byte, neg_c);
}

// An item's key tiles, the ring's uses key_uses.. on, by tile streamer kStreamer (work_items.cuh):
// per key tile i, wait until its stage is empty, TMA its K and V^T codes (streamer 0's lane 0),
// store the tile's scale factors (the bytes of tile i + 1 are loaded meanwhile), then every lane
// arrives on "full". Tile 0 (it may be masked) and tiles of per-key arithmetic take per-key factors,
// each streamer its share of every lane's keys; grouped tiles one set per 32-key group, which
// streamer 0 stores alone (tile 0 takes both when grouped: it may be interior when not causal).
// (The streamers' instructions share the consumers' issue slots: a probe without the per-key
// factors of grouped tiles ran the forward 0.5-7% faster.) Keys past the document end load the next
// document's codes, transposed slots the quantizer zeroed, or TMA's zeros past the tensor: finite
// E4M3 codes (docs/KERNELS.md, "Loads") whose P is exactly 0, and columns of S that the masked path
// drops.
template <int D, int kStreamer, bool kInteriorCodes>
__device__ __forceinline__ void produce_key_tiles(const ForwardArgs& args, const CtaWork& w, int key_uses,
                                                  SharedTiles<D>& sm) {
  using Share = StreamerShare<kStreamer, TileScaleBytes::kKeysPerLane>;
  const ForwardParams& p = args.p;
  const int lane = int(threadIdx.x) % 32;
  const int vt_doc_start = int(layout::transposed_document_start(w.doc_begin, w.doc));
  auto per_key = [&](int i) { return i == 0 || !tile_grouped<kInteriorCodes>(p, i); };
  auto load_scales = [&](int i) {
    const int64_t shift = tile_codes<kInteriorCodes>(i) * p.interior_scales_shift;
    return per_key(i) ? load_lane_scale_bytes<kKeyTile, Share::kFirst, Share::kCount>(
                            p.k_scales + shift, p.v_scales + shift, p.kv_heads, w.kvh, w.doc_begin, w.len,
                            key_tile_start(w, i), lane)
                      : TileScaleBytes{0u, 0u};
  };
  auto load_group_scales = [&](int i) {
    const int64_t shift = tile_codes<kInteriorCodes>(i) * p.interior_scales_shift;
    return kStreamer == 0 && tile_grouped<kInteriorCodes>(p, i)
               ? load_group_scale_bytes<kKeyTile>(p.k_scales + shift, p.v_scales + shift, p.kv_heads, w.kvh,
                                                  w.doc_begin, w.len, key_tile_start(w, i), lane)
               : 0u;
  };
  TileScaleBytes next = load_scales(0);
  uint32_t next_groups = load_group_scales(0);
  const int neg_c = w.c_exp == kNaNExponent ? kNaNExponent : -w.c_exp;
  const float inv_c = pow2i(neg_c);
  timeline::StepClock clock = timeline::StepClock::for_streamer(kStreamer, lane);  // timeline builds only
  for (int i = 0; i < w.tiles; ++i) {
    const int k0 = key_tile_start(w, i), use = key_uses + i;
    KeyTileStage<D>& st = sm.stage[sm.ring.stage(use)];
    const TileScaleBytes bytes = next;
    const uint32_t group_bytes = next_groups;
    sm.ring.wait_empty(use);
    clock.at_step(use);
    clock.stamp(timeline::kStageFree);
    if (kStreamer == 0 && lane == 0) {
      uint64_t& full = sm.ring.full_barrier(use);
      barrier_expect_bytes(full, 2 * kKeyTile * D);
      tma_load_rows(args.k_map[tile_codes<kInteriorCodes>(i)], st.k, full, w.kvh, w.doc_begin + k0);
      tma_load_transposed(args.vt_map[tile_codes<kInteriorCodes>(i)], st.vt, full, w.kvh, D, vt_doc_start + k0);
    }
    if (i + 1 < w.tiles) {
      next = load_scales(i + 1);
      next_groups = load_group_scales(i + 1);
    }
    if (per_key(i)) store_lane_scales<D, Share::kFirst, Share::kCount>(bytes, w, inv_c, k0, lane, st);
    if (kStreamer == 0 && tile_grouped<kInteriorCodes>(p, i)) store_group_factors(group_bytes, neg_c, i != 0, lane, st);
    sm.ring.arrive_full(use);
    clock.stamp(timeline::kTileHandedOn);
  }
}

// Work item `item` (work_items.cuh's query tile items), found by the whole producer warp.
static_assert(kQueryRows == order::kWorkTile, "an item's rows are one tile of the work order");
__device__ __forceinline__ bool find_work(const ForwardParams& p, int item, int tiles, CtaWork& w) {
  QueryTileItem it;
  if (!find_query_tile_item(p, item, tiles, it)) return false;
  w.doc = it.doc;
  w.doc_begin = it.span.begin;
  w.doc_end = it.span.end;
  w.len = it.span.len;
  w.q0 = it.q0;
  w.head = it.head;
  w.kvh = it.kvh;
  w.tiles = it.key_tiles(p.causal, kQueryRows, kKeyTile);
  w.c_exp = scale_exponent(p.v_fold_ref[size_t(p.causal ? w.doc_begin + w.q0 : w.doc_end - 1) * p.kv_heads + w.kvh]);
  return true;
}

// The constants of an item's rows (lane = row mod 32) and each consumer warp's split_fold, so that
// the consumers' start on an item waits for no global load and computes nothing per row.
constexpr int kRowGroups = kQueryRows / 32;  // a publisher lane's rows: lane, lane + 32, ..
static_assert(kRowGroups * 2 == kConsumerWarps && kRowGroups <= 4,
              "a ballot's halves are two consumer warps' rows; a lane's bytes fit a word");
__device__ __forceinline__ void store_row_constants(const ForwardParams& p, const CtaWork& w, int lane,
                                                    QueryTileInfo& info) {
  uint32_t q_bytes = 0, fold_bytes = 0;  // row 32 j + lane's scale bytes at bits 8 j ..
#pragma unroll
  for (int j = 0; j < kRowGroups; ++j) {
    const int row = j * 32 + lane;
    const int tok = w.doc_begin + (w.q0 + row < w.len ? w.q0 + row : 0);
    q_bytes |= uint32_t(__ldg(p.q_scales + size_t(tok) * p.q_heads + w.head)) << (8 * j);
    fold_bytes |= uint32_t(__ldg(p.v_fold_ref + size_t(p.causal ? tok : w.doc_end - 1) * p.kv_heads + w.kvh))
                  << (8 * j);
  }
  // One row at a time: the rows' arithmetic unrolled spilled the publisher's registers.
#pragma unroll 1
  for (int j = 0; j < kRowGroups; ++j) {
    const int row = j * 32 + lane;
    bool splits;
    info.row[row] = row_constants(p, w, uint8_t(q_bytes >> (8 * j)), uint8_t(fold_bytes >> (8 * j)),
                                  w.q0 + row < w.len, splits);
    const uint32_t split_rows = __ballot_sync(0xffffffffu, splits);  // consumer warps 2j, 2j + 1
    if (lane == 0) {
      info.split_fold[2 * j] = (split_rows & 0xffffu) == 0xffffu;
      info.split_fold[2 * j + 1] = (split_rows >> 16) == 0xffffu;
    }
  }
}

// Three warps over the CTA's items (work_items.cuh): warp 1 publishes each item, its CtaWork and row
// bytes into Q buffer n % 2 with its Q tile; the tile streamers (warps 0 and 2) stream the published
// item's key tiles. Apart, finding the next item (the document search) and loading its row bytes
// (dependent global loads) overlap the key tiles: with one warp doing both, the consumers waited at
// the start of an item (3.2% of the forward's stall samples at 16x4096). No more items:
// an item of 0 tiles ends the consumers.
constexpr int kProducerWarps = kStreamerRoleWarps;
template <int D, bool kInteriorCodes>
__device__ __forceinline__ void produce(const ForwardArgs& args, SharedTiles<D>& sm) {
  const bool streamed = run_as_tile_streamer([&](auto streamer) {
    stream_work_items<CtaWork>(sm.q_ring, sm.info, [&](const CtaWork& w, int, int key_uses) {
      produce_key_tiles<D, decltype(streamer)::value, kInteriorCodes>(args, w, key_uses, sm);
    });
  });
  if (streamed) return;
  const ForwardParams& p = args.p;
  const int lane = int(threadIdx.x) % 32;
  const int tiles = __ldg(p.work_order_tiles);
  publish_work_items<CtaWork>(
      p.work_counter, tiles * p.q_heads, sm.q_ring, sm.info,
      [&](int item, CtaWork& w) { return find_work(p, item, tiles, w); },
      [&](const CtaWork& w, int n) {
        QueryTileInfo& info = sm.info[sm.q_ring.stage(n)];
        if (lane == 0) {
          uint64_t& full = sm.q_ring.full_barrier(n);
          barrier_expect_bytes(full, kQueryRows * D);
          tma_load_rows(args.q_map, sm.q[sm.q_ring.stage(n)], full, w.head, w.doc_begin + w.q0);
        }
        store_row_constants(p, w, lane, info);
      });
}


// A consumer warpgroup over the CTA's items (items n = 0, 1, .. in Q buffer n % 2, as
// work_items.cuh's consume_work_items hands them out), 64 query rows of each. Step i of an item
// (0..tiles) issues S_i = Q.K_i (i < tiles) and O += P~_{i-1}.V_{i-1} (i > 0) together, computes
// tile i's softmax while P.V runs, then, once P.V is done, releases stage i-1, rescales O to the
// new running max and packs P~_i. Consecutive items overlap the same way: the last step of item n
// issues item n+1's S_0 with its own last P.V, runs n+1's first softmax while that P.V runs, then
// stores n's O and LSE; so only a CTA's first S and its last P.V run alone.
template <int D, bool kTurns, bool kInteriorCodes>
__device__ __forceinline__ void consume_items(const ForwardArgs& args, SharedTiles<D>& sm) {
  const ForwardParams& p = args.p;
  const ConsumerThread me = consumer_thread();
  const int lane = me.lane;
  // kLeanSteps: tiles i >= 1 take interior_softmax alone (tile_softmax says why) and masked tiles
  // skip unseen key spans (masked_tile). Measured against the loop without them: forward
  // kernel tiny-unaligned -3.5%, 8192+224x256 -3.1%, prefix isolation 16x4096 -6.8%, longtail -6.4%,
  // tiny-unaligned -2.9%; but the instance with turns and per-token codes (the default's on long
  // documents) +1.2% at 16x4096, +2.6% at 8x8192, +4.2% at 4x16384, so its loop keeps the branch.
  constexpr bool kLeanSteps = !kTurns || kInteriorCodes;
  constexpr SmemLayout kRowsLayout = kSwizzleFor<D>, kVtLayout = kSwizzleFor<kKeyTile>;
  float o_acc[D / 2];             // the m64nD accumulator: [n8 block][4] flattened
  float m[2], l[2];               // running max and sum of the item's rows
  float s[kKeyTile / 2];          // S_i, then tile i's P operand values
  uint32_t pa[kKeyTile / 32][4];  // P~_{i-1}, read by the P.V in flight
  auto stage = [&](int use) -> const KeyTileStage<D>& { return sm.stage[sm.ring.stage(use)]; };
  auto issue_s = [&](const ItemRows& it, int i) {
    rows_product<D, kKeyTile, kRowsLayout>(s, sm.q[it.q_buffer] + me.consumer * kWarpgroupRows * D,
                                           stage(it.key_uses + i).k);
    wgmma_commit();
  };
  auto issue_pv = [&](const ItemRows& it, int i) {
    register_product<D, kKeyTile, kVtLayout>(o_acc, pa, stage(it.key_uses + i).vt);
    wgmma_commit();
  };
  auto published = [&](int n, int key_uses, ItemRows& it) {  // false: no more items
    sm.q_ring.wait_full(n);
    const int b = sm.q_ring.stage(n);
    const CtaWork w = sm.info[b].work;
    if (w.tiles == 0) return false;
    it = item_rows(w, sm.info[b], key_uses, b);
    return true;
  };
  auto start_item = [&] {
    zero(o_acc);
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  };

  // Timeline builds record the loop's steps (step_timeline.cuh) and the start of each item transition.
  static_assert(timeline::kConsumerWarps == kConsumerWarps, "the timeline has a row per consumer warp");
  timeline::StepClock clock = timeline::StepClock::for_consumer(me.warp, lane);
  const timeline::StepClock idle_clock{};
  ItemRows it;
  if (!published(0, 0, it)) return;
  // A step waits for its stage, then issues its products, in a turn with kTurns (the two consumers
  // alternate on the tensor cores). Every step's wgmma sequence is straight-line code (no branch
  // between issue and wait), or the compiler serializes the products.
  const ConsumerTurns<kTurns> turns{me.consumer};
  // With turns, the consumers take turns at the loop's grouped softmax as well (interior_tile_grouped:
  // max and exponentials, one warp's chain, which paces the step, then the other's), while the
  // products of either are issued in their own turns. Left to overlap, the two chains slowed each
  // other on the shared issue slots and pipes; in turns the forward kernel measured -1.6% at
  // 4x16384, -2.4% at 16x4096, -1.7% at 8x8192 (the exponentials alone in turns were 3%
  // slower, and the same turn taken here around the whole tile_softmax call 15% slower; LEVERS.md).
  const ConsumerTurns<kTurns, NamedBarrier::kForwardSoftmaxTurns> softmax_turns{me.consumer};
  turns.open();
  softmax_turns.open();
  {  // the first item's step 0: S_0 alone
    sm.ring.wait_full(it.key_uses);
    turns.begin();
    wgmma_fence();
    issue_s(it, 0);
    turns.end();
    wgmma_wait<0>();
    start_item();
    float alpha[2];
    tile_softmax<D, kInteriorCodes, kLeanSteps>(p, it, stage(it.key_uses), 0, s, SoftmaxRows{m, l, alpha},
                                                idle_clock);  // O is still 0
    pack_a_operand<kKeyTile>(s, pa);
  }
  for (int n = 0;; ++n) {
    for (int i = 1; i < it.w.tiles; ++i) {
      clock.at_step(it.key_uses + i);
      clock.stamp(timeline::kStepStart);
      sm.ring.wait_full(it.key_uses + i);
      clock.stamp(timeline::kTileLanded);
      turns.begin();
      clock.stamp(timeline::kTurnTaken);
      wgmma_fence();
      issue_s(it, i);
      issue_pv(it, i - 1);
      turns.end();
      clock.stamp(timeline::kIssued);
      wgmma_wait<1>();  // S_i is done; P.V may still run
      clock.stamp(timeline::kScoresReady);
      float alpha[2];
      const KeyTileStage<D>& st = stage(it.key_uses + i);
      const SoftmaxRows softmax{m, l, alpha};
      if constexpr (kLeanSteps) interior_softmax<D, kInteriorCodes>(p, it, st, i, s, softmax, clock, softmax_turns);
      else tile_softmax<D, kInteriorCodes, false>(p, it, st, i, s, softmax, clock, softmax_turns);
      clock.stamp(timeline::kSoftmaxDone);
      wgmma_wait<0>();
      fence_accumulators(o_acc);
      if (lane == 0) sm.ring.arrive_empty(it.key_uses + i - 1);  // this warp is done with tile i-1
      rescale_output(o_acc, alpha);
      pack_a_operand<kKeyTile>(s, pa);
      clock.stamp(timeline::kPacked);
    }
    // Item n's Q tile is done with (its last S is), so its buffer goes back to the publisher.
    if (lane == 0) sm.q_ring.arrive_empty(n);
    const int last = it.w.tiles - 1;
    // The transition to the next item (its tile 0, a use the loop never records): its start alone.
    clock.at_step(it.key_uses + it.w.tiles);
    clock.stamp(timeline::kStepStart);
    ItemRows next;
    if (!published(n + 1, it.key_uses + it.w.tiles, next)) {  // the last item: its P.V alone
      turns.begin();
      wgmma_fence();
      issue_pv(it, last);
      turns.end();
      wgmma_wait<0>();
      fence_accumulators(o_acc);
      if (lane == 0) sm.ring.arrive_empty(it.key_uses + last);
      store_item_output(p, it, o_acc, m, l);
      turns.close();
      softmax_turns.close();
      return;
    }
    sm.ring.wait_full(next.key_uses);
    turns.begin();
    wgmma_fence();
    issue_s(next, 0);
    issue_pv(it, last);
    turns.end();
    wgmma_wait<1>();  // the next item's S_0 is done; this item's last P.V may still run
    float next_m[2] = {-INFINITY, -INFINITY}, next_l[2] = {0.f, 0.f}, alpha[2];
    tile_softmax<D, kInteriorCodes, kLeanSteps>(p, next, stage(next.key_uses), 0, s, SoftmaxRows{next_m, next_l, alpha},
                                                idle_clock);  // O is 0
    wgmma_wait<0>();
    fence_accumulators(o_acc);
    if (lane == 0) sm.ring.arrive_empty(it.key_uses + last);  // the ring runs on into the next item
    store_item_output(p, it, o_acc, m, l);
    start_item();
    m[0] = next_m[0], m[1] = next_m[1];
    l[0] = next_l[0], l[1] = next_l[1];
    pack_a_operand<kKeyTile>(s, pa);
    it = next;
  }
}

template <int D, bool kTurns, bool kInteriorCodes>
__global__ void __launch_bounds__(kThreads, 1) forward_kernel(const __grid_constant__ ForwardArgs args) {
  // The skeleton of tma.cuh's aligned_shared_storage and run_roles, written out: through those
  // helpers (as the backward kernels use them) this kernel compiled to other SASS and measured 1%
  // slower on the H200 at 4x16384 and 16x4096 (two rounds in each of two runs).
  extern __shared__ uint8_t smem_raw[];
  SharedTiles<D>& sm = *reinterpret_cast<SharedTiles<D>*>(smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024));

  if (threadIdx.x == 0) {
    sm.ring.init(kStreamerLanes, kConsumerWarps);
    sm.q_ring.init(kProducerLanes, kConsumerWarps);
    barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x < 32 * kProducerWarps) produce<D, kInteriorCodes>(args, sm);
  } else {
    claim_registers<kConsumerRegisters>();
    consume_items<D, kTurns, kInteriorCodes>(args, sm);
  }
}

}  // namespace

int launch_forward(const ForwardParams& p, void* stream) {
  return for_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    ForwardArgs args{};
    args.p = p;
    cudaError_t e = rows_form_map(args.q_map, p.q_codes, p.total_tokens, p.q_heads, D, kQueryRows);
    if (e == cudaSuccess)
      e = rows_form_maps(args.k_map[0], args.k_map[1], p.k_codes, p.k_interior_codes,
                         p.total_tokens, p.kv_heads, D, kKeyTile);
    if (e == cudaSuccess)
      e = transposed_form_maps(args.vt_map[0], args.vt_map[1], p.v_codes_t, p.v_interior_codes_t,
                               p.vt_pitch, p.kv_heads, D, kKeyTile);
    if (e != cudaSuccess) return e;
    const int64_t items = order::table_entries(p.total_tokens, p.num_docs) * p.q_heads;
    bool turns = consumers_take_turns(p.group_scales || p.interior_codes, p.total_tokens, p.num_docs);
    if constexpr (timeline::kRecording) {  // diagnostics: FLAMIA_TIMELINE_TURNS=0/1 overrides the choice
      if (const char* force = std::getenv("FLAMIA_TIMELINE_TURNS")) turns = force[0] == '1';
    }
    const auto kernel = p.interior_codes ? (turns ? forward_kernel<D, true, true> : forward_kernel<D, false, true>)
                                         : (turns ? forward_kernel<D, true, false> : forward_kernel<D, false, false>);
    return launch_persistent(kernel, args, kSharedBytes<D>, kThreads, items, p.work_counter,
                             static_cast<cudaStream_t>(stream));
  });
}

}  // namespace flamia::cuda::sm90

#ifdef FLAMIA_FORWARD_TIMELINE
// The timeline's C entry points (bench/forward_timeline.py reads the buffer through ctypes), in
// timeline builds only; the version script exports them with the API's flamia_* names.
extern "C" {
// The buffer's shape: {CTAs, rows, steps, events, consumer warps, streamer events}: rows 0 .. consumer
// warps - 1 are the consumer warps', the rest the tile streamers' (step_timeline.cuh).
void flamia_debug_forward_timeline_shape(int shape[6]) {
  using namespace flamia::cuda::sm90::timeline;
  shape[0] = kCtas, shape[1] = kRows, shape[2] = kSteps, shape[3] = kEvents;
  shape[4] = kConsumerWarps, shape[5] = kStreamerEvents;
}
// The name of a consumer warp's event e (0 .. events - 1), or with streamer != 0 of a streamer's
// (0 .. streamer events - 1); else null.
const char* flamia_debug_forward_timeline_event(int e, int streamer) {
  using namespace flamia::cuda::sm90::timeline;
  if (streamer) return e >= 0 && e < kStreamerEvents ? kStreamerEventNames[e] : nullptr;
  return e >= 0 && e < kEvents ? kEventNames[e] : nullptr;
}
// Zeroes the buffer (synchronous); returns the cudaError_t as an int.
int flamia_debug_forward_timeline_clear() {
  void* address = nullptr;
  cudaError_t e = cudaGetSymbolAddress(&address, flamia::cuda::sm90::timeline::g_stamps);
  if (e == cudaSuccess) e = cudaMemset(address, 0, sizeof(flamia::cuda::sm90::timeline::g_stamps));
  return int(e);
}
// Copies the buffer (bytes must be its size) to host memory after the device's work so far.
int flamia_debug_forward_timeline_read(void* host, size_t bytes) {
  if (bytes != sizeof(flamia::cuda::sm90::timeline::g_stamps)) return int(cudaErrorInvalidValue);
  return int(cudaMemcpyFromSymbol(host, flamia::cuda::sm90::timeline::g_stamps, bytes));
}
}
#endif
