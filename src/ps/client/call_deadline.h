// ps/client/call_deadline.h — how long one attempt of a call to a ps task may take, and how long the call
// keeps trying. Sizing and retrying are one mechanism (docs/failures.md):
//
//   attempt deadline  = base + bytes moved / kFloorBytesPerSec
//       base is --rpc_timeout_secs (a sync push adds --sync_timeout_secs, the time the ps may hold
//       it for its quorum); bytes moved are the request's tensors plus the answer's expected
//       tensors. So a call that moves a lot gets the time a slow link needs to move it — a 156 MB
//       Initialize gets 30 + 156 s with default flags — and a small call still fails fast when
//       its peer is silent.
//   call budget       = --ps_timeout_secs from the call's start
//       An attempt that misses its deadline (DeadlineExceeded) or whose connection broke
//       (Unavailable) is started again under the one retry policy (ps/common/retry.h), while the call
//       is younger than its budget; a retry's deadline is cut to what is left, but the first
//       attempt always gets its whole deadline. Retrying therefore never cuts a big call short,
//       and a call to a silent task fails after max(budget, first attempt's deadline).
//       Retried pushes are applied once (ps/server/push_dedup.h); every other retried call is
//       idempotent.
//
// kFloorBytesPerSec, 1 MiB/s (8.4 Mbit/s), is the slowest link psflow supports with default
// flags; a slower one needs a larger --rpc_timeout_secs. Pure functions.
#ifndef PSFLOW_PS_CLIENT_CALL_DEADLINE_H_
#define PSFLOW_PS_CLIENT_CALL_DEADLINE_H_

#include <algorithm>
#include <cstdint>

namespace psflow::ps {

inline constexpr double kFloorBytesPerSec = 1 << 20;

// The deadline of one attempt of a call with base deadline `base_secs` moving `bytes` bytes.
inline double AttemptDeadlineSecs(double base_secs, int64_t bytes) {
  return base_secs + static_cast<double>(std::max<int64_t>(bytes, 0)) / kFloorBytesPerSec;
}

}  // namespace psflow::ps

#endif  // PSFLOW_PS_CLIENT_CALL_DEADLINE_H_
