// The device side of warp-specialized pipelines on Hopper: transaction barriers (mbarrier), TMA
// tile loads into shared memory, a ring of stages, consumer turns, register reallocation between
// warpgroups and the warp roles (run_roles, the tile streamers). Host-side tensor maps: tensor_map.h.
//
// The pattern (forward.cu): a producer warp waits for a stage to be empty, announces the bytes TMA
// will bring (expect_tx), issues the loads and arrives on the stage's "full" barrier; consumers
// wait on "full" with the stage's phase parity, compute, and arrive on "empty" once their reads
// (tensor-core reads included: after wgmma_wait) are done.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>
#include <type_traits>

namespace flamia::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// --- mbarrier ---------------------------------------------------------------------------------
__device__ __forceinline__ void barrier_init(uint64_t& bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(&bar)), "r"(arrivals) : "memory");
}
// Makes initialized barriers visible to the other threads and to the TMA unit; then __syncthreads.
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t& bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(&bar)) : "memory");
}
// Adds `bytes` to the transactions the current phase waits for (no arrival).
__device__ __forceinline__ void barrier_expect_bytes(uint64_t& bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(&bar)), "r"(bytes)
               : "memory");
}
// Waits until the phase with the given parity has completed. A fresh barrier is in phase 0, so
// waiting for parity 1 returns at once (how producers treat initially empty stages).
__device__ __forceinline__ void barrier_wait(uint64_t& bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(&bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// --- TMA --------------------------------------------------------------------------------------
// Loads the box of `map` at the given coordinates (innermost first) into shared memory at dst
// (aligned to the map's swizzle span); its bytes complete a transaction on `bar`. Elements outside
// the tensor are zero-filled.
__device__ __forceinline__ void tma_load(const CUtensorMap& map, void* dst, uint64_t& bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(smem_address(&bar)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load(const CUtensorMap& map, void* dst, uint64_t& bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(smem_address(&bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// The tiles of tensor_map.h's two code layouts (its coordinate conventions).
__device__ __forceinline__ void tma_load_rows(const CUtensorMap& map, void* dst, uint64_t& bar, int head, int token) {
  tma_load(map, dst, bar, 0, head, token);
}
__device__ __forceinline__ void tma_load_transposed(const CUtensorMap& map, void* dst, uint64_t& bar, int head, int dim,
                                                    int slot) {
  tma_load(map, dst, bar, slot, head * dim);
}

// --- a ring of stages ---------------------------------------------------------------------------
// The barriers of a ring of kStages shared-memory stages that one producer fills and consumers
// drain in order: use i (0, 1, 2, ...) of the ring sits in stage i % kStages, in round
// i / kStages, whose parity is the phase both barriers wait for.
template <int kStages>
struct StageRing {
  static constexpr int kStageCount = kStages;
  uint64_t full[kStages], empty[kStages];

  // By one thread, before the CTA's barrier_init_fence and __syncthreads.
  __device__ __forceinline__ void init(int producer_arrivals, int consumer_arrivals) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(full[s], producer_arrivals);
      barrier_init(empty[s], consumer_arrivals);
    }
  }
  __device__ __forceinline__ static int stage(int i) { return i % kStages; }
  __device__ __forceinline__ uint64_t& full_barrier(int i) { return full[i % kStages]; }
  // Producer: stage of use i is free (round 0 passes at once: fresh barriers, parity 1).
  __device__ __forceinline__ void wait_empty(int i) { barrier_wait(empty[i % kStages], ((i / kStages) & 1) ^ 1); }
  __device__ __forceinline__ void arrive_full(int i) { barrier_arrive(full[i % kStages]); }
  // Consumers: use i has landed; they are done with it.
  __device__ __forceinline__ void wait_full(int i) { barrier_wait(full[i % kStages], (i / kStages) & 1); }
  __device__ __forceinline__ void arrive_empty(int i) { barrier_arrive(empty[i % kStages]); }
};

// --- named barriers ------------------------------------------------------------------------------
// The named barriers (bar.sync / bar.arrive ids; 0 is __syncthreads') of every kernel, in one place
// so that no two roles of one kernel share an id. A pair takes its id and the next.
struct NamedBarrier {
  static constexpr int kConsumerTurns = 1;        // ConsumerTurns' default pair (1, 2): the products' turns
  static constexpr int kForwardSoftmaxTurns = 3;  // the forward's softmax turns (3, 4)
  static constexpr int kDqPartialsUTile = 3;      // dK dV's U~ tile, both consumers (FP16 partials take no turns)
};
__device__ __forceinline__ void named_barrier_sync(int barrier, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(barrier), "r"(threads) : "memory");
}

// --- consumer turns (FA3's ping-pong) -------------------------------------------------------------
// Two consumer warpgroups take turns at issuing their tensor-core products, so that the products
// queue on the tensor cores as consumer 0's, 1's, 0's, ... and one warpgroup's arithmetic (the
// softmax, U) runs while the other's products do; left alone, the two can drift into step, compute
// at once on shared issue slots and leave the tensor cores idle meanwhile (FA3's reasoning; turns
// gained 1-3% here). A turn is begin() .. end() around the issue of one step's products (or another
// stretch of a step: the forward's softmax, on its own pair of barriers); both consumers take the
// same turns, between open() and close(). Consumer 0 goes first: consumer 1
// opens with one arrival on consumer 0's barrier, which consumer 0 takes back when it closes, so
// that no arrival is left pending when the CTA exits.
// Named barriers kFirstBarrier + c (c = 0, 1: NamedBarrier's kConsumerTurns pair by default), each
// counting both warpgroups' threads: consumer c's 128 wait on it (bar.sync),
// the other's 128 arrive (bar.arrive).
// With kActive false every call is a no-op: a kernel takes turns or not as a template parameter
// (kernel_problem.h, consumers_take_turns), because a run-time choice of each turn (a predicate
// held through the tile loop) cost the forward 1-3% even where no turn was taken.
template <bool kActive, int kFirstBarrier = NamedBarrier::kConsumerTurns>
struct ConsumerTurns {
  static_assert(kFirstBarrier >= 1 && kFirstBarrier + 1 < 16, "named barriers 1..15");
  static constexpr int kThreads = 2 * 128;
  int consumer;  // 0 or 1

  __device__ __forceinline__ void open() const {
    if (kActive && consumer == 1) arrive(kFirstBarrier);
  }
  __device__ __forceinline__ void begin() const {
    if (kActive) sync(kFirstBarrier + consumer);
  }
  __device__ __forceinline__ void end() const {
    if (kActive) arrive(kFirstBarrier + 1 - consumer);
  }
  __device__ __forceinline__ void close() const {
    if (kActive && consumer == 0) sync(kFirstBarrier);
  }

 private:
  __device__ __forceinline__ static void sync(int barrier) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(barrier), "n"(kThreads) : "memory");
  }
  __device__ __forceinline__ static void arrive(int barrier) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(barrier), "n"(kThreads) : "memory");
  }
};

