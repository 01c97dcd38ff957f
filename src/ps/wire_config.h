// ps/wire_config.h — TrainingConfig to and from its wire form (proto/psflow.proto).
#ifndef PSFLOW_PS_WIRE_CONFIG_H_
#define PSFLOW_PS_WIRE_CONFIG_H_

#include "proto/psflow.pb.h"
#include "psflow/ps/ps_types.h"

namespace psflow::ps {

// What a ps task without variables answers data calls with (FailedPrecondition); the client
// recognizes it to tell a restarted ps task (it lost its variables) from other errors.
inline constexpr char kNotInitializedMessage[] =
    "not initialized yet: the chief (worker 0) initializes the variables";

wire::TrainingConfig ToWire(const TrainingConfig& config);
TrainingConfig FromWire(const wire::TrainingConfig& config);

}  // namespace psflow::ps

#endif  // PSFLOW_PS_WIRE_CONFIG_H_
