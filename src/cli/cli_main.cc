// psflow — one binary, subcommands (docs/design.md#command-line-and-summary):
//   psflow train  [flags]                    one task of a cluster, or single-process training
//   psflow local  --ps=N --workers=M [flags] a whole cluster as processes on 127.0.0.1
//   psflow local  ... [flags] -- CMD ARGS... the same with CMD (e.g. a PyTorch script) as the workers
//   psflow eval   --checkpoint_dir=DIR [--watch] the newest checkpoint's metrics; --watch: the evaluator task
//   psflow bench transport [--ps_hosts=h:p]  push/pull throughput beside raw TCP
//   psflow data ctr-files --out=DIR ...      the synthetic CTR data as files in Criteo's layout
//   psflow --version                         the version
// Errors are one line on stderr and a non-zero exit: 2 for bad flags or values (a usage error,
// naming the subcommand whose --help lists the flags), 1 for everything else (docs/bad-input.md).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "cli/data_command.h"
#include "cli/local_cluster.h"
#include "cli/train_flags.h"
#include "cli/transport_bench.h"
#include "programs/ctr/eval_ctr.h"
#include "programs/eval/evaluator.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/safetensors_stream.h"
#include "psflow/cli/main.h"
#include "psflow/dist/cluster.h"
#include "psflow/train/train.h"
#include "rpc/tuning.h"
#include "train/cluster_setup.h"

