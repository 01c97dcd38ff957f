// psflow/cli/flags.h — `psflow train`'s flags for a program of your own, parsed exactly as
// `psflow train` and Python's psflow.parse_flags parse them (the same flag table and the same
// layering), so that a C++ program with its own data loop runs under `psflow local -- ./prog`,
// by TF_CONFIG, or by hand with --job_name/--ps_hosts/--worker_hosts like a psflow task:
//
//   auto flags = psflow::cli::ParseFlags(argc, argv);
//   if (!flags.ok()) { std::cerr << flags.status().message() << "\n"; return 2; }
//   // flags->options: a resolved train::TrainOptions; flags->unparsed: the program's own arguments
//
// The layers, lowest first: the flag defaults (and the --model's for the flags it defaults), the
// program's `defaults`, $PSFLOW_FLAGS (a JSON array of "--flag=value" strings, set by `psflow
// local` for a worker command), then the command line. $TF_CONFIG, or else the Slurm step of an
// srun task (psflow/dist/slurm.h), gives job_name and task_index
// when neither --ps_hosts nor --worker_hosts is given. Every value is validated as `psflow train`
// does; an error is InvalidArgument with the same one line.
#ifndef PSFLOW_CLI_FLAGS_H_
#define PSFLOW_CLI_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/train/options.h"

namespace psflow::cli {

struct ParsedFlags {
  train::TrainOptions options;        // resolved: model defaults filled in, every value checked
  std::vector<std::string> unparsed;  // command-line arguments psflow does not know, in order
};

// `args`: the command line without the program name. `defaults`: the program's own defaults for
// psflow flags as "--flag=value" strings (an unknown one is an error, not unparsed).
absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args,
                                       const std::vector<std::string>& defaults = {});
// The same for main's arguments (argv[0], the program, is skipped).
absl::StatusOr<ParsedFlags> ParseFlags(int argc, const char* const* argv);

}  // namespace psflow::cli

#endif  // PSFLOW_CLI_FLAGS_H_
