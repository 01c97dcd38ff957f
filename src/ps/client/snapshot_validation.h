// ps/client/snapshot_validation.h — the client's side of checkpoints: checking a ModelSnapshot against the
// placement plan before it is restored. (PsClient::PullState assembles one from the ps tasks'
// answers as they arrive: ps_client_control.cc.) A pure function.
#ifndef PSFLOW_PS_CLIENT_SNAPSHOT_VALIDATION_H_
#define PSFLOW_PS_CLIENT_SNAPSHOT_VALIDATION_H_

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

}  // namespace psflow::ps

#endif  // PSFLOW_PS_CLIENT_SNAPSHOT_VALIDATION_H_