namespace psflow::cli {
namespace {

int Fail(const absl::Status& status, int code = 1) {
  std::cerr << "psflow: error: " << status.message() << std::endl;
  return code;
}

// On a terminal, progress lines ("step N/M ...") overwrite each other as one live line; other
// lines, and all lines when the output is a file or pipe, are printed whole.
void LogLine(const std::string& line) {
  static const bool tty = isatty(STDOUT_FILENO);
  if (!tty) {
    std::cout << line << std::endl;
    return;
  }
  if (line.starts_with("step ")) {
    std::cout << "\r\x1b[2K" << line << std::flush;
  } else {
    std::cout << "\r\x1b[2K" << line << std::endl;
  }
}

// The evaluator task (programs/eval/evaluator.h): a "done" marker below an explicitly given --train_steps
// is an earlier run's.
int RunEvaluatorTask(const train::TrainOptions& options, bool train_steps_given) {
  train::WatchOptions watch;
  watch.checkpoint_dir = options.checkpoint_dir;
  if (train_steps_given) watch.final_step = options.train_steps;
  watch.timeout_secs = options.eval_timeout_secs;
  if (auto s = train::RunEvaluator(options, watch, LogLine); !s.ok()) {
    return Fail(s, absl::IsInvalidArgument(s) ? 2 : 1);
  }
  return 0;
}

int RunTrain(train::TrainOptions options) {
  const bool train_steps_given = options.train_steps.has_value();
  if (auto s = train::ResolveTrainOptions(&options); !s.ok()) return Fail(s, 2);
  // The role comes from --job_name or from the environment: $TF_CONFIG's task (Kubeflow) or the
  // Slurm step's rank. A cluster that the flags or the environment describe wrongly is a usage error
  // (2), whichever gave it.
  auto resolved = train::ResolveTaskCluster(options);
  if (!resolved.ok()) return Fail(resolved.status(), 2);
  // The evaluator (--job_name=evaluator or TF_CONFIG's task type) talks to no task of the cluster.
  if (resolved->second.job == "evaluator") return RunEvaluatorTask(options, train_steps_given);
  const bool distributed = !options.job_name.empty() || !resolved->first.empty();
  if (!distributed) {
    auto summary = train::TrainSingleProcess(options, LogLine);
    if (!summary.ok()) return Fail(summary.status());
    std::cout << train::FormatSummary(*summary) << std::flush;
    if (!options.metrics_json.empty()) {
      if (auto s = train::WriteSummaryJson(*summary, options.metrics_json); !s.ok()) return Fail(s);
    }
    return 0;
  }
  if (auto s = resolved->first.Validate(resolved->second); !s.ok()) return Fail(s, 2);
  if (resolved->second.job == "ps") {
    if (auto s = train::RunParameterServer(options, LogLine); !s.ok()) return Fail(s);
    return 0;
  }
  // The chief's worker session prints the final summary and writes --metrics_json itself.
  auto summary = train::RunWorker(options, LogLine);
  if (!summary.ok()) return Fail(summary.status());
  return 0;
}

// `psflow eval` without --model: the model the newest checkpoint names (its metadata's "model"),
// so a checkpoint is evaluated as what it is. A directory that does not exist is said as such.
absl::Status CheckpointDirExists(const train::TrainOptions& options) {
  if (std::filesystem::is_directory(options.checkpoint_dir)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("--checkpoint_dir=", options.checkpoint_dir,
                                          " does not exist or is not a directory (give the directory the chief "
                                          "saved its checkpoints to)"));
}

void TakeModelOfCheckpoint(train::TrainOptions* options) {
  // The newest file's header only (its metadata): the evaluation reads and checks the file itself,
  // and says so when there is no valid checkpoint.
  for (const auto& [step, path] : ckpt::ListCheckpoints(options->checkpoint_dir)) {
    auto reader = ckpt::SafetensorsReader::Open(path);
    if (!reader.ok()) continue;
    const auto& metadata = (*reader)->metadata();
    if (auto it = metadata.find("model"); it != metadata.end()) options->model = it->second;
    break;
  }
}

int RunEval(train::TrainOptions options, bool watch, bool model_given) {
  const bool train_steps_given = options.train_steps.has_value();
  // Bad flag values are usage errors (2) before a missing directory (1) is looked at.
  const bool dir_exists = CheckpointDirExists(options).ok();
  if (!watch && !model_given && dir_exists) {
    TakeModelOfCheckpoint(&options);
  }
  if (auto s = train::ResolveTrainOptions(&options); !s.ok()) return Fail(s, 2);
  if (!watch && !dir_exists) return Fail(CheckpointDirExists(options));
  if (watch) return RunEvaluatorTask(options, train_steps_given);
  if (options.model == "ctr") {  // tables: rows read from the file for the test set's ids
    auto ctr = train::EvaluateCtrCheckpoint(options, LogLine);
    if (!ctr.ok()) return Fail(ctr.status());
    const train::CtrFigures& f = ctr->figures;
    std::cout << absl::StrFormat(
                     "eval: %s global_step=%d test_log_loss=%.5f (bayes %.5f) test_auc=%.5f (bayes %.5f) on %d "
                     "examples; table_rows=%d (%d looked-up ids not in the file: initial values)",
                     ctr->path, ctr->global_step, f.test_log_loss, f.bayes_log_loss, f.test_auc, f.bayes_auc,
                     f.test_examples, f.table_rows, ctr->rows_not_in_file)
              << std::endl;
    return 0;
  }
  auto result = train::EvaluateCheckpoint(options, LogLine);
  if (!result.ok()) return Fail(result.status());
  std::cout << absl::StrFormat(
                   "eval: %s global_step=%d test_accuracy=%.4f test_cross_entropy=%.4f validation_accuracy=%.4f "
                   "validation_cross_entropy=%.4f",
                   result->path, result->global_step, result->test.accuracy, result->test.cross_entropy,
                   result->validation.accuracy, result->validation.cross_entropy)
            << std::endl;
  return 0;
}

// `psflow local [flags] -- CMD ARGS...`: the command after the first `--` (removed from argv by
// shortening *argc), or empty.
std::vector<std::string> SplitWorkerCommand(int* argc, char** argv) {
  if (*argc < 2 || std::string_view(argv[1]) != "local") return {};
  for (int i = 2; i < *argc; ++i) {
    if (std::string_view(argv[i]) != "--") continue;
    std::vector<std::string> command(argv + i + 1, argv + *argc);
    *argc = i;
    return command;
  }
  return {};
}

// "psflow train" (the subcommands being parsed when a parse error struck), for "see ... --help".
std::string CommandPath(const CLI::App& app) {
  std::string path = "psflow";
  const CLI::App* at = &app;
  while (true) {
    std::vector<const CLI::App*> chosen = at->get_subcommands([](const CLI::App* sub) { return sub->parsed(); });
    if (chosen.empty()) return path;
    at = chosen.front();
    path += " " + at->get_name();
  }
}

// Edits needed to turn `a` into `b` (Levenshtein distance).
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "unknown subcommand 'trian'; the closest is 'train'" when the deepest command being parsed wants
// a subcommand and was given a word that names none, else "".
std::string UnknownSubcommand(const CLI::App& app) {
  const CLI::App* at = &app;
  while (true) {
    std::vector<const CLI::App*> chosen = at->get_subcommands([](const CLI::App* sub) { return sub->parsed(); });
    if (chosen.empty()) break;
    at = chosen.front();
  }
  if (at->get_require_subcommand_min() == 0) return "";
  const std::vector<std::string> extras = at->remaining();
  auto word = std::find_if(extras.begin(), extras.end(), [](const std::string& a) { return !a.starts_with("-"); });
  if (word == extras.end()) return "";
  std::string closest;
  size_t best = std::string::npos;
  for (const CLI::App* sub : at->get_subcommands([](const CLI::App*) { return true; })) {
    const size_t d = EditDistance(*word, sub->get_name());
    if (d < best) {
      best = d;
      closest = sub->get_name();
    }
  }
  return absl::StrCat("unknown subcommand '", *word, "'; the closest is '", closest, "'");
}

// "unknown flag --modle; did you mean --model?" for the first extra flag of the subcommand being
// parsed whose name is close to one of its flags (edit distance at most a third of the name, and
// at least 2); "" when there is none.
std::string UnknownFlag(const CLI::App& app) {
  const CLI::App* at = &app;
  while (true) {
    std::vector<const CLI::App*> chosen = at->get_subcommands([](const CLI::App* sub) { return sub->parsed(); });
    if (chosen.empty()) break;
    at = chosen.front();
  }
  for (const std::string& extra : at->remaining()) {
    if (!extra.starts_with("--") || extra == "--") continue;
    const std::string name =
        extra.substr(2, extra.find('=') == std::string::npos ? std::string::npos : extra.find('=') - 2);
    std::string closest;
    size_t best = std::string::npos;
    for (const CLI::Option* option : at->get_options()) {
      for (const std::string& long_name : option->get_lnames()) {
        const size_t d = EditDistance(name, long_name);
        if (d < best) {
          best = d;
          closest = long_name;
        }
      }
    }
    if (!closest.empty() && best <= std::max<size_t>(2, name.size() / 3)) {
      return absl::StrCat("unknown flag --", name, "; did you mean --", closest, "?");
    }
  }
  return "";
}

// The command line: each subcommand and the options app.parse fills in.
struct CommandLine {
  CLI::App app{"psflow: distributed training on parameter servers"};
  CLI::App* train_cmd = nullptr;
  train::TrainOptions train_options;
  CLI::App* local_cmd = nullptr;
  train::TrainOptions local_options;
  LocalClusterOptions local;
  CLI::App* eval_cmd = nullptr;
  train::TrainOptions eval_options;
  bool eval_watch = false;
  CLI::App* transport_cmd = nullptr;
  std::string bench_ps;
  std::string bench_transport = "grpc";
};

void AddTrainCommand(CommandLine& c) {
  c.train_cmd = c.app.add_subcommand("train", "run one task of a cluster, or train in one process");
  AddTrainFlags(c.train_cmd, &c.train_options);
}

void AddLocalCommand(CommandLine& c) {
  // Every task of psflow local shares this host: tensors go through shared memory unless asked
  // otherwise (set before the flags are added, so that `psflow local --help` shows it).
  c.local_options.transport = "shm";
  c.local_cmd =
      c.app.add_subcommand("local",
                           "run a whole cluster as processes on 127.0.0.1; after `--`, a command to run as each worker "
                           "(e.g. -- python3 train.py) with TF_CONFIG and PSFLOW_FLAGS set");
  c.local_cmd->add_option("--ps", c.local.num_ps, "number of ps tasks")->check(CLI::Range(1, 64));
  c.local_cmd->add_option("--workers", c.local.num_workers, "number of worker tasks")->check(CLI::Range(1, 64));
  c.local_cmd->add_flag("--evaluator", c.local.evaluator,
                        "also run an evaluator task: it evaluates each new checkpoint of --checkpoint_dir (needed) "
                        "and writes eval/ summaries under --logdir (docs/evaluator.md)");
  AddTrainFlags(c.local_cmd, &c.local_options);
  // The launcher chooses each task's role and the cluster: these stay parsed (to refuse them
  // with a clear message) but out of `psflow local --help`.
  for (const char* name :
       {"--job_name", "--task_index", "--ps_hosts", "--worker_hosts", "--slurm_jobs", "--slurm_port_base"}) {
    c.local_cmd->get_option(name)->group("");
  }
}

void AddEvalCommand(CommandLine& c) {
  c.eval_cmd = c.app.add_subcommand(
      "eval",
      "test accuracy and cross-entropy of the newest checkpoint (ctr: test log-loss and AUC beside Bayes); "
      "with --watch, of each new one until training ends (the evaluator task)");
  c.eval_cmd->add_flag("--watch", c.eval_watch,
                       "evaluate each new checkpoint as it appears, write eval/ summaries under --logdir, and exit "
                       "after the final one (docs/evaluator.md)");
  AddTrainFlags(
      c.eval_cmd, &c.eval_options,
      {"checkpoint_dir", "model", "hidden_units", "data_dir", "intra_op_threads", "seed", "ctr_fields", "ctr_dense", "ctr_dim",
       "ctr_vocab", "ctr_preset", "ctr_test_examples", "test_files", "max_bad_lines", "logdir", "train_steps",
       "eval_timeout_secs"});
  c.eval_cmd->get_option("--checkpoint_dir")->required();
}

void AddBenchCommand(CommandLine& c) {
  CLI::App* bench_cmd = c.app.add_subcommand("bench", "benchmarks");
  bench_cmd->require_subcommand(1);
  c.transport_cmd = bench_cmd->add_subcommand("transport", "push/pull throughput against a ps, beside raw TCP");
  c.transport_cmd->add_option("--ps_hosts", c.bench_ps, "a running ps task (default: start one on loopback)");
  c.transport_cmd->add_option("--transport", c.bench_transport, "grpc | shm (shared memory, same host only)")
      ->check(CLI::IsMember({"grpc", "shm"}));
}

// Parses argv into `c`: nullopt when the command line names something to run, else the exit code
// (help and version printed: 0; a usage error: 2, with the house line).
std::optional<int> Parse(CommandLine& c, int argc, char** argv) {
  try {
    c.app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp& e) {
    return c.app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return c.app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return c.app.exit(e);
  } catch (const FlagValueError& e) {
    std::cerr << "psflow: error: " << e.what() << std::endl;  // the house line, as for any bad value
    return 2;
  } catch (const CLI::ExtrasError& e) {
    const std::vector<std::string> extras = c.local_cmd->remaining();
    if (c.local_cmd->parsed() && std::any_of(extras.begin(), extras.end(), [](const std::string& a) {
          return !a.starts_with("-");  // `psflow local ... python3 train.py`: the `--` is missing
        })) {
      std::cerr << "psflow: error: " << e.what() << "; put the command the workers run after `--` "
                << "(psflow local --ps=1 --workers=2 -- python3 train.py)" << std::endl;
      return 2;
    }
    const std::string unknown = UnknownFlag(c.app);
    std::cerr << "psflow: error: " << (unknown.empty() ? std::string(e.what()) : unknown) << " (see "
              << CommandPath(c.app) << " --help)" << std::endl;
    return 2;
  } catch (const CLI::ParseError& e) {
    const std::string unknown = UnknownSubcommand(c.app);
    std::cerr << "psflow: error: " << (unknown.empty() ? std::string(e.what()) : unknown) << " (see "
              << CommandPath(c.app) << " --help)" << std::endl;
    return 2;
  }
}

std::string SelfPath(const char* argv0) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) return std::string(buf, n);
  return argv0;
}

