// psflow/train/options.h — everything `psflow train` is told on its command line
// (docs/design.md#command-line-and-summary), and the resolution of model defaults and validation
// of values, shared by `train`, `local` and `eval`. A plain value type.
#ifndef PSFLOW_TRAIN_OPTIONS_H_
#define PSFLOW_TRAIN_OPTIONS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "psflow/io/env.h"
#include "psflow/optim/optimizer.h"

namespace psflow::nn {
struct ModelConfig;
}  // namespace psflow::nn

namespace psflow::train {

struct TrainOptions {
  // Cluster (empty: one process trains alone). job_name "evaluator": evaluate the checkpoints.
  std::string job_name;
  int task_index = 0;
  std::string ps_hosts, worker_hosts;
  // Or a Slurm job step's (psflow/dist/slurm.h): its tasks fill these jobs in rank order ("" = ps:1
  // and the other tasks workers), at ports slurm_port_base + the task's rank on its node.
  std::string slurm_jobs;
  int slurm_port_base = 8888;  // dist::kDefaultSlurmPortBase

  // Model and data.
  std::string model = "mlp";
  int hidden_units = 100;
  std::string data_dir = "data/mnist";
  // The --model's own settings (nn::ModelDefaults::settings), given as --NAME=VALUE; after
  // ResolveTrainOptions every setting of the model is here, left-out ones at their defaults.
  std::map<std::string, std::string> model_settings;

  // Training; unset / empty means "the seed model's default" (nn::DefaultsFor), which
  // ResolveTrainOptions fills in: after it, every optional here holds a value. A value that was
  // given is validated as given (a negative one is an error, never "the default").
  std::optional<int64_t> train_steps;
  std::optional<int> batch_size;
  std::string optimizer;
  std::optional<float> learning_rate;
  std::optional<int64_t> lr_decay_steps;
  std::optional<float> lr_decay_rate;
  bool lr_staircase = false;
  // Embedding tables' update rule (docs/tables.md#semantics): empty means the model's (ctr: adagrad), and
  // for a model with none, --optimizer. The rate left out is the model's; 0 from the model means
  // --learning_rate. FTRL's l1 and l2 (--sparse_optimizer=ftrl).
  std::string sparse_optimizer;
  std::optional<float> sparse_learning_rate;
  double ftrl_l1 = 0, ftrl_l2 = 0;
  // The ctr model (--model=ctr) on docs/tables.md's synthetic data: 0 = dynamic tables, N = fixed
  // `div` tables of N rows taking each hashed id mod N; fields, embedding dim, test examples.
  int64_t ctr_vocab = 0;
  // The generator's configuration (data::ApplyCtrPreset): "criteo" or "learnable".
  std::string ctr_preset = "criteo";
  int ctr_fields = 26;
  int ctr_dense = 13;  // integer (dense) features per example: the model's dense input, the files' I fields
  int ctr_dim = 16;
  // The model's tables' options, --table_<field> for the fields of dist::TableFields()
  // (psflow/dist/table_spec.h) but the seed and the rule: the given ones by field name, as text
  // (checked by ResolveTrainOptions); a field left out keeps the model's (ctr: its tables' template).
  std::map<std::string, std::string> table_options;
  int64_t ctr_test_examples = 65536;
  // The ctr model's data from files in Criteo's layout (docs/data-files.md): comma-separated globs
  // read in order, global batch s being the s-th batch of their lines (async: slices from the work
  // queue); empty:
  // the generator's stream. The test set from files likewise (empty: the generator's), and how many
  // bad lines the reader may skip (counted) before failing.
  std::string train_files;
  std::string test_files;
  int64_t max_bad_lines = 0;
  // Passes over --train_files, each in its own order from --seed when shuffled, and (async) slices
  // per worker of the work queue on ps task 0 (docs/data-files.md#the-work-queue).
  int64_t num_epochs = 1;
  bool shuffle_files = false;
  int file_slices = 10;
  // Async: "queue" (the work queue) or "static" (worker w takes slices w, w + N, ... of each epoch
  // alone, through the same queue: the usual split, a baseline for bench/ctr_files.py).
  std::string file_split = "queue";
  // A sync step's row mean divides by the gradients applied ("workers") or by those that held the
  // row ("row_count", TF's).
  std::string sparse_sync_mean = "workers";
  // Disk tables (docs/table-storage.md; a table's storage is its spec's, by default
  // table_options["storage"], the --table_storage flag): RocksDB under table_dir/ps_<task>/<table>,
  // a cache of the checkpoint, behind a hot-row cache of table_cache_bytes per ps task shared by its
  // disk tables. table_dir: required with disk; an existing directory the ps tasks may write, one
  // per job. A ps task given a table_dir opens its disk tier.
  std::string table_dir;
  int64_t table_cache_bytes = int64_t{1} << 30;
  // A ps task drops a checkpoint's table scan left unread this long by the chief that opened it
  // (a dead chief's, whose snapshot would keep the rows changed since); 0: never. A restarted
  // chief's predecessor's scans go at once.
  double table_scan_timeout_secs = 300;

