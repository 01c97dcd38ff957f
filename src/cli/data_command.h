// `psflow data`: tools that make data files (docs/data-files.md).
//   psflow data ctr-files --out=DIR --files=N --examples_per_file=M [--seed=S] [--gzip] [--batch_size=B]
//                         [--ctr_fields=F] [--ctr_dense=D] [--ctr_test_examples=T]
// writes the synthetic CTR generator's training stream (DIR/train-00000 …, example n is example
// n % B of the generator's batch n / B, as one process training with batch B sees it) and its test
// set (DIR/test) in Criteo's layout (psflow/data/criteo.h).
#ifndef PSFLOW_SRC_CLI_DATA_COMMAND_H_
#define PSFLOW_SRC_CLI_DATA_COMMAND_H_

#include <cstdint>

#include "CLI/CLI.hpp"
#include "psflow/data/criteo.h"

namespace psflow::cli {

class DataCommand {
 public:
  // Adds `data` and its subcommands to `app`, whose parse fills this object (it must outlive the parse).
  explicit DataCommand(CLI::App* app);
  bool parsed() const { return data_->parsed(); }
  // Runs the parsed subcommand; the process's exit status (2: a bad flag value, 1: another error).
  int Run() const;

 private:
  CLI::App* data_ = nullptr;
  CLI::App* ctr_files_ = nullptr;
  data::CtrFilesOptions files_;
  uint64_t seed_ = 0;
  int num_fields_ = 26, num_dense_ = 13;
};

}  // namespace psflow::cli

#endif  // PSFLOW_SRC_CLI_DATA_COMMAND_H_