// `psflow local`: the given flags checked once here rather than in every task, then the cluster.
// `has_worker_command`: argv had a `--`; `worker_command`: what followed it.
int RunLocal(CommandLine& c, bool has_worker_command, const std::vector<std::string>& worker_command,
             const char* argv0) {
  const train::TrainOptions& o = c.local_options;
  if (!o.job_name.empty() || c.local_cmd->count("--task_index") > 0 || !o.ps_hosts.empty() || !o.worker_hosts.empty() ||
      c.local_cmd->count("--slurm_jobs") > 0 || c.local_cmd->count("--slurm_port_base") > 0) {
    std::cerr << "psflow: error: psflow local chooses the cluster itself; drop --job_name, --task_index, --ps_hosts, "
                 "--worker_hosts, --slurm_jobs and --slurm_port_base (use psflow train to run one task, or "
                 "srun psflow train under Slurm)"
              << std::endl;
    return 2;
  }
  if (auto s = train::ResolveTrainOptions(&c.local_options); !s.ok()) return Fail(s, 2);
  LocalClusterOptions& local = c.local;
  local.binary = SelfPath(argv0);
  // The flags given, as parsed; --metrics_port is set per task. The tasks' own --transport
  // default is grpc, so local's is always passed on.
  local.train_flags = GivenFlagArgs(*c.local_cmd, o, {"metrics_port", "transport"});
  local.train_flags.push_back("--transport=" + o.transport);
  local.metrics_port = o.metrics_port;
  local.intra_op_threads = o.intra_op_threads;
  if (has_worker_command && worker_command.empty()) {
    std::cerr << "psflow: error: psflow local: nothing after `--`; give the command each worker runs, e.g. "
                 "psflow local --ps=1 --workers=2 -- python3 train.py"
              << std::endl;
    return 2;
  }
  local.worker_command = worker_command;
  local.checkpoint_dir = o.checkpoint_dir;
  if (local.evaluator && local.checkpoint_dir.empty()) {
    std::cerr << "psflow: error: psflow local --evaluator needs --checkpoint_dir=DIR: the evaluator reads the "
                 "chief's checkpoints from it"
              << std::endl;
    return 2;
  }
  return RunLocalCluster(local);
}

