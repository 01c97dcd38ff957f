// psflow/ps/ps_types.h — plain values shared by the parameter server (ps_server.h) and the
// workers' client (ps_client.h): the training configuration the chief sends to
// every ps task, per-task statistics, and the model's full state for checkpoints. Plain structs;
// no synchronization.
#ifndef PSFLOW_PS_PS_TYPES_H_
#define PSFLOW_PS_PS_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "psflow/core/tensor.h"
#include "psflow/optim/optimizer.h"
#include "psflow/rpc/transport_options.h"

namespace psflow::ps {

// Sent by the chief when it initializes the ps tasks.
struct TrainingConfig {
  optim::OptimizerConfig optimizer;
  bool sync = false;
  int replicas_to_aggregate = 1;
  int total_num_replicas = 1;
  int64_t train_steps = 0;  // pushes are refused (OutOfRange) once the global step reaches it; 0 = no limit
  // A sync step waiting longer than this for its quorum applies what arrived (no hang on a dead
  // worker), logs which workers were missing and drops them from the quorum until they push again.
  double sync_timeout_secs = 30;
  int64_t initial_global_step = 0;  // where the global step starts (restored from a checkpoint)
};

// One variable's whole state, independent of how it is partitioned: its full value, each optimizer
// slot (full shape, in Optimizer::slot_names() order) and the optimizer updates applied to it (the
// max over its shards; Adam's t is updates + 1 at the next update).
struct VariableSnapshot {
  std::string name;
  Tensor value;
  std::vector<Tensor> slots;
  int64_t updates = 0;
};

// What a checkpoint holds of the ps side: the global step and every variable of the plan (in the
// plan's order). Restorable onto any number of ps tasks and any partitioning.
struct ModelSnapshot {
  int64_t global_step = 0;
  std::vector<VariableSnapshot> variables;
};

struct PsTaskStats {
  int task = 0;
  int64_t bytes_in = 0, bytes_out = 0;  // payload bytes of every call (headers and tensors)
  int64_t num_params = 0;               // floats held, not counting optimizer slots
  int64_t global_step = 0;              // this task's step counter (the global step on its ps)
  int64_t stale_gradients_dropped = 0;  // sync: pushes tagged older than the step, or late backups
  int64_t pushes_refused = 0;           // NaN/Inf, unknown shards, wrong shapes, rows out of range
  int64_t calls_unauthenticated = 0;    // calls refused for a missing or wrong secret
  int64_t connected_workers = 0;        // clients that said Hello and not yet Goodbye (this task only)
  std::vector<int32_t> connected_worker_indices;  // their worker indices, sorted, without repeats
  std::vector<int32_t> pushed_worker_indices;     // workers whose push this task accepted, sorted
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_PS_TYPES_H_
