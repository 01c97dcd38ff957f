// The table of `psflow train`'s flags and the row-by-row operations on it (train/flags.h).
#include "train/flags.h"

#include <charconv>
#include <cmath>
#include <concepts>
#include <iterator>
#include <system_error>
#include <type_traits>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "psflow/dist/table_spec.h"

namespace psflow::train {
namespace internal {

// Every TrainOptions member is a flag but `env` (a borrowed io::Env*, set by programs and tests):
// counted as the most brace-initializers TrainOptions{...} accepts (TrainOptions is an aggregate).
// Outside the unnamed namespace: the conversion is declared, never defined, only used unevaluated.
struct AnyMember {
  template <typename T>
  operator T&() const;
};
template <typename T, typename... Init>
constexpr size_t MemberCount() {
  if constexpr (requires { T{std::declval<Init>()..., AnyMember{}}; }) {
    return MemberCount<T, Init..., AnyMember>();
  } else {
    return sizeof...(Init);
  }
}

}  // namespace internal
namespace {

using O = TrainOptions;
using M = nn::ModelDefaults;

constexpr FlagRule kPositive = Positive();
constexpr FlagRule kAtLeastOne = AtLeast(1, "at least 1");
constexpr FlagRule kAllWorkers = AtLeast(0, "0 (all workers) or positive");
constexpr FlagRule kPositiveNumber = Finite(Positive("a positive number"));
constexpr FlagRule kSeconds = Finite(Positive("a positive number of seconds"));

// clang-format off
constexpr Flag kFlags[] = {
  // Cluster (empty: one process trains alone).
  {"job_name", &O::job_name,
   "this task's role: ps, worker, or evaluator (evaluates each new checkpoint; empty: train in one process)"},
  {"task_index", &O::task_index, "index of this task in its job; worker 0 is the chief"},
  {"ps_hosts", &O::ps_hosts, "comma-separated host:port of the ps tasks"},
  {"worker_hosts", &O::worker_hosts, "comma-separated host:port of the worker tasks"},
  {"slurm_jobs", &O::slurm_jobs,
   "under srun: the step's tasks in rank order fill these jobs, e.g. ps:2,worker:6 (default: ps:1 and every "
   "other task a worker, when the step has more than one task)"},
  {"slurm_port_base", &O::slurm_port_base, "under srun: each task listens on this port plus its rank on its node",
   Between(1, 65535, "a port in 1..65535")},
  // Model and data.
  {"model", &O::model, "softmax | mlp | cnn | vgg19 | ctr, or a model the program registered (nn::RegisterModel)"},
  {"hidden_units", &O::hidden_units, "hidden units of the mlp", kPositive},
  {"data_dir", &O::data_dir, "directory of the MNIST IDX files"},
  // Training: left out, the --model's own value.
  {"train_steps", &O::train_steps, "stop when the global step reaches this", kPositive, &M::train_steps},
  {"batch_size", &O::batch_size, "examples per step per worker", kPositive, &M::batch_size},
  {"optimizer", &O::optimizer, "sgd | momentum | adagrad | adam | adamw | rmsprop", {}, &M::optimizer},
  {"learning_rate", &O::learning_rate, "initial learning rate", kPositiveNumber, &M::learning_rate},
  {"lr_decay_steps", &O::lr_decay_steps, "exponential decay period in steps, 0: constant",
   AtLeast(0, "0 (no decay) or positive"), &M::lr_decay_steps},
  {"lr_decay_rate", &O::lr_decay_rate, "decay factor per period", kPositiveNumber, &M::lr_decay_rate},
  {"lr_staircase", &O::lr_staircase, "decay in discrete steps"},
  // Embedding tables (the ctr model).
  {"sparse_optimizer", &O::sparse_optimizer, "update rule of embedding tables: sgd | momentum | adagrad | ftrl | adam | rmsprop",
   {}, &M::sparse_optimizer},  // checked by ResolveTrainOptions once the default is filled
  {"sparse_learning_rate", &O::sparse_learning_rate, "initial learning rate of embedding tables",
   Finite(AtLeast(0, "a positive number (0: --learning_rate)")), &M::sparse_learning_rate},
  {"ftrl_l1", &O::ftrl_l1, "FTRL's L1 regularization (--sparse_optimizer=ftrl)", Finite(AtLeast(0, "a number >= 0"))},
  {"ftrl_l2", &O::ftrl_l2, "FTRL's L2 regularization (--sparse_optimizer=ftrl)", Finite(AtLeast(0, "a number >= 0"))},
  {"ctr_vocab", &O::ctr_vocab, "ctr model: 0 for dynamic tables, N for fixed div tables of N rows (ids mod N)",
   AtLeast(0, "0 (dynamic tables) or a positive number of rows")},
  {"ctr_fields", &O::ctr_fields, "ctr model: categorical fields, one table each", Between(1, 1000, "between 1 and 1000")},
  {"ctr_dense", &O::ctr_dense, "ctr model: integer (dense) features per example (the files' I1..I_D)",
   Between(0, 1000, "between 0 and 1000")},
  {"ctr_dim", &O::ctr_dim, "ctr model: embedding dimension", Between(1, 256, "between 1 and 256")},
  {"ctr_preset", &O::ctr_preset, "ctr model: the generator's configuration, criteo (Criteo's cardinalities) or "
   "learnable (vocabularies capped at 100 ids, a stronger FM signal: the Bayes AUC can be reached)",
   OneOf("criteo learnable", "criteo or learnable")},
  {"ctr_test_examples", &O::ctr_test_examples, "ctr model: examples of the fixed test set", kPositive},
  {"train_files", &O::train_files, "ctr model: training data, files in Criteo's layout (globs, comma-separated; "
   "plain or gzip): one process and sync read them in order, async workers take slices from the work queue on "
   "ps task 0; empty: the synthetic generator"},
  {"num_epochs", &O::num_epochs, "--train_files: passes over the files; training ends after the last", kPositive},
  {"shuffle_files", &O::shuffle_files, "--train_files: each epoch in its own order drawn from --seed (async: of the "
   "slices; one process and sync: of the files)"},
  {"file_slices", &O::file_slices, "--train_files, async: slices of the files per worker in the work queue",
   kPositive},
  {"file_split", &O::file_split, "--train_files, async: queue (slices handed out by ps task 0 as workers need "
   "them) or static (worker w takes slices w, w+N, ... of each epoch alone: the usual split, a baseline)", OneOf("queue static", "queue or static")},
  {"test_files", &O::test_files, "ctr model: test data, files in Criteo's layout; empty: the generator's test set"},
  {"max_bad_lines", &O::max_bad_lines, "bad lines of --train_files/--test_files skipped (and counted) before the "
   "job fails naming file and line", AtLeast(0, "0 or more")},
  {"sparse_sync_mean", &O::sparse_sync_mean, "sync: a table row's gradient sum divided by the gradients applied "
   "(workers) or by those holding the row (row_count)", OneOf("workers row_count", "workers or row_count")},
  {"table_dir", &O::table_dir, "disk tables (--table_storage=disk, or a table's storage=disk): an existing "
   "directory; each ps task keeps its tables in ps_<task> inside it (wiped at start: a cache of the checkpoint)"},
  {"table_cache_bytes", &O::table_cache_bytes, "disk tables: bytes of rows (and their index) a ps task keeps in "
   "memory, shared by its disk tables (least recently used rows leave; RocksDB adds ~300 MB a task)", kPositive},
  {"table_scan_timeout_secs", &O::table_scan_timeout_secs, "a ps task drops a checkpoint's table scan its chief "
   "left unread this long (a dead chief's; 0: never)", Finite(AtLeast(0, "0 (never) or a number of seconds"))},
  // Synchronous replicas.
  {"sync_replicas", &O::sync_replicas, "synchronous training (SyncReplicasOptimizer)"},
  {"replicas_to_aggregate", &O::replicas_to_aggregate, "gradients averaged per sync step (0: the number of workers)",
   kAllWorkers},
  {"total_num_replicas", &O::total_num_replicas, "workers taking part in sync training (0: all)", kAllWorkers},
  {"sync_timeout_secs", &O::sync_timeout_secs, "a sync step waits this long for missing workers", kSeconds},
  {"table_sync", &O::table_sync, "with --sync_replicas: sync (tables' rows once per step, the mean) or async "
   "(applied as pushes arrive, dense variables still sync: hybrid, not reproducible bit for bit)",
   OneOf("sync async", "sync or async")},
  {"staleness_aware_lr", &O::staleness_aware_lr, "async: a dense push of staleness t (global steps since its pull) "
   "is applied at the learning rate divided by max(1, t)"},
  // Placement.
  {"partitioner", &O::partitioner, "none | fixed:N | min_max:P[:MIN_SLICE_BYTES] | axis_size:MAX_SHARD_BYTES"},
  {"placement", &O::placement, "round_robin | greedy"},
  {"log_device_placement", &O::log_device_placement, "print where each variable lives"},
  {"local_replicas", &O::local_replicas, "model replicas in this worker, one per CPU device", kAtLeastOne},
  // Checkpoints, summaries, metrics.
  {"checkpoint_dir", &O::checkpoint_dir, "where the chief saves checkpoints"},
  {"save_checkpoint_steps", &O::save_checkpoint_steps, "checkpoint every N steps (0: not by steps)",
   AtLeast(0, "0 (not by steps) or positive")},
  {"save_checkpoint_secs", &O::save_checkpoint_secs, "checkpoint every N seconds (0: not by time)",
   Finite(AtLeast(0, "0 (not by time) or a positive number of seconds"))},
  {"full_checkpoint_every", &O::full_checkpoint_every,
   "a full checkpoint every K saves, incremental ones (changed table rows) between (1: all full)",
   AtLeast(1, "1 (every save full) or more")},
  {"logdir", &O::logdir, "directory for TensorBoard event files (read them with psflow_events_dump)"},
  {"save_summaries_steps", &O::save_summaries_steps, "TensorBoard summary cadence", kPositive},
  {"metrics_json", &O::metrics_json, "write the final summary as JSON to this file"},
  {"eval_every_steps", &O::eval_every_steps,
   "the chief runs the evaluation every N global steps during training (0: only at the end); the ctr model on "
   "a cluster with --checkpoint_dir: of that step's checkpoint, beside training",
   AtLeast(0, "0 (only at the end) or positive")},
  {"eval_timeout_secs", &O::eval_timeout_secs,
   "an evaluator that sees no new checkpoint and no end of training for this long exits non-zero", kSeconds},
  {"metrics_port", &O::metrics_port, "serve Prometheus /metrics on this port (0: none)",
   Between(0, 65535, "a port in 1..65535 (or 0: no metrics server)")},
  // Runtime.
  {"seed", &O::seed, "seed of initialization, data order and dropout"},
  {"intra_op_threads", &O::intra_op_threads, "compute threads per task", kAtLeastOne},
  {"log_every", &O::log_every, "log a progress line every N local steps", kPositive},
  {"init_timeout_secs", &O::init_timeout_secs,
   "how long a worker waits for the chief, and a ps task to be initialized by it", kSeconds},
  {"rpc_timeout_secs", &O::rpc_timeout_secs,
   "deadline of each RPC attempt, plus 1 s per MiB it moves (docs/failures.md)", kSeconds},
  {"ps_timeout_secs", &O::ps_timeout_secs,
   "how long calls to a silent ps task are retried before the task exits non-zero naming it", kSeconds},
  {"worker_timeout_secs", &O::worker_timeout_secs,
   "a ps task that hears from no worker for this long exits non-zero", kSeconds},
  {"max_message_mb", &O::max_message_mb, "largest RPC message a task accepts, in MiB",
   Between(1, 2047, "between 1 and 2047 (gRPC's limit is 2 GiB)")},
  {"transport", &O::transport, "grpc, or shm: pushes and pulls to a ps on this host over shared memory",
   OneOf("grpc shm", "grpc or shm")},
  {"wire_dtype", &O::wire_dtype,
   "dtype of dense pulls and pushes on the wire: float32, or bfloat16 / float16 (half the bytes; the ps keeps "
   "float32, workers carry their rounding into the next push); every task the same",
   OneOf("float32 bfloat16 float16", "float32, bfloat16 or float16")},
  {"overlap", &O::overlap,
   "what a worker's step overlaps with compute: none, push (each gradient pushed as backward finishes it), "
   "push_pull (and the next pull in forward order: a layer's forward waits only for its own values), or auto "
   "(push_pull for psflow train's image-model workers, push for the others and for PyTorch scripts)",
   OneOf("auto none push push_pull", "auto, none, push or push_pull")},
  {"transfer_slice_bytes", &O::transfer_slice_bytes,
   "async with --overlap=push_pull: a big variable's push goes in slices of this many bytes on the wire, each "
   "slice's values pulled back as soon as its push is answered, so pushes and pulls run both ways at once (0: off)",
   AtLeast(0, "0 (off) or positive")},
  // Security.
  {"cluster_secret_file", &O::cluster_secret_file, "file holding the cluster's shared secret"},
  {"tls_cert", &O::tls_cert, "PEM certificate of this task"},
  {"tls_key", &O::tls_key, "PEM private key of this task"},
  {"tls_ca", &O::tls_ca, "PEM CA certificate that signed the cluster's certificates"},
  {"insecure", &O::insecure, "allow listening beyond loopback without a secret"},
};
// clang-format on

static_assert(internal::MemberCount<TrainOptions>() == std::size(kFlags) + 3,
              "a TrainOptions member has no row in kFlags (train/flags.cc): every member but env, "
              "model_settings (the models' own flags) and table_options (the rows made from "
              "dist::TableFields()) is a flag");

// The table fields that are no flag: the seed (each of the model's tables draws its own from
// --seed) and the rule (--sparse_optimizer is the job's).
bool IsTableFlag(std::string_view field) { return field != "seed" && field != "sparse_optimizer"; }

// kFlags, then --table_<field> for each dist::TableFields() row IsTableFlag keeps.
const std::vector<Flag>& AllFlags() {
  static const std::vector<Flag>* const flags = [] {
    static std::vector<std::string> names, helps;  // storage of the made rows' texts
    auto* all = new std::vector<Flag>(std::begin(kFlags), std::end(kFlags));
    const std::span<const dist::TableField> fields = dist::TableFields();
    names.reserve(fields.size());
    helps.reserve(fields.size());
    for (const dist::TableField& f : fields) {
      if (!IsTableFlag(f.name)) continue;
      names.push_back(absl::StrCat("table_", std::string(f.name)));
      helps.push_back(absl::StrCat("the model's tables (ctr): ", std::string(f.help), " (default: the model's; ",
                                   "psflow's: ", dist::TableFieldDefault(f.name), ")"));
      FlagRule rule;
      rule.must_be = absl::string_view(f.must_be.data(), f.must_be.size());
      all->push_back({names.back(), TableOptionField{absl::string_view(f.name.data(), f.name.size()), f.type == "int"},
                      helps.back(), rule});
    }
    return all;
  }();
  return *flags;
}

template <typename T>
struct Unoptional {
  using type = T;
};
template <typename T>
struct Unoptional<std::optional<T>> {
  using type = T;
};

// A model default fills a std::optional of its own type, or a string left empty.
template <typename Field, typename Value>
constexpr bool FillableBy() {
  return std::is_same_v<Field, std::optional<Value>> ||
         (std::is_same_v<Field, std::string> && std::is_same_v<Value, std::string>);
}
constexpr bool ModelDefaultsFitTheirFlags() {
  for (const Flag& flag : kFlags) {
    const bool fits = std::visit(
        [](auto member, auto model_member) {
          if constexpr (std::is_same_v<decltype(model_member), std::monostate> ||
                        std::is_same_v<decltype(member), TableOptionField>) {
            return true;
          } else {
            using Field = std::remove_cvref_t<decltype(std::declval<TrainOptions&>().*member)>;
            using Value = std::remove_cvref_t<decltype(std::declval<nn::ModelDefaults&>().*model_member)>;
            return FillableBy<Field, Value>();
          }
        },
        flag.field, flag.model_default);
    if (!fits) return false;
  }
  return true;
}
static_assert(ModelDefaultsFitTheirFlags(), "a model default in kFlags does not fit its flag's type");

// Shortest text that parses back to the same value.
template <typename T>
std::string NumberText(T value) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

template <typename T>
std::string ValueText(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else {
    return NumberText(value);
  }
}

template <typename T>
absl::StatusOr<T> ParseValue(absl::string_view name, absl::string_view text) {
  auto bad = [&](absl::string_view must_be) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, "=", text, " must be ", must_be));
  };
  if constexpr (std::is_same_v<T, std::string>) {
    return std::string(text);
  } else if constexpr (std::is_same_v<T, bool>) {
    for (absl::string_view yes : {"true", "1", "yes", "on"}) {
      if (text == yes) return true;
    }
    for (absl::string_view no : {"false", "0", "no", "off"}) {
      if (text == no) return false;
    }
    return bad("true or false");
  } else {
    T value{};
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    const bool whole = ec == std::errc() && end == text.data() + text.size() && !text.empty();
    if constexpr (std::is_floating_point_v<T>) {
      if (!whole) return bad("a number");
    } else if constexpr (std::is_unsigned_v<T>) {
      if (!whole) return bad("a non-negative integer");
    } else {
      if (ec == std::errc::result_out_of_range) {
        return bad(
            absl::StrCat("an integer from ", std::numeric_limits<T>::min(), " to ", std::numeric_limits<T>::max()));
      }
      if (!whole) return bad("an integer");
    }
    return value;
  }
}