int RunBenchTransport(const CommandLine& c, const char* argv0) {
  auto status = RunTransportBenchCommand(SelfPath(argv0), c.bench_ps, std::cout, c.bench_transport);
  if (!status.ok()) return Fail(status);
  return 0;
}

}  // namespace
}  // namespace psflow::cli

int psflow::cli::Main(int argc, char** argv) {
  using namespace psflow;
  rpc::TuneAllocatorForLargeMessages();
  // Debian's abseil enables deadlock detection, a process-wide lock taken on every mutex
  // operation (5x the cost of the lock itself on the ps hot path).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const bool has_worker_command = std::find(argv, argv + argc, std::string_view("--")) != argv + argc;
  const std::vector<std::string> worker_command = cli::SplitWorkerCommand(&argc, argv);
  cli::CommandLine c;
  c.app.require_subcommand(1);
  c.app.set_version_flag("--version", "psflow " PSFLOW_VERSION);
  c.app.option_defaults()->always_capture_default();  // every --help line shows its default
  cli::AddTrainCommand(c);
  cli::AddLocalCommand(c);
  cli::AddEvalCommand(c);
  cli::AddBenchCommand(c);
  cli::DataCommand data_cmd(&c.app);
  if (std::optional<int> code = cli::Parse(c, argc, argv)) return *code;

  if (c.train_cmd->parsed()) return cli::RunTrain(c.train_options);
  if (c.local_cmd->parsed()) return cli::RunLocal(c, has_worker_command, worker_command, argv[0]);
  if (c.eval_cmd->parsed()) return cli::RunEval(c.eval_options, c.eval_watch, c.eval_cmd->count("--model") > 0);
  if (c.transport_cmd->parsed()) return cli::RunBenchTransport(c, argv[0]);
  if (data_cmd.parsed()) return data_cmd.Run();
  return 2;
}
