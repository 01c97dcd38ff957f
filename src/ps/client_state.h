// ps/client_state.h — the client's side of checkpoints: checking a ModelSnapshot against the
// placement plan before it is restored, and assembling one from the ps tasks' answers to a Pull
// with slots (PullRequest.with_slots). Pure functions.
#ifndef PSFLOW_PS_CLIENT_STATE_H_
#define PSFLOW_PS_CLIENT_STATE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "psflow/dist/partition.h"
#include "psflow/ps/ps_types.h"
#include "rpc/transport.h"

namespace psflow::ps {

// InvalidArgument naming the first problem: a variable not in the plan, given twice or missing, a
// value or slot of the wrong shape, or a slot count other than `num_slots` (the optimizer's).
absl::Status ValidateSnapshot(const ModelSnapshot& state, const dist::PlacementPlan& plan, size_t num_slots);

// The whole model from each ps task's answer (`answers[k]`, absent for a task that was not asked:
// it holds no shard), which lists plan.ShardsOn(k) in order, each value followed by its slots.
// DataLoss naming the peer when an answer does not fit the plan.
absl::StatusOr<ModelSnapshot> AssembleSnapshot(const dist::PlacementPlan& plan,
                                               const std::vector<std::optional<rpc::IncomingMessage>>& answers,
                                               const std::vector<std::string>& peer_names, int64_t global_step);

}  // namespace psflow::ps

#endif  // PSFLOW_PS_CLIENT_STATE_H_
