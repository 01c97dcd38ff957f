// The flags of `psflow train` (cli/train_flags.h). Every flag's --help line shows its default:
// CLI11 prints the value the option holds before parsing, and the flags whose default is the
// model's list each seed model's value.
#include "cli/train_flags.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "psflow/nn/model.h"

namespace psflow::cli {
namespace {

// "(default: the model's: softmax X, mlp Y, cnn Z, vgg19 W)" for one field of nn::ModelDefaults.
template <typename Field>
std::string ModelDefaults(Field field) {
  std::string out = " (default: the model's:";
  const char* sep = " ";
  for (const char* model : {"softmax", "mlp", "cnn", "vgg19"}) {
    auto d = nn::DefaultsFor(model);
    if (!d.ok()) continue;
    absl::StrAppend(&out, sep, model, " ", (*d).*field);
    sep = ", ";
  }
  return out + ")";
}

}  // namespace

void AddTrainFlags(CLI::App* app, train::TrainOptions* o) {
  // A flag given twice takes the last value (scripts append overrides: run_mnist.sh --train_steps=500).
  app->option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->add_option("--job_name", o->job_name, "this task's role: ps or worker (empty: train in one process)");
  app->add_option("--task_index", o->task_index, "index of this task in its job; worker 0 is the chief");
  app->add_option("--ps_hosts", o->ps_hosts, "comma-separated host:port of the ps tasks");
  app->add_option("--worker_hosts", o->worker_hosts, "comma-separated host:port of the worker tasks");
  app->add_option("--slurm_jobs", o->slurm_jobs,
                  "under srun: the step's tasks in rank order fill these jobs, e.g. ps:2,worker:6 (default: "
                  "ps:1 and every other task a worker, when the step has more than one task)");
  app->add_option("--slurm_port_base", o->slurm_port_base,
                  "under srun: each task listens on this port plus its rank on its node");
  app->add_option("--model", o->model, "softmax | mlp | cnn | vgg19");
  app->add_option("--hidden_units", o->hidden_units, "hidden units of the mlp");
  app->add_option("--data_dir", o->data_dir, "directory of the MNIST IDX files");
  app->add_option("--train_steps", o->train_steps, "stop when the global step reaches this" + ModelDefaults(&nn::ModelDefaults::train_steps));
  app->add_option("--batch_size", o->batch_size, "examples per step per worker" + ModelDefaults(&nn::ModelDefaults::batch_size));
  app->add_option("--optimizer", o->optimizer, "sgd | momentum | adagrad | adam | rmsprop" + ModelDefaults(&nn::ModelDefaults::optimizer));
  app->add_option("--learning_rate", o->learning_rate, "initial learning rate" + ModelDefaults(&nn::ModelDefaults::learning_rate));
  app->add_option("--lr_decay_steps", o->lr_decay_steps, "exponential decay period in steps, 0: constant" + ModelDefaults(&nn::ModelDefaults::lr_decay_steps));
  app->add_option("--lr_decay_rate", o->lr_decay_rate, "decay factor per period" + ModelDefaults(&nn::ModelDefaults::lr_decay_rate));
  app->add_flag("--lr_staircase", o->lr_staircase, "decay in discrete steps");
  app->add_flag("--sync_replicas", o->sync_replicas, "synchronous training (SyncReplicasOptimizer)");
  app->add_option("--replicas_to_aggregate", o->replicas_to_aggregate, "gradients averaged per sync step (0: the number of workers)");
  app->add_option("--total_num_replicas", o->total_num_replicas, "workers taking part in sync training (0: all)");
  app->add_option("--sync_timeout_secs", o->sync_timeout_secs, "a sync step waits this long for missing workers");
  app->add_option("--partitioner", o->partitioner, "none | fixed:N | min_max:P[:MIN_SLICE_BYTES] | axis_size:MAX_SHARD_BYTES");
  app->add_option("--placement", o->placement, "round_robin | greedy");
  app->add_flag("--log_device_placement", o->log_device_placement, "print where each variable lives");
  app->add_option("--local_replicas", o->local_replicas, "model replicas in this worker, one per CPU device");
  app->add_option("--checkpoint_dir", o->checkpoint_dir, "where the chief saves checkpoints");
  app->add_option("--save_checkpoint_steps", o->save_checkpoint_steps, "checkpoint every N steps (0: not by steps)");
  app->add_option("--save_checkpoint_secs", o->save_checkpoint_secs, "checkpoint every N seconds (0: not by time)");
  app->add_option("--logdir", o->logdir, "directory for TensorBoard event files (read them with psflow_events_dump)");
  app->add_option("--save_summaries_steps", o->save_summaries_steps, "TensorBoard summary cadence");
  app->add_option("--metrics_json", o->metrics_json, "write the final summary as JSON to this file");
  app->add_option("--metrics_port", o->metrics_port, "serve Prometheus /metrics on this port (0: none)");
  app->add_option("--seed", o->seed, "seed of initialization, data order and dropout");
  app->add_option("--intra_op_threads", o->intra_op_threads, "compute threads per task");
  app->add_option("--log_every", o->log_every, "log a progress line every N local steps");
  app->add_option("--init_timeout_secs", o->init_timeout_secs,
                  "how long a worker waits for the chief, and a ps task to be initialized by it");
  app->add_option("--rpc_timeout_secs", o->rpc_timeout_secs,
                  "deadline of each RPC attempt, plus 1 s per MiB it moves (docs/failures.md)");
  app->add_option("--ps_timeout_secs", o->ps_timeout_secs,
                  "how long calls to a silent ps task are retried before the task exits non-zero naming it");
  app->add_option("--worker_timeout_secs", o->worker_timeout_secs,
                  "a ps task that hears from no worker for this long exits non-zero");
  app->add_option("--max_message_mb", o->max_message_mb, "largest RPC message a task accepts, in MiB");
  app->add_option("--transport", o->transport, "grpc, or shm: pushes and pulls to a ps on this host over shared memory");
  app->add_option("--cluster_secret_file", o->cluster_secret_file, "file holding the cluster's shared secret");
  app->add_option("--tls_cert", o->tls_cert, "PEM certificate of this task");
  app->add_option("--tls_key", o->tls_key, "PEM private key of this task");
  app->add_option("--tls_ca", o->tls_ca, "PEM CA certificate that signed the cluster's certificates");
  app->add_flag("--insecure", o->insecure, "allow listening beyond loopback without a secret");
}

}  // namespace psflow::cli
