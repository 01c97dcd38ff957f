// psflow — one binary, subcommands (docs/design.md#command-line-and-summary):
//   psflow train  [flags]                    one task of a cluster, or single-process training
//   psflow local  --ps=N --workers=M [flags] a whole cluster as processes on 127.0.0.1
//   psflow local  ... [flags] -- CMD ARGS... the same with CMD (e.g. a PyTorch script) as the workers
//   psflow bench transport [--ps_hosts=h:p]  push/pull throughput beside raw TCP
//   psflow --version                         the version
// Errors are one line on stderr and a non-zero exit: 2 for bad flags or values (a usage error,
// naming the subcommand whose --help lists the flags), 1 for everything else (docs/bad-input.md).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_format.h"
#include "cli/local_cluster.h"
#include "cli/train_flags.h"
#include "psflow/cli/main.h"
#include "psflow/dist/cluster.h"
#include "cli/transport_bench.h"
#include "rpc/tuning.h"
#include "psflow/train/train.h"
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

int RunTrain(train::TrainOptions options) {
  if (auto s = train::ResolveTrainOptions(&options); !s.ok()) return Fail(s, 2);
  // The role comes from --job_name or from the environment: $TF_CONFIG's task (Kubeflow) or the
  // Slurm step's rank. A cluster that the flags or the environment describe wrongly is a usage error
  // (2), whichever gave it.
  auto resolved = train::ResolveTaskCluster(options);
  if (!resolved.ok()) return Fail(resolved.status(), 2);
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

int RunEval(train::TrainOptions options) {
  if (auto s = train::ResolveTrainOptions(&options); !s.ok()) return Fail(s, 2);
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

// The arguments after `local` minus the launcher's own --ps/--workers, forwarded to every task.
std::vector<std::string> ForwardedFlags(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--ps" || a == "--workers" || a == "--metrics_port") {
      ++i;  // skip its value
      continue;
    }
    if (absl::StartsWith(a, "--ps=") || absl::StartsWith(a, "--workers=") || absl::StartsWith(a, "--metrics_port=")) {
      continue;  // the launcher's own, or set per task
    }
    out.push_back(a);
  }
  return out;
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

std::string SelfPath(const char* argv0) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) return std::string(buf, n);
  return argv0;
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
  CLI::App app{"psflow: distributed training on parameter servers"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "psflow " PSFLOW_VERSION);
  app.option_defaults()->always_capture_default();  // every --help line shows its default

  train::TrainOptions train_options;
  CLI::App* train_cmd = app.add_subcommand("train", "run one task of a cluster, or train in one process");
  cli::AddTrainFlags(train_cmd, &train_options);

  train::TrainOptions local_options;
  cli::LocalClusterOptions local;
  CLI::App* local_cmd = app.add_subcommand(
      "local", "run a whole cluster as processes on 127.0.0.1; after `--`, a command to run as each worker "
               "(e.g. -- python3 train.py) with TF_CONFIG and PSFLOW_FLAGS set");
  local_cmd->add_option("--ps", local.num_ps, "number of ps tasks")->check(CLI::Range(1, 64));
  local_cmd->add_option("--workers", local.num_workers, "number of worker tasks")->check(CLI::Range(1, 64));
  cli::AddTrainFlags(local_cmd, &local_options);
  // The launcher chooses each task's role and the cluster: these stay parsed (to refuse them
  // with a clear message) but out of `psflow local --help`.
  for (const char* name : {"--job_name", "--task_index", "--ps_hosts", "--worker_hosts", "--slurm_jobs",
                           "--slurm_port_base"}) {
    local_cmd->get_option(name)->group("");
  }

  train::TrainOptions eval_options;
  CLI::App* eval_cmd = app.add_subcommand("eval", "test accuracy and cross-entropy of the newest checkpoint");
  eval_cmd->add_option("--checkpoint_dir", eval_options.checkpoint_dir, "directory the chief saved checkpoints to")->required();
  eval_cmd->add_option("--model", eval_options.model, "softmax | mlp | cnn | vgg19");
  eval_cmd->add_option("--hidden_units", eval_options.hidden_units, "hidden units of the mlp");
  eval_cmd->add_option("--data_dir", eval_options.data_dir, "directory of the MNIST IDX files");
  eval_cmd->add_option("--intra_op_threads", eval_options.intra_op_threads, "compute threads");

  CLI::App* bench_cmd = app.add_subcommand("bench", "benchmarks");
  bench_cmd->require_subcommand(1);
  std::string bench_ps;
  CLI::App* transport_cmd = bench_cmd->add_subcommand("transport", "push/pull throughput against a ps, beside raw TCP");
  transport_cmd->add_option("--ps_hosts", bench_ps, "a running ps task (default: start one on loopback)");
  std::string bench_transport = "grpc";
  transport_cmd->add_option("--transport", bench_transport, "grpc | shm (shared memory, same host only)")
      ->check(CLI::IsMember({"grpc", "shm"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    const std::vector<std::string> extras = local_cmd->remaining();
    if (local_cmd->parsed() && std::any_of(extras.begin(), extras.end(), [](const std::string& a) {
          return !a.starts_with("-");  // `psflow local ... python3 train.py`: the `--` is missing
        })) {
      std::cerr << "psflow: error: " << e.what() << "; put the command the workers run after `--` "
                << "(psflow local --ps=1 --workers=2 -- python3 train.py)" << std::endl;
      return 2;
    }
    std::cerr << "psflow: error: " << e.what() << " (see " << cli::CommandPath(app) << " --help)" << std::endl;
    return 2;
  } catch (const CLI::ParseError& e) {
    std::cerr << "psflow: error: " << e.what() << " (see " << cli::CommandPath(app) << " --help)" << std::endl;
    return 2;
  }

  if (train_cmd->parsed()) return cli::RunTrain(train_options);
  if (local_cmd->parsed()) {
    if (!local_options.job_name.empty() || local_cmd->count("--task_index") > 0 || !local_options.ps_hosts.empty() ||
        !local_options.worker_hosts.empty() || local_cmd->count("--slurm_jobs") > 0 ||
        local_cmd->count("--slurm_port_base") > 0) {
      std::cerr << "psflow: error: psflow local chooses --job_name, --task_index, --ps_hosts and --worker_hosts "
                   "itself; drop them (use psflow train to run one task, or srun psflow train under Slurm)" << std::endl;
      return 2;
    }
    // Validate the training flags once here rather than in every task.
    if (auto s = train::ResolveTrainOptions(&local_options); !s.ok()) return cli::Fail(s, 2);
    local.binary = cli::SelfPath(argv[0]);
    local.train_flags = cli::ForwardedFlags(argc, argv);
    // Every task of psflow local shares this host: tensors go through shared memory unless asked otherwise.
    if (local_cmd->count("--transport") == 0) local.train_flags.push_back("--transport=shm");
    local.metrics_port = local_options.metrics_port;
    if (has_worker_command && worker_command.empty()) {
      std::cerr << "psflow: error: psflow local: nothing after `--`; give the command each worker runs, e.g. "
                   "psflow local --ps=1 --workers=2 -- python3 train.py" << std::endl;
      return 2;
    }
    local.worker_command = worker_command;
    return cli::RunLocalCluster(local);
  }
  if (eval_cmd->parsed()) return cli::RunEval(eval_options);
  if (transport_cmd->parsed()) {
    auto status = rpc::RunTransportBenchCommand(cli::SelfPath(argv[0]), bench_ps, std::cout, bench_transport);
    if (!status.ok()) return cli::Fail(status);
    return 0;
  }
  return 2;
}