  // Synchronous replicas; 0 means "the number of workers".
  bool sync_replicas = false;
  int replicas_to_aggregate = 0;
  int total_num_replicas = 0;
  double sync_timeout_secs = 30;
  // Sync only: "async" applies the tables' gradient rows as pushes arrive while the dense variables
  // stay synchronous (Persia's hybrid, docs/sync-async.md#hybrid); "sync": once per step, the mean.
  std::string table_sync = "sync";
  // Async only: a dense push of staleness τ (global steps between its pull and its apply) is
  // applied at the learning rate divided by max(1, τ) (Zhang et al., IJCAI'16).
  bool staleness_aware_lr = false;

  // Placement.
  std::string partitioner = "none";
  std::string placement = "round_robin";
  bool log_device_placement = false;
  int local_replicas = 1;

  // Checkpoints, summaries, metrics.
  std::string checkpoint_dir;
  int64_t save_checkpoint_steps = 0;
  double save_checkpoint_secs = 0;
  // A full save every K saves, increments (the tables' changed rows) between them
  // (docs/checkpoints.md#increments); 1: every save full.
  int64_t full_checkpoint_every = 1;
  std::string logdir;
  int64_t save_summaries_steps = 100;
  std::string metrics_json;
  int metrics_port = 0;
  int64_t eval_every_steps = 0;     // the chief evaluates every N global steps (0: only at the end)
  double eval_timeout_secs = 3600;  // an evaluator with no new checkpoint for this long gives up
  // The file system checkpoints, event files and --metrics_json are written through (borrowed,
  // never null; not a flag): tests hand in a fault-injecting one.
  io::Env* env = io::Env::Default();

  // Runtime.
  uint64_t seed = 0;
  int intra_op_threads = 1;
  int64_t log_every = 100;
  double init_timeout_secs = 300;  // a worker waits this long for the chief; a ps to be initialized
  double rpc_timeout_secs = 30;
  double ps_timeout_secs = 120;        // a worker waits this long for an unreachable ps task
  double worker_timeout_secs = 600;    // a ps task with no call from any worker this long gives up
  int64_t max_message_mb = 1024;       // largest RPC message a task accepts
  std::string transport = "grpc";      // "shm": data calls to a ps on this host over shared memory
  std::string wire_dtype = "float32";  // dense pulls and pushes as "bfloat16" / "float16" (ps::TrainingConfig)
  // What a worker's step overlaps with compute (docs/sync-async.md#overlap): "none" (compute, then
  // push, then pull), "push" (each gradient pushed as backward finishes it), "push_pull" (and the
  // next pull in forward order, each layer's forward waiting for its own values only), or "auto":
  // push_pull where the worker waits for each layer's values itself (psflow train's workers of the
  // image models; WorkerSession::Options::waits_for_values), else push (a PyTorch script may read
  // its parameters between steps: it asks for push_pull by name).
  std::string overlap = "auto";
  // Async with --overlap=push_pull: a ps task's share of an early part bigger than this many bytes
  // on the wire goes as slices, each slice's values pulled back as soon as its push is answered
  // (pushes and pulls both ways at once; ps::PsClient::PullBackSlices). 0: off. The default, 256
  // KiB, measured best of 64 KiB to 1 MiB with bench/overlap_hosts.py (docs/sync-async.md).
  int64_t transfer_slice_bytes = 256 << 10;

  // Security.
  std::string cluster_secret_file, tls_cert, tls_key, tls_ca;
  bool insecure = false;
};

// Fills the defaults of the chosen model and validates every value. The one rule for a bad value:
// InvalidArgument naming the flag, the value and the fix ("--batch_size=0 must be a positive
// integer"), which the CLI prints as one line and exits 2 (docs/bad-input.md).
absl::Status ResolveTrainOptions(TrainOptions* options);

// --train_steps after ResolveTrainOptions when --train_files were given without it: no limit, the
// end of the files ends training.
inline constexpr int64_t kUntilTheDataEnds = INT64_MAX;

// The model the options describe: --model, --hidden_units, --seed and the model's settings.
nn::ModelConfig ModelConfigFrom(const TrainOptions& options);

// The optimizer configuration the options describe (after ResolveTrainOptions, which set them).
optim::OptimizerConfig OptimizerConfigFrom(const TrainOptions& options);

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_OPTIONS_H_