// --- warpgroup registers -----------------------------------------------------------------------
// Every thread of a warpgroup executes the same call: producers give registers back, consumers
// take them (the counts are per thread, multiples of 8).
template <int kRegisters>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// --- the kernels' skeleton ---------------------------------------------------------------------
// The dynamic shared memory as one T, its base rounded up to 1024 bytes (the 128-byte swizzle's
// repeat; launches ask for sizeof(T) + 1024). Offsetting the shared array itself (not a generic
// integer address) keeps the accesses LDS/STS.
template <class T>
__device__ __forceinline__ T& aligned_shared_storage() {
  extern __shared__ uint8_t smem_raw[];
  return *reinterpret_cast<T*>(smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024));
}

// The layout of every warp-specialized kernel (run_roles, consumer_thread): warpgroup 0 produces,
// kConsumers warpgroups after it consume, each holding the m64 rows of every product.
inline constexpr int kConsumers = 2;
inline constexpr int kThreads = 128 * (1 + kConsumers);
inline constexpr int kWarpgroupRows = 64;
inline constexpr int kConsumerWarps = 4 * kConsumers;  // each arrives on a stage's "empty"

// Warp specialization: thread 0 runs init (the barriers), everyone meets, then warpgroup 0 gives
// registers back and its first kProducerWarps warps produce (produce() tells them apart by
// threadIdx.x / 32) while the other warpgroups take registers and consume.
template <int kProducerRegisters, int kConsumerRegisters, int kProducerWarps = 1, class Init, class Produce,
          class Consume>
__device__ __forceinline__ void run_roles(Init init, Produce produce, Consume consume) {
  static_assert(kProducerWarps >= 1 && kProducerWarps <= 4, "producer warps are warpgroup 0's");
  if (threadIdx.x == 0) {
    init();
    barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x < 32 * kProducerWarps) produce();
  } else {
    claim_registers<kConsumerRegisters>();
    consume();
  }
}

// Where a consumer thread sits in run_roles' layout (warpgroup 0 produces, the consumers are the
// warpgroups after it): its consumer warpgroup (0, 1, ..), its warp among all consumer warps, its
// lane, and its place in an m64nN accumulator fragment (rows g and g + 8 of its warp's 16, column
// pair t of each n8 block).
struct ConsumerThread {
  int consumer, warp, lane, g, t;
};
__device__ __forceinline__ ConsumerThread consumer_thread() {
  const int lane = int(threadIdx.x) % 32;
  return {int(threadIdx.x) / 128 - 1, int(threadIdx.x) / 32 - 4, lane, lane / 4, lane % 4};
}

// --- tile streamers ------------------------------------------------------------------------------
// Each streamed tile is loaded by two producer warps on distinct SM sub-partitions, warps 0 and 2
// of warpgroup 0 (the forward's and dQ's warp 1 publishes items; dK dV's streamer 0 does): a
// producer warp's instructions take issue slots from the two consumer warps of its sub-partition,
// and its per-tile work bounds how far it runs ahead (two streamers took 2-3% off the forward).
// Streamer 0 issues the tile's TMA loads; each streamer stores its share of the tile's per-key (or
// per-query) constants, then all its lanes arrive on the tile's "full" (kStreamerLanes arrivals).
constexpr int kTileStreamers = 2;
constexpr int kStreamerLanes = 32 * kTileStreamers;
constexpr int kStreamerRoleWarps = 3;  // warps 0 .. 2 of warpgroup 0 take a producer's registers and role
// Runs stream(std::integral_constant<int, s>{}) in streamer s's warp; false in any other warp.
template <class Stream>
__device__ __forceinline__ bool run_as_tile_streamer(Stream stream) {
  const int warp = int(threadIdx.x) / 32;
  if (warp == 0) {
    stream(std::integral_constant<int, 0>{});
    return true;
  }
  if (warp == 2) {
    stream(std::integral_constant<int, 1>{});
    return true;
  }
  return false;
}
// Streamer kStreamer's share of the kPerLane values that each lane stores per tile: j = kFirst ..
// kFirst + kCount - 1.
template <int kStreamer, int kPerLane>
struct StreamerShare {
  static constexpr int kCount = kPerLane / kTileStreamers, kFirst = kStreamer * kCount;
  static_assert(kCount * kTileStreamers == kPerLane, "the streamers split each lane's values evenly");
};

}  // namespace flamia::cuda::sm90
