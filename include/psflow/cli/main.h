// psflow/cli/main.h — the whole `psflow` command line as a function, so that a program of your
// own (one that registers its own models with nn::RegisterModel first) is a complete psflow
// binary: `my_program train|local|eval|bench ...` with every flag of docs/design.md#command-line-and-summary. `local`
// starts the tasks by re-running the calling program, so they know the same models.
#ifndef PSFLOW_CLI_MAIN_H_
#define PSFLOW_CLI_MAIN_H_

namespace psflow::cli {

// Parses argv, runs the subcommand and returns the process exit status.
int Main(int argc, char** argv);

}  // namespace psflow::cli

#endif  // PSFLOW_CLI_MAIN_H_
