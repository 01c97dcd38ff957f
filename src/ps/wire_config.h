// ps/wire_config.h — TrainingConfig to and from its wire form (proto/psflow.proto).
#ifndef PSFLOW_PS_WIRE_CONFIG_H_
#define PSFLOW_PS_WIRE_CONFIG_H_

#include "proto/psflow.pb.h"
#include "psflow/ps/ps_types.h"

namespace psflow::ps {

wire::TrainingConfig ToWire(const TrainingConfig& config);
TrainingConfig FromWire(const wire::TrainingConfig& config);

}  // namespace psflow::ps

#endif  // PSFLOW_PS_WIRE_CONFIG_H_
