// The rule that says whether cu_seqlens describes a packed buffer, entry by entry, shared by the
// host checks (core/documents.h's validate_cu_seqlens, the C API's host copy) and the device check
// that every call runs in its work order builder (cuda/schedule/work_order.cu). One rule on both
// sides, so a malformed array is named with the same entry and the same values whether the host or
// the device finds it.
//
// cu_seqlens holds num_docs + 1 int32 entries and describes T packed tokens when
//   cu[0] == 0,  0 <= cu[i] <= T,  cu[i - 1] <= cu[i],  cu[num_docs] == T.
// The first entry that breaks one of them is reported (OffsetsRecord), with the first broken rule
// in the order of OffsetsError at that entry: an entry past T or below 0 is named itself rather
// than through the decrease that follows it.
#pragma once

#include <cstdint>

#include "formats/host_device.h"

namespace flamia {

// The values are the C API's flamia_offsets_error (include/flamia/flamia.h; the C API asserts it).
enum class OffsetsError : int32_t {
  kOk = 0,
  kFirstNotZero = 1,  // cu[0] != 0
  kOutOfRange = 2,    // cu[i] < 0 or cu[i] > T
  kDecreasing = 3,    // cu[i] < cu[i - 1]
  kLastNotTotal = 4,  // cu[num_docs] != T (with every entry in range and none decreasing: it ends early)
};

// What was found: the C API's flamia_offsets_status, field for field (16 bytes, so the device
// writes a record with one 16-byte store).
struct alignas(16) OffsetsRecord {
  int32_t kind = 0;   // OffsetsError; 0: nothing recorded
  int32_t index = 0;  // the first bad entry
  int32_t value = 0;  // cu[index]
  int32_t bound = 0;  // kDecreasing: cu[index - 1]; kOutOfRange, kLastNotTotal: T; kFirstNotZero: 0
};
static_assert(sizeof(OffsetsRecord) == 16, "one 16-byte store");

// The rule broken by entry i (value cu[i], previous cu[i - 1], unread for i == 0) of an array of
// num_docs + 1 entries for total_tokens packed tokens, kOk when none.
FLAMIA_HD OffsetsError offsets_entry_error(int64_t i, int32_t value, int32_t previous, int64_t num_docs,
                                           int64_t total_tokens) {
  if (i == 0 && value != 0) return OffsetsError::kFirstNotZero;
  if (value < 0 || value > total_tokens) return OffsetsError::kOutOfRange;
  if (i > 0 && value < previous) return OffsetsError::kDecreasing;
  if (i == num_docs && value != total_tokens) return OffsetsError::kLastNotTotal;
  return OffsetsError::kOk;
}

// The record of a broken rule at entry i (kind != kOk).
FLAMIA_HD OffsetsRecord offsets_record(OffsetsError kind, int64_t i, int32_t value, int32_t previous,
                                       int64_t total_tokens) {
  OffsetsRecord r;
  r.kind = int32_t(kind);
  r.index = int32_t(i);
  r.value = value;
  r.bound = kind == OffsetsError::kDecreasing ? previous
            : kind == OffsetsError::kFirstNotZero ? 0
                                                  : int32_t(total_tokens);
  return r;
}

}  // namespace flamia
