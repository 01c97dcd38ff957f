// `psflow data` (cli/data_command.h).
#include "cli/data_command.h"

#include <iostream>
#include <string>

#include "absl/strings/str_format.h"
#include "psflow/data/ctr.h"

namespace psflow::cli {

DataCommand::DataCommand(CLI::App* app) {
  data_ = app->add_subcommand("data", "make data files: the synthetic CTR data in Criteo's layout");
  data_->require_subcommand(1);
  ctr_files_ = data_->add_subcommand(
      "ctr-files",
      "write the synthetic CTR generator's training stream and test set as files in Criteo's layout "
      "(label, integers, hex categoricals; tab-separated), train-00000 … and test");
  CLI::App* c = ctr_files_;
  c->add_option("--out", files_.out_dir, "directory to write the files into (created if absent)")->required();
  c->add_option("--files", files_.files, "training files");
  c->add_option("--examples_per_file", files_.examples_per_file, "examples in each training file")->required();
  c->add_option("--seed", seed_, "the generator's seed (the training job's --seed)");
  c->add_flag("--gzip", files_.gzip, "gzip the files (names end in .gz)");
  c->add_option("--batch_size", files_.batch_size,
                "the global batch size the stream is cut for: one process training with this batch size on the "
                "files in order sees the generator's batches bit for bit");
  c->add_option("--ctr_fields", num_fields_, "categorical fields per example");
  c->add_option("--ctr_dense", num_dense_, "integer (dense) features per example");
  c->add_option("--ctr_test_examples", files_.test_examples, "examples of the test file (0: no test file)");
  c->add_option("--threads", files_.threads, "files written at once (0: one per core)");
}

int DataCommand::Run() const {
  // Values out of range: the house line (docs/bad-input.md), exit 2.
  auto out_of_range = [](const std::string& flag, int64_t value, const std::string& must) {
    std::cerr << "psflow: error: --" << flag << "=" << value << " must be " << must << std::endl;
    return 2;
  };
  if (files_.files < 1 || files_.files > 100000) return out_of_range("files", files_.files, "between 1 and 100000");
  if (files_.examples_per_file < 1) return out_of_range("examples_per_file", files_.examples_per_file, "at least 1");
  if (files_.batch_size < 1) return out_of_range("batch_size", files_.batch_size, "at least 1");
  if (num_fields_ < 1 || num_fields_ > 4096) return out_of_range("ctr_fields", num_fields_, "between 1 and 4096");
  if (num_dense_ < 0 || num_dense_ > 4096) return out_of_range("ctr_dense", num_dense_, "between 0 and 4096");
  if (files_.test_examples < 0) {
    return out_of_range("ctr_test_examples", files_.test_examples, "0 (no test file) or more");
  }
  if (files_.threads < 0 || files_.threads > 1024) {
    return out_of_range("threads", files_.threads, "between 0 (one per core) and 1024");
  }
  data::CtrConfig config;
  config.seed = seed_;
  config.num_fields = num_fields_;
  config.num_dense = num_dense_;
  absl::StatusOr<data::CtrGenerator> generator = data::CtrGenerator::Create(config);
  if (!generator.ok()) {
    std::cerr << "psflow: error: " << generator.status().message() << std::endl;
    return 2;
  }
  absl::StatusOr<std::vector<std::string>> paths = data::WriteCtrFiles(*generator, files_);
  if (!paths.ok()) {
    std::cerr << "psflow: error: " << paths.status().message() << std::endl;
    return absl::IsInvalidArgument(paths.status()) ? 2 : 1;
  }
  std::cout << absl::StrFormat(
                   "wrote %d training file%s of %d examples (batches of %d from seed %d) and %s to %s; read them "
                   "with --train_files='%s/train-*'",
                   files_.files, files_.files == 1 ? "" : "s", files_.examples_per_file, files_.batch_size, seed_,
                   files_.test_examples > 0 ? absl::StrFormat("a test file of %d examples", files_.test_examples)
                                            : std::string("no test file"),
                   files_.out_dir, files_.out_dir)
            << std::endl;
  return 0;
}

}  // namespace psflow::cli
