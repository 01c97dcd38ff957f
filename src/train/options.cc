#include "psflow/train/options.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "psflow/nn/model.h"

namespace psflow::train {

absl::Status ResolveTrainOptions(TrainOptions* o) {
  auto defaults = nn::DefaultsFor(o->model);
  if (!defaults.ok()) return defaults.status();
  if (o->train_steps < 0) o->train_steps = defaults->train_steps;
  if (o->batch_size == -1) o->batch_size = defaults->batch_size;
  if (o->optimizer.empty()) o->optimizer = defaults->optimizer;
  if (o->learning_rate < 0) o->learning_rate = defaults->learning_rate;
  if (o->lr_decay_steps < 0) o->lr_decay_steps = defaults->lr_decay_steps;
  if (o->lr_decay_rate < 0) o->lr_decay_rate = defaults->lr_decay_rate;

  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (o->batch_size <= 0) return bad("--batch_size=", o->batch_size, " must be positive");
  if (o->train_steps <= 0) return bad("--train_steps=", o->train_steps, " must be positive");
  if (!(o->learning_rate > 0)) return bad("--learning_rate=", o->learning_rate, " must be positive");
  if (o->lr_decay_steps > 0 && !(o->lr_decay_rate > 0)) {
    return bad("--lr_decay_rate=", o->lr_decay_rate, " must be positive when --lr_decay_steps is set");
  }
  if (o->intra_op_threads < 1) return bad("--intra_op_threads=", o->intra_op_threads, " must be at least 1");
  if (o->local_replicas < 1) return bad("--local_replicas=", o->local_replicas, " must be at least 1");
  if (o->local_replicas > o->batch_size) {
    return bad("--local_replicas=", o->local_replicas, " exceeds --batch_size=", o->batch_size,
               "; each replica needs at least one example");
  }
  if (o->log_every <= 0) return bad("--log_every=", o->log_every, " must be positive");
  if (o->replicas_to_aggregate < 0) return bad("--replicas_to_aggregate must not be negative");
  if (o->total_num_replicas < 0) return bad("--total_num_replicas must not be negative");
  if (!(o->sync_timeout_secs > 0)) return bad("--sync_timeout_secs=", o->sync_timeout_secs, " must be positive");
  for (const auto& [flag, value] : {std::pair<const char*, double>{"--init_timeout_secs", o->init_timeout_secs},
                                    {"--rpc_timeout_secs", o->rpc_timeout_secs},
                                    {"--ps_timeout_secs", o->ps_timeout_secs},
                                    {"--worker_timeout_secs", o->worker_timeout_secs}}) {
    if (!(value > 0)) return bad(flag, "=", value, " must be a positive number of seconds");
  }
  if (o->max_message_mb < 1 || o->max_message_mb > 2047) {
    return bad("--max_message_mb=", o->max_message_mb, " must be between 1 and 2047 (gRPC's limit is 2 GiB)");
  }
  if (o->transport != "grpc" && o->transport != "shm") return bad("--transport=", o->transport, " must be grpc or shm");
  auto optimizer = optim::MakeOptimizer(OptimizerConfigFrom(*o));
  if (!optimizer.ok()) return optimizer.status();
  return absl::OkStatus();
}

optim::OptimizerConfig OptimizerConfigFrom(const TrainOptions& o) {
  optim::OptimizerConfig config;
  config.name = o.optimizer;
  config.learning_rate = o.learning_rate;
  config.decay_steps = o.lr_decay_steps > 0 ? o.lr_decay_steps : 0;
  config.decay_rate = o.lr_decay_rate > 0 ? o.lr_decay_rate : 1.0f;
  config.staircase = o.lr_staircase;
  return config;
}

}  // namespace psflow::train
