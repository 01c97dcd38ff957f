// ps/common/wire_config.h — the plain structs of psflow/ps/ps_types.h to and from their wire forms
// (proto/psflow.proto): TrainingConfig (Initialize, WaitInitialized) and PsTaskStats (Stats).
// Every field crosses; wire_config_test.cc sets each to a distinct value and fails on a field
// that is forgotten on either side, or added to a struct or a message and not here.
#ifndef PSFLOW_PS_COMMON_WIRE_CONFIG_H_
#define PSFLOW_PS_COMMON_WIRE_CONFIG_H_

#include "absl/status/statusor.h"
#include "proto/psflow.pb.h"
#include "psflow/ps/ps_types.h"

namespace psflow::ps {

// What a ps task without variables answers data calls with (FailedPrecondition); the client
// recognizes it to tell a restarted ps task (it lost its variables) from other errors.
inline constexpr char kNotInitializedMessage[] = "not initialized yet: the chief (worker 0) initializes the variables";

// The version of psflow's wire protocol (HelloRequest/HelloResponse.wire_protocol): a worker and a
// ps task of different versions refuse each other at Hello, in one line, instead of failing later
// on a method one does not know (UNIMPLEMENTED) or a field one ignores. Raise it whenever a method
// is added or a field changes what a call does. 0: builds before the check (2026-11-28), which
// already had the chunked push and the pushes' model id; 1: the first build that says.
inline constexpr uint32_t kWireProtocol = 1;

// FromWire refuses a config holding a table declaration it cannot read (below).
wire::TrainingConfig ToWire(const TrainingConfig& config);
absl::StatusOr<TrainingConfig> FromWire(const wire::TrainingConfig& config);

// A table's declaration, every field of dist::TableSpec. FromWire refuses (InvalidArgument naming
// the table and the field) what it cannot read: an unknown strategy, initializer kind or storage,
// a missing initializer. It does not check the values (dim >= 1, ...): the ps does
// (table::ValidateTableConfig), as it does for a declaration made in-process.
wire::TableConfig ToWire(const TableDeclaration& table);
absl::StatusOr<TableDeclaration> FromWire(const wire::TableConfig& table);

wire::StatsResponse ToWire(const PsTaskStats& stats);
PsTaskStats FromWire(const wire::StatsResponse& stats);

}  // namespace psflow::ps

#endif  // PSFLOW_PS_COMMON_WIRE_CONFIG_H_
