// The flag table of `psflow train` (train/flags.h) as CLI11 options: the one place the table meets
// CLI11, used by `train`, `local` and `eval` (cli_main.cc) and by psflow::cli::ParseFlags
// (parse_flags.cc, which psflow.parse_flags calls).
#ifndef PSFLOW_CLI_TRAIN_FLAGS_H_
#define PSFLOW_CLI_TRAIN_FLAGS_H_

#include <initializer_list>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/string_view.h"
#include "psflow/train/options.h"

namespace psflow::cli {

// Thrown from app->parse for a value that is not of its flag's type; what() is the house line
// "--train_steps=abc must be an integer" (docs/bad-input.md), printed as it is.
class FlagValueError : public CLI::ValidationError {
 public:
  explicit FlagValueError(std::string message) : CLI::ValidationError(std::move(message)) {}
};

// Adds every flag of the table (or only those named in `only`, without "--") to `app`, bound to
// *options. Each --help line shows the value *options holds now (a caller sets its own default
// first, as `local` does for --transport), or each model's value for the flags the model defaults.
void AddTrainFlags(CLI::App* app, train::TrainOptions* options, std::initializer_list<absl::string_view> only = {});

// "--name=value" (or "--name" for a flag that is on) of every table flag given on `app`'s command
// line, with the value parsed into `options`, except the flags named in `except` (without "--").
std::vector<std::string> GivenFlagArgs(const CLI::App& app, const train::TrainOptions& options,
                                       std::initializer_list<absl::string_view> except = {});

}  // namespace psflow::cli

#endif  // PSFLOW_CLI_TRAIN_FLAGS_H_