// Whether `value` passes `rule`.
template <typename T>
bool Accepts(const FlagRule& rule, const T& value) {
  if (rule.must_be.empty()) return true;
  if constexpr (std::is_same_v<T, std::string>) {
    if (rule.one_of.empty()) return true;
    for (absl::string_view choice : absl::StrSplit(rule.one_of, ' ')) {
      if (choice == value) return true;
    }
    return false;
  } else if constexpr (std::is_same_v<T, bool>) {
    return true;
  } else {
    const double v = static_cast<double>(value);
    if (rule.finite && !std::isfinite(v)) return false;
    if (rule.above_min ? !(v > rule.min) : !(v >= rule.min)) return false;
    return v <= rule.max;
  }
}

}  // namespace

std::span<const Flag> TrainFlags() { return AllFlags(); }

const Flag* FindFlag(absl::string_view name) {
  for (const Flag& flag : AllFlags()) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

std::string FlagValueText(const Flag& flag, const TrainOptions& options) {
  return std::visit(
      [&](auto member) -> std::string {
        if constexpr (std::is_same_v<decltype(member), TableOptionField>) {
          auto it = options.table_options.find(std::string(member.field));
          return it == options.table_options.end() ? std::string() : it->second;
        } else {
          const auto& value = options.*member;
          using T = std::remove_cvref_t<decltype(value)>;
          if constexpr (std::is_same_v<T, typename Unoptional<T>::type>) {
            return ValueText(value);
          } else {
            return value.has_value() ? ValueText(*value) : std::string();
          }
        }
      },
      flag.field);
}

absl::Status SetFlagFromText(const Flag& flag, absl::string_view text, TrainOptions* options) {
  return std::visit(
      [&](auto member) -> absl::Status {
        if constexpr (std::is_same_v<decltype(member), TableOptionField>) {
          // Of the field's type here ("must be an integer"); its own checks at ResolveTrainOptions.
          if (member.integer) {
            if (absl::StatusOr<int64_t> v = ParseValue<int64_t>(flag.name, text); !v.ok()) return v.status();
          }
          options->table_options[std::string(member.field)] = std::string(text);
          return absl::OkStatus();
        } else {
          auto& field = options->*member;
          using T = typename Unoptional<std::remove_cvref_t<decltype(field)>>::type;
          absl::StatusOr<T> value = ParseValue<T>(flag.name, text);
          if (!value.ok()) return value.status();
          field = *std::move(value);
          return absl::OkStatus();
        }
      },
      flag.field);
}

std::string FlagArg(const Flag& flag, const TrainOptions& options) {
  if (auto* member = std::get_if<bool TrainOptions::*>(&flag.field); member != nullptr && options.**member) {
    return absl::StrCat("--", flag.name);
  }
  return absl::StrCat("--", flag.name, "=", FlagValueText(flag, options));
}

std::vector<std::string> FlagArgs(const TrainOptions& options) {
  std::vector<std::string> args;
  for (const Flag& flag : AllFlags()) {
    if (!FlagValueText(flag, options).empty()) args.push_back(FlagArg(flag, options));
  }
  for (const auto& [name, value] : options.model_settings) args.push_back(absl::StrCat("--", name, "=", value));
  return args;
}

std::string ModelDefaultText(const Flag& flag, const nn::ModelDefaults& defaults) {
  return std::visit(
      [&](auto member) -> std::string {
        if constexpr (std::is_same_v<decltype(member), std::monostate>) {
          return "";
        } else {
          return ValueText(defaults.*member);
        }
      },
      flag.model_default);
}

absl::Status CheckFlagRules(const TrainOptions& options, const nn::ModelDefaults& defaults) {
  for (const Flag& flag : AllFlags()) {
    const bool accepted = std::visit(
        [&](auto member) {
          if constexpr (std::is_same_v<decltype(member), TableOptionField>) {
            auto it = options.table_options.find(std::string(member.field));
            dist::TableSpec scratch;  // the field's own check (dist::SetTableField)
            const std::string_view field(member.field.data(), member.field.size());
            return it == options.table_options.end() || dist::SetTableField(&scratch, field, it->second).ok();
          } else {
            const auto& value = options.*member;
            using T = std::remove_cvref_t<decltype(value)>;
            if constexpr (std::is_same_v<T, typename Unoptional<T>::type>) {
              return Accepts(flag.rule, value);
            } else {
              return !value.has_value() || Accepts(flag.rule, *value);  // left out: the model's
            }
          }
        },
        flag.field);
    if (accepted) continue;
    std::string message =
        absl::StrCat("--", flag.name, "=", FlagValueText(flag, options), " must be ", flag.rule.must_be);
    if (std::string model_default = ModelDefaultText(flag, defaults); !model_default.empty()) {
      absl::StrAppend(&message, "; leave it out for the model's default (", model_default, ")");
    }
    return absl::InvalidArgumentError(message);
  }
  return absl::OkStatus();
}

void FillModelDefaults(const nn::ModelDefaults& defaults, TrainOptions* options) {
  for (const Flag& flag : kFlags) {
    std::visit(
        [&](auto member, auto model_member) {
          if constexpr (!std::is_same_v<decltype(model_member), std::monostate> &&
                        !std::is_same_v<decltype(member), TableOptionField>) {
            auto& field = options->*member;
            using Field = std::remove_cvref_t<decltype(field)>;
            using Value = std::remove_cvref_t<decltype(defaults.*model_member)>;
            if constexpr (std::is_same_v<Field, std::optional<Value>>) {
              if (!field.has_value()) field = defaults.*model_member;
            } else if constexpr (FillableBy<Field, Value>()) {
              if (field.empty()) field = defaults.*model_member;  // a string left empty
            }                                                     // other pairs: refused by the static_assert on kFlags
          }
        },
        flag.field, flag.model_default);
  }
}

}  // namespace psflow::train
