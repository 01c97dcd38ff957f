// The flags of `psflow train` (docs/design.md#command-line-and-summary), registered on a CLI11
// app; shared by `train` and `local`, which forwards them to every task it starts.
#ifndef PSFLOW_CLI_TRAIN_FLAGS_H_
#define PSFLOW_CLI_TRAIN_FLAGS_H_

#include "CLI/CLI.hpp"
#include "psflow/train/options.h"

namespace psflow::cli {

void AddTrainFlags(CLI::App* app, train::TrainOptions* options);

}  // namespace psflow::cli

#endif  // PSFLOW_CLI_TRAIN_FLAGS_H_
