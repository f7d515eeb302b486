// A producer warp's loads of a key tile's per-key scale bytes (UE8M0, [T, H] by token and head):
// lane l takes keys l, l + 32, ... of the tile, clamped into the document (a key past its end
// reads the last key's byte, which the kernels never apply). All loads of a tile are independent,
// so they are in flight together; a kernel loads tile i + 1's bytes while it stores tile i's
// factors.
#pragma once

#include <cstdint>

#include "core/tiling.h"

namespace flamia::cuda::sm90 {

// The bytes of one lane's keys, four to a register (producer warps run on few registers).
template <int kKeyTile>
struct LaneScaleBytes {
  static constexpr int kKeysPerLane = kKeyTile / 32;
  static_assert(kKeysPerLane == 4, "one register of K bytes and one of V bytes");
  uint32_t k, v;
  __device__ __forceinline__ uint8_t k_byte(int j) const { return uint8_t(k >> (8 * j)); }
  __device__ __forceinline__ uint8_t v_byte(int j) const { return uint8_t(v >> (8 * j)); }
};

// Keys j = kFirst .. kFirst + kCount - 1 of the lane's (byte j each; the rest 0): a producer split
// over several warps loads only its share.
template <int kKeyTile, int kFirst = 0, int kCount = LaneScaleBytes<kKeyTile>::kKeysPerLane>
__device__ __forceinline__ LaneScaleBytes<kKeyTile> load_lane_scale_bytes(const uint8_t* k_scales,
                                                                          const uint8_t* v_scales, int heads,
                                                                          int head, int doc_begin, int len, int k0,
                                                                          int lane) {
  static_assert(kFirst >= 0 && kCount >= 1 && kFirst + kCount <= LaneScaleBytes<kKeyTile>::kKeysPerLane, "lane keys");
  LaneScaleBytes<kKeyTile> b{0u, 0u};
#pragma unroll
  for (int j = kFirst; j < kFirst + kCount; ++j) {
    const int64_t s = int64_t(doc_begin + min(k0 + j * 32 + lane, len - 1)) * heads + head;
    b.k |= uint32_t(__ldg(k_scales + s)) << (8 * j);
    b.v |= uint32_t(__ldg(v_scales + s)) << (8 * j);
  }
  return b;
}

// The K and V scale bytes of 32-key group `lane` of the tile at k0 (lanes past the tile's groups:
// 0), as k | v << 8, clamped into the document like the per-key loads: a grouped tile's one byte
// pair per group.
template <int kKeyTile>
__device__ __forceinline__ uint32_t load_group_scale_bytes(const uint8_t* k_scales, const uint8_t* v_scales,
                                                           int heads, int head, int doc_begin, int len, int k0,
                                                           int lane) {
  if (lane >= kKeyTile / tiling::kScaleBlock) return 0u;  // the group's first key carries its bytes
  const int64_t s = int64_t(doc_begin + min(k0 + lane * tiling::kScaleBlock, len - 1)) * heads + head;
  return uint32_t(__ldg(k_scales + s)) | (uint32_t(__ldg(v_scales + s)) << 8);
}

}  // namespace flamia::cuda::sm90
