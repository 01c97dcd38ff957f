// psflow::cli::ParseFlags (psflow/cli/flags.h): the layers of psflow's flags — defaults, the
// program's defaults, $PSFLOW_FLAGS, the command line — and $TF_CONFIG's or Slurm's role, each layer parsed by
// the CLI11 options of the flag table (cli/train_flags.h). Python's psflow.parse_flags is this.
#include <cstdlib>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "cli/train_flags.h"
#include "nlohmann/json.hpp"
#include "psflow/cli/flags.h"
#include "psflow/dist/cluster.h"
#include "psflow/dist/slurm.h"
#include "train/cluster_setup.h"

namespace psflow::cli {
namespace {

std::string EnvOr(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// Parses one layer of "--flag=value" arguments onto *options. Arguments that are not psflow flags
// go to *unparsed when it is given, else are an error naming `source`. A value of the wrong type
// gives the house line, prefixed by `source` when not empty.
absl::Status ParseLayer(const std::vector<std::string>& args, const std::string& source, train::TrainOptions* options,
                        std::vector<std::string>* unparsed) {
  if (args.empty()) return absl::OkStatus();
  const std::string prefix = source.empty() ? "" : source + ": ";
  CLI::App app{"psflow flags"};
  app.set_help_flag();  // --help belongs to the program
  app.allow_extras(true);
  AddTrainFlags(&app, options);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(reversed);
  } catch (const FlagValueError& e) {
    return absl::InvalidArgumentError(prefix + e.what());
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(absl::StrCat(source.empty() ? "flags" : source, ": ", e.what()));
  }
  std::vector<std::string> extras = app.remaining();
  if (extras.empty()) return absl::OkStatus();
  if (unparsed == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "'", extras.front(), "' is not a psflow train flag (see psflow train --help)"));
  }
  unparsed->insert(unparsed->end(), extras.begin(), extras.end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args, const std::vector<std::string>& defaults) {
  ParsedFlags flags;
  train::TrainOptions& o = flags.options;
  // 1. the program's own defaults for psflow flags;
  if (absl::Status s = ParseLayer(defaults, "defaults", &o, nullptr); !s.ok()) return s;
  // 2. the flags `psflow local` was given before `--` (a JSON array of strings);
  if (const std::string env = EnvOr("PSFLOW_FLAGS"); !env.empty()) {
    std::vector<std::string> env_args;
    try {
      env_args = nlohmann::json::parse(env).get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("PSFLOW_FLAGS must be a JSON array of strings such as [\"--train_steps=100\"]: ", e.what()));
    }
    if (absl::Status s = ParseLayer(env_args, "PSFLOW_FLAGS", &o, nullptr); !s.ok()) return s;
  }
  // 3. the command line, whose unknown arguments belong to the program.
  if (absl::Status s = ParseLayer(args, "", &o, &flags.unparsed); !s.ok()) return s;
  if (absl::Status s = train::ResolveTrainOptions(&o); !s.ok()) return s;
  // TF_CONFIG (Kubeflow) or the Slurm step (srun) gives the role when the flags do not.
  const bool environment = !EnvOr("TF_CONFIG").empty() || dist::SlurmStep::FromEnvironment().has_value();
  // (--slurm_jobs outside a step is reported where the cluster is resolved: ClusterSpec.from_flags,
  // the worker session, psflow train.)
  if (environment && o.ps_hosts.empty() && o.worker_hosts.empty()) {
    auto resolved = train::ResolveTaskCluster(o);
    if (!resolved.ok()) return resolved.status();
    // A role from a cluster, or the evaluator (TF_CONFIG's task type "evaluator": no cluster of its own).
    if (!resolved->first.empty() || resolved->second.job == "evaluator") {
      o.job_name = resolved->second.job;
      o.task_index = resolved->second.index;
    }
  }
  return flags;
}

absl::StatusOr<ParsedFlags> ParseFlags(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return ParseFlags(args);
}

}  // namespace psflow::cli
