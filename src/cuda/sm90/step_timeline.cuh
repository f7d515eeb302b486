// Diagnostics: a clock timeline of the forward's tile loop (the build option FLAMIA_FORWARD_TIMELINE,
// off by default; bench/forward_timeline.py reads and summarizes it). With the option on, lane 0 of
// each consumer warp of CTAs 0 .. kCtas - 1 stores the SM clock (%clock) at each Event of every
// loop step, indexed by the step's key-ring use, into one buffer in global memory, and lane 0 of
// each tile streamer at its StreamerEvents of every tile it streams, indexed by the same ring use.
// An item's first tile is not a loop step: its step is the transition from the item before (that
// item's last P.V and O store, this item's first S and masked softmax), which records its
// kStepStart alone (more stamps there spilled registers in the long rows' instance).
// Nsight Compute says which instructions stall summed over the kernel; this says how long each
// phase of a step takes, how the two consumer warpgroups and the four warps of one fall against
// each other, and what an item transition costs (docs/KERNELS.md).
// The stamps themselves cost the kernel ~4-5%. With the option off a StepClock is empty and every
// stamp compiles to nothing: the kernels are SASS-identical to a build without this header.
#pragma once

#include <cstdint>

#include "cuda/sm90/tma.cuh"  // kTileStreamers

namespace flamia::cuda::sm90::timeline {

// The stamps of one step, in the order the loop reaches them.
enum Event : int {
  kStepStart,    // the loop's top; on an item transition the only stamp
  kTileLanded,   // the step's K and V^T tile has landed (its "full" barrier)
  kTurnTaken,    // the consumer's turn at the tensor cores has come (consumer turns; else at once)
  kIssued,       // S_i = Q.K_i and O += P~_{i-1}.V_{i-1} are issued
  kScoresReady,  // S_i has arrived (wgmma wait)
  kMaxUpdated,   // the tile's row max and the running max are known (inside the softmax)
  kSoftmaxDone,  // the tile's exponentials and row sums are done
  kPacked,       // P.V_{i-1} has finished, O is rescaled and P~_i packed: the step's end
  kEvents
};
// A tile streamer's stamps of one tile (use u of the key ring), in the first kStreamerEvents slots of
// its row's step u.
enum StreamerEvent : int {
  kStageFree,     // use u's stage is free: the consumers released use u - kStages
  kTileHandedOn,  // the streamer arrived on use u's "full" (its loads issued, its factors stored)
  kStreamerEvents
};
static_assert(int(kStreamerEvents) <= int(kEvents), "a streamer's events fit a step's slots");
// Their names, for the readers (bench/forward_timeline.py names each phase by the event that ends it).
inline constexpr const char* kEventNames[kEvents] = {"step start",   "tile landed",  "turn taken",   "issued",
                                                     "scores ready", "max updated", "softmax done", "packed"};
inline constexpr const char* kStreamerEventNames[kStreamerEvents] = {"stage free", "tile handed on"};
// The buffer: [kCtas][kRows][kSteps][kEvents] unsigned 32-bit clocks (0: not recorded), rows
// 0 .. kConsumerWarps - 1 the consumer warps, then the tile streamers.
constexpr int kCtas = 4, kConsumerWarps = 8, kStreamers = kTileStreamers, kRows = kConsumerWarps + kStreamers;
constexpr int kSteps = 384;
constexpr int kStamps = kCtas * kRows * kSteps * kEvents;

#ifdef FLAMIA_FORWARD_TIMELINE
inline constexpr bool kRecording = true;
// The buffer, in the one translation unit that includes this header (forward.cu, which exports
// its readers).
static __device__ uint32_t g_stamps[kStamps];

__device__ __forceinline__ uint32_t sm_clock() {
  uint32_t c;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(c)::"memory");
  return c;
}
// One thread's recorder: null `row` for threads that do not record.
struct StepClock {
  uint32_t* row = nullptr;  // this warp's [kSteps][kEvents]
  int step = 0;
  // consumer_warp: 0 .. kConsumerWarps - 1, the warp's index among the consumers.
  __device__ static StepClock for_consumer(int consumer_warp, int lane) { return at_row(consumer_warp, lane); }
  __device__ static StepClock for_streamer(int streamer, int lane) { return at_row(kConsumerWarps + streamer, lane); }
  __device__ __forceinline__ void at_step(int ring_use) { step = ring_use; }
  __device__ __forceinline__ void stamp(int event) const {
    if (row != nullptr && step < kSteps) row[step * kEvents + event] = sm_clock();
  }

 private:
  __device__ static StepClock at_row(int r, int lane) {
    StepClock c;
    if (lane == 0 && int(blockIdx.x) < kCtas) c.row = g_stamps + (size_t(blockIdx.x) * kRows + r) * kSteps * kEvents;
    return c;
  }
};
#else
inline constexpr bool kRecording = false;
struct StepClock {
  __device__ static StepClock for_consumer(int, int) { return {}; }
  __device__ static StepClock for_streamer(int, int) { return {}; }
  __device__ __forceinline__ void at_step(int) {}
  __device__ __forceinline__ void stamp(int) const {}
};
#endif

}  // namespace flamia::cuda::sm90::timeline
