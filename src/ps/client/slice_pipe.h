// ps/client/slice_pipe.h — push and pull pipelined in slices (PsClient::PullBackSlices,
// --transfer_slice_bytes): the state a SlicePulls handle shares with the client and with the
// slices in flight. A PushStream::Send that PsClient::Impl::SlicesFor accepts goes through
// PsClient::Impl::PushSlicesAsync (slice_pipe.cc): the whole gradient checked finite, routed and
// rounded for the wire as one push, then each ps task's share cut into parts of at most a slice
// (ps/client/call_parts.h's SplitIntoParts: a big shard into element runs, which the ps applies
// as one optimizer update per push, ps/server/shard.h), pushed in order, two in flight per task —
// but a part holding a shard's first run alone until answered, and one holding a shard's last run
// only once every earlier part was answered (the ps claims the update with the first run and
// closes it with the last) — and, as each part's push is answered, a Pull of that part's runs of
// the pulled-back variables (PullRequest.slices, on the pull channel) into their destinations.
//
// State: mu guards everything; `pending` counts each variable's slice pulls started and not
// answered, `started` marks variables since the last TakeStarted, `taken` those TakeStarted
// returned and Settle has not settled yet.
#ifndef PSFLOW_PS_CLIENT_SLICE_PIPE_H_
#define PSFLOW_PS_CLIENT_SLICE_PIPE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "psflow/core/tensor.h"
#include "psflow/ps/ps_client.h"

namespace psflow::ps {

struct SlicePulls::State {
  std::vector<std::pair<std::string, Tensor*>> out;  // the destinations, by index
  absl::flat_hash_map<std::string, int> index_of;    // variable -> index into out

  mutable absl::Mutex mu;
  std::vector<int> pending ABSL_GUARDED_BY(mu);
  std::vector<bool> started ABSL_GUARDED_BY(mu);
  std::vector<bool> taken ABSL_GUARDED_BY(mu);
  absl::Status status ABSL_GUARDED_BY(mu);  // the first failure since the last Settle
  bool closed ABSL_GUARDED_BY(mu) = false;  // the handle is gone: no new slices

  // A variable's slice pulls: `n` more in flight (from PushSlicesAsync, before any is sent).
  void Start(int index, int n) ABSL_LOCKS_EXCLUDED(mu);
  // One of them is in (or failed with `s`).
  void Done(int index, const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu);
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_CLIENT_SLICE_PIPE_H_
