// The ctr model trained in one process from files in Criteo's layout (programs/ctr/ctr_files.h):
// files the generator wrote give the checkpoint the generator's in-memory stream gives, byte for
// byte (plain and gzip, and across a resume); the end of the files ends training cleanly; bad
// files fail with one line naming file and line.
#include "programs/ctr/ctr_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "programs/ctr/ctr_single.h"
#include "psflow/data/criteo.h"
#include "psflow/train/train.h"

namespace psflow::train {
namespace {

class CtrFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("psflow_ctr_files_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  TrainOptions Options(const std::string& checkpoint_dir, int64_t steps) const {
    TrainOptions o;
    o.model = "ctr";
    o.seed = 3;
    o.ctr_fields = 6;
    o.ctr_dim = 8;
    o.batch_size = 64;
    o.train_steps = steps;
    o.ctr_test_examples = 512;
    o.log_every = 1000;
    o.checkpoint_dir = checkpoint_dir.empty() ? "" : Path(checkpoint_dir);
    EXPECT_TRUE(ResolveTrainOptions(&o).ok());
    return o;
  }

  // The generator's stream for Options(): `files` files of `per_file` examples, batches of 64, and
  // the 512-example test set, under DIR/name.
  void WriteFiles(const std::string& name, int64_t files, int64_t per_file, bool gzip) {
    auto generator = MakeCtrGenerator(Options("", 1));
    ASSERT_TRUE(generator.ok()) << generator.status();
    data::CtrFilesOptions o;
    o.out_dir = Path(name);
    o.files = files;
    o.examples_per_file = per_file;
    o.batch_size = 64;
    o.test_examples = 512;
    o.gzip = gzip;
    ASSERT_TRUE(data::WriteCtrFiles(*generator, o).ok());
  }

  static std::string Bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << path;
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::filesystem::path dir_;
};

void Quiet(const std::string&) {}

TEST_F(CtrFilesTest, FilesGiveTheGeneratorsCheckpointByteForByte) {
  auto memory = RunCtrSingleProcess(Options("memory", 20), Quiet);
  ASSERT_TRUE(memory.ok()) << memory.status();
  const std::string want = Bytes(Path("memory/model.ckpt-20.safetensors"));
  ASSERT_GT(want.size(), 1000u);
  for (bool gzip : {false, true}) {
    SCOPED_TRACE(gzip ? "gzip" : "plain");
    const std::string data = gzip ? "gz" : "plain", suffix = gzip ? ".gz" : "";
    WriteFiles(data, 3, 500, gzip);  // batches straddle the files: 500 is not a multiple of 64
    TrainOptions options = Options("files_" + data, 20);
    options.train_files = Path(data) + "/train-*";
    options.test_files = Path(data) + "/test" + suffix;
    auto files = RunCtrSingleProcess(options, Quiet);
    ASSERT_TRUE(files.ok()) << files.status();
    EXPECT_EQ(files->global_step, 20);
    EXPECT_TRUE(Bytes(Path("files_" + data + "/model.ckpt-20.safetensors")) == want);
    // The test file is the generator's test set: the same figures (its Bayes figures unknown).
    EXPECT_EQ(files->ctr->test_log_loss, memory->ctr->test_log_loss);
    EXPECT_EQ(files->ctr->test_auc, memory->ctr->test_auc);
    EXPECT_EQ(files->ctr->test_examples, 512);
    EXPECT_TRUE(std::isnan(files->ctr->bayes_auc));
  }
  // A resumed run skips the batches its checkpoint holds: 8 steps, then on to 20.
  TrainOptions options = Options("resumed", 8);
  options.train_files = Path("plain") + "/train-*";
  ASSERT_TRUE(RunCtrSingleProcess(options, Quiet).ok());
  options.train_steps = 20;
  auto resumed = RunCtrSingleProcess(options, Quiet);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_TRUE(Bytes(Path("resumed/model.ckpt-20.safetensors")) == want);
}

TEST_F(CtrFilesTest, TheEndOfTheFilesEndsTrainingWithACheckpoint) {
  WriteFiles("data", 2, 500, false);  // 1000 examples: 15 whole batches of 64 (40 left over)
  TrainOptions options = Options("ckpt", 100);
  options.train_files = Path("data") + "/train-*";
  std::string said;
  auto summary = RunCtrSingleProcess(options, [&](const std::string& line) { said += line + "\n"; });
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->global_step, 15);
  EXPECT_TRUE(std::filesystem::exists(Path("ckpt/model.ckpt-15.safetensors")));
  EXPECT_NE(said.find("the training files end after 1000 examples, before batch 15: training ends at step 15 of "
                      "100"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("training files: 1000 examples read, 0 bad lines skipped"), std::string::npos) << said;
}

TEST_F(CtrFilesTest, BadFilesFailWithOneLine) {
  TrainOptions options = Options("", 5);
  options.train_files = Path("absent-*");
  auto summary = RunCtrSingleProcess(options, Quiet);
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(summary.status().message().find("absent-*' match no file"), std::string::npos) << summary.status();

  std::ofstream(Path("bad")) << "1\t2\t3\n";
  options.train_files = Path("bad");
  summary = RunCtrSingleProcess(options, Quiet);
  EXPECT_NE(summary.status().message().find("data file " + Path("bad") +
                                            " line 1: 3 tab-separated fields; expected "
                                            "20 (label, 13 integers and 6 categoricals)"),
            std::string::npos)
      << summary.status();
  options.max_bad_lines = 1;  // skipped, and then the files hold no batch: training ends at step 0
  summary = RunCtrSingleProcess(options, Quiet);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->global_step, 0);

  TrainOptions mlp;
  mlp.model = "mlp";
  mlp.train_files = "x";
  ASSERT_TRUE(ResolveTrainOptions(&mlp).ok());
  EXPECT_NE(TrainSingleProcess(mlp, Quiet)
                .status()
                .message()
                .find("--train_files and --test_files are the ctr model's data; --model=mlp reads --data_dir"),
            std::string::npos);
}

}  // namespace
}  // namespace psflow::train
