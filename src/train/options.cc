// Resolution and validation of TrainOptions (psflow/train/options.h). One rule for every invalid
// value: InvalidArgument "--flag=value must be <what it must be>[; the fix]", which the CLI prints as
// one line and exits 2 (usage error) for; nothing is silently replaced or ignored.
#include "psflow/train/options.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "psflow/dist/slurm.h"
#include "psflow/nn/model.h"

namespace psflow::train {
namespace {

template <typename T>
absl::Status Bad(absl::string_view flag, T value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(flag, "=", value, " must be ", rule));
}

// A value the model supplies when the flag is left out: the error says so.
template <typename T>
absl::Status BadDefaulted(absl::string_view flag, T value, absl::string_view rule, T model_default) {
  return absl::InvalidArgumentError(absl::StrCat(flag, "=", value, " must be ", rule,
                                                 "; leave it out for the model's default (", model_default, ")"));
}

bool PositiveFinite(double v) { return v > 0 && std::isfinite(v); }

}  // namespace

absl::Status ResolveTrainOptions(TrainOptions* o) {
  auto defaults = nn::DefaultsFor(o->model);
  if (!defaults.ok()) return defaults.status();

  // The values the model supplies, each validated first when it was given.
  if (o->train_steps && *o->train_steps <= 0) {
    return BadDefaulted("--train_steps", *o->train_steps, "positive", defaults->train_steps);
  }
  if (o->batch_size && *o->batch_size <= 0) {
    return BadDefaulted("--batch_size", *o->batch_size, "positive", defaults->batch_size);
  }
  if (o->learning_rate && !PositiveFinite(*o->learning_rate)) {
    return BadDefaulted("--learning_rate", *o->learning_rate, "a positive number", defaults->learning_rate);
  }
  if (o->lr_decay_steps && *o->lr_decay_steps < 0) {
    return BadDefaulted("--lr_decay_steps", *o->lr_decay_steps, "0 (no decay) or positive", defaults->lr_decay_steps);
  }
  if (o->lr_decay_rate && !PositiveFinite(*o->lr_decay_rate)) {
    return BadDefaulted("--lr_decay_rate", *o->lr_decay_rate, "a positive number", defaults->lr_decay_rate);
  }
  if (!o->train_steps) o->train_steps = defaults->train_steps;
  if (!o->batch_size) o->batch_size = defaults->batch_size;
  if (o->optimizer.empty()) o->optimizer = defaults->optimizer;
  if (!o->learning_rate) o->learning_rate = defaults->learning_rate;
  if (!o->lr_decay_steps) o->lr_decay_steps = defaults->lr_decay_steps;
  if (!o->lr_decay_rate) o->lr_decay_rate = defaults->lr_decay_rate;

  if (o->hidden_units <= 0) return Bad("--hidden_units", o->hidden_units, "positive");
  if (o->intra_op_threads < 1) return Bad("--intra_op_threads", o->intra_op_threads, "at least 1");
  if (o->local_replicas < 1) return Bad("--local_replicas", o->local_replicas, "at least 1");
  if (o->local_replicas > *o->batch_size) {
    return Bad("--local_replicas", o->local_replicas,
               absl::StrCat("at most --batch_size=", *o->batch_size, ": each replica needs at least one example"));
  }
  if (o->log_every <= 0) return Bad("--log_every", o->log_every, "positive");
  if (o->replicas_to_aggregate < 0) {
    return Bad("--replicas_to_aggregate", o->replicas_to_aggregate, "0 (all workers) or positive");
  }
  if (o->total_num_replicas < 0) return Bad("--total_num_replicas", o->total_num_replicas, "0 (all workers) or positive");
  if (o->save_checkpoint_steps < 0) {
    return Bad("--save_checkpoint_steps", o->save_checkpoint_steps, "0 (not by steps) or positive");
  }
  if (!(o->save_checkpoint_secs >= 0) || !std::isfinite(o->save_checkpoint_secs)) {
    return Bad("--save_checkpoint_secs", o->save_checkpoint_secs, "0 (not by time) or a positive number of seconds");
  }
  if (o->save_summaries_steps <= 0) return Bad("--save_summaries_steps", o->save_summaries_steps, "positive");
  if (o->slurm_port_base < 1 || o->slurm_port_base > 65535) {
    return Bad("--slurm_port_base", o->slurm_port_base, "a port in 1..65535");
  }
  if (!o->slurm_jobs.empty()) {
    if (auto jobs = dist::ParseSlurmJobs(o->slurm_jobs); !jobs.ok()) return jobs.status();
  }
  if (o->metrics_port < 0 || o->metrics_port > 65535) {
    return Bad("--metrics_port", o->metrics_port, "a port in 1..65535 (or 0: no metrics server)");
  }
  for (const auto& [flag, value] : {std::pair<const char*, double>{"--sync_timeout_secs", o->sync_timeout_secs},
                                    {"--init_timeout_secs", o->init_timeout_secs},
                                    {"--rpc_timeout_secs", o->rpc_timeout_secs},
                                    {"--ps_timeout_secs", o->ps_timeout_secs},
                                    {"--worker_timeout_secs", o->worker_timeout_secs}}) {
    if (!PositiveFinite(value)) return Bad(flag, value, "a positive number of seconds");
  }
  if (o->max_message_mb < 1 || o->max_message_mb > 2047) {
    return Bad("--max_message_mb", o->max_message_mb, "between 1 and 2047 (gRPC's limit is 2 GiB)");
  }
  if (o->transport != "grpc" && o->transport != "shm") return Bad("--transport", o->transport, "grpc or shm");
  auto optimizer = optim::MakeOptimizer(OptimizerConfigFrom(*o));
  if (!optimizer.ok()) return optimizer.status();
  return absl::OkStatus();
}

optim::OptimizerConfig OptimizerConfigFrom(const TrainOptions& o) {
  optim::OptimizerConfig config;
  config.name = o.optimizer;
  config.learning_rate = o.learning_rate.value_or(config.learning_rate);
  config.decay_steps = o.lr_decay_steps.value_or(0);
  config.decay_rate = o.lr_decay_rate.value_or(1.0f);
  config.staircase = o.lr_staircase;
  return config;
}

}  // namespace psflow::train
