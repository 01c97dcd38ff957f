// The ctr model trained in one process from files in Criteo's layout (programs/ctr/ctr_files.h):
// files the generator wrote give the checkpoint the generator's in-memory stream gives, byte for
// byte (plain and gzip, and across a resume); the end of the files ends training cleanly; bad
// files fail with one line naming file and line.
#include "programs/ctr/ctr_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "programs/ctr/ctr_single.h"
#include "programs/ctr/eval_ctr.h"
#include "ps/server/work_queue.h"
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

constexpr int kDense = 13;  // --ctr_dense's default

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
  EXPECT_NE(said.find("training files: 1000 examples read in 1 epoch(s), 0 bad lines skipped"), std::string::npos)
      << said;
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

// Other logs in Criteo's layout: --ctr_dense=5 and --ctr_fields=7 throughout (the generator, its
// files, the reader, the model, the checkpoint's evaluation): files of 5 integers and 7
// categoricals train to the checkpoint the generator in memory gives; a job whose counts differ
// from the files' fails in one line naming file, line and the flags.
TEST_F(CtrFilesTest, OtherFieldCountsTrainAndAMismatchIsRefused) {
  TrainOptions options = Options("memory", 12);
  options.ctr_dense = 5;
  options.ctr_fields = 7;
  auto memory = RunCtrSingleProcess(options, Quiet);
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto generator = MakeCtrGenerator(options);
  ASSERT_TRUE(generator.ok()) << generator.status();
  data::CtrFilesOptions write;
  write.out_dir = Path("data");
  write.files = 2;
  write.examples_per_file = 400;
  write.batch_size = 64;
  write.test_examples = 512;
  ASSERT_TRUE(data::WriteCtrFiles(*generator, write).ok());
  std::ifstream first(Path("data/train-00000"));
  std::string line;
  ASSERT_TRUE(std::getline(first, line));
  EXPECT_EQ(std::count(line.begin(), line.end(), '\t'), 1 + 5 + 7 - 1) << line;

  options.checkpoint_dir = Path("files");
  options.train_files = Path("data/train-*");
  options.test_files = Path("data/test");
  auto files = RunCtrSingleProcess(options, Quiet);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->global_step, 12);
  EXPECT_TRUE(Bytes(Path("files/model.ckpt-12.safetensors")) == Bytes(Path("memory/model.ckpt-12.safetensors")));
  EXPECT_EQ(files->ctr->test_auc, memory->ctr->test_auc);
  // psflow eval of the checkpoint with the same flags: the model's 5 dense inputs.
  auto eval = EvaluateCtrCheckpoint(options, Quiet);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->figures.test_auc, memory->ctr->test_auc);

  TrainOptions mismatch = options;  // the default 13 integers against the files' 5
  mismatch.ctr_dense = 13;
  mismatch.checkpoint_dir = Path("mismatch");
  mismatch.test_files = "";  // (read first, it would be refused the same way)
  auto refused = RunCtrSingleProcess(mismatch, Quiet);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "data file " + Path("data/train-00000") +
                " line 1: 13 tab-separated fields; expected 21 (label, 13 integers and 7 categoricals): set "
                "--ctr_dense and --ctr_fields to the files' counts (--max_bad_lines=N skips up to N bad lines)");
  // psflow eval likewise: the test files refused, and the checkpoint of 5 dense inputs read as 13.
  mismatch.checkpoint_dir = Path("files");
  mismatch.test_files = Path("data/test");
  EXPECT_NE(EvaluateCtrCheckpoint(mismatch, Quiet)
                .status()
                .message()
                .find("data file " + Path("data/test") + " line 1: 13 tab-separated fields; expected 21"),
            std::string::npos);
  mismatch.test_files = "";
  auto not_evaluated = EvaluateCtrCheckpoint(mismatch, Quiet);
  EXPECT_NE(not_evaluated.status().message().find("check --ctr_fields, --ctr_dense and --ctr_dim"), std::string::npos)
      << not_evaluated.status();
}

// A training file removed while the job runs fails it with one line naming the file; the job's
// last checkpoint is intact and the job resumes from it once the file is back. A truncated gzip
// file fails naming file and line.
TEST_F(CtrFilesTest, AFileRemovedMidRunOrTruncatedFailsNamingItAndTheCheckpointStays) {
  WriteFiles("data", 2, 640, false);  // 10 batches a file
  const std::string second = Path("data/train-00001"), kept = Bytes(second);
  TrainOptions options = Options("ckpt", 16);
  options.train_files = Path("data") + "/train-*";
  options.save_checkpoint_steps = 4;
  options.log_every = 2;
  // The progress line of step 4 comes on the training thread, after the step-4 save and while the
  // first file is still being read: the second is removed before its reader opens it.
  auto run = RunCtrSingleProcess(options, [&](const std::string& line) {
    if (line.find("step 4/16") != std::string::npos) std::filesystem::remove(second);
  });
  EXPECT_EQ(run.status().code(), absl::StatusCode::kNotFound) << run.status();
  EXPECT_NE(run.status().message().find("data file " + second + ": cannot open it: No such file"), std::string::npos)
      << run.status();
  EXPECT_TRUE(std::filesystem::exists(Path("ckpt/model.ckpt-8.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(Path("ckpt/model.ckpt-12.safetensors")));
  std::ofstream(second, std::ios::binary) << kept;
  std::string said;
  auto resumed = RunCtrSingleProcess(options, [&](const std::string& line) { said += line + "\n"; });
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->global_step, 16);
  EXPECT_NE(said.find("at global step 8"), std::string::npos) << said;

  WriteFiles("gz", 1, 20000, true);
  const std::string whole = Bytes(Path("gz/train-00000.gz"));
  std::ofstream(Path("gz/train-00000.gz"), std::ios::binary) << whole.substr(0, whole.size() / 2);
  options = Options("", 1000);
  options.train_files = Path("gz/train-*");
  run = RunCtrSingleProcess(options, Quiet);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kDataLoss) << run.status();
  EXPECT_NE(run.status().message().find("data file " + Path("gz/train-00000.gz") + " line "), std::string::npos)
      << run.status();
  EXPECT_NE(run.status().message().find("truncated gzip stream"), std::string::npos) << run.status();
}

// All examples of a slice source, read in batches of `n` (the last one short).
std::vector<int64_t> AllIds(CtrSliceReader& reader, int fields) {
  std::vector<int64_t> all, ids(100 * fields);
  std::vector<float> dense(100 * kDense), labels(100);
  for (;;) {
    auto n = reader.Read(100, ids.data(), dense.data(), labels.data());
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) break;
    all.insert(all.end(), ids.begin(), ids.begin() + *n * fields);
  }
  return all;
}

// The work queue's plan cuts the files into slices that read every line once: the slices of the
// plan in order give the files' examples (plain and gzip, many slices a file and fewer).
TEST_F(CtrFilesTest, ThePlansSlicesReadEveryLineOnce) {
  for (bool gzip : {false, true}) {
    SCOPED_TRACE(gzip ? "gzip" : "plain");
    const std::string data = gzip ? "gz" : "plain";
    WriteFiles(data, 3, 700, gzip);
    auto files = data::ExpandCriteoFiles(Path(data) + "/train-*");
    ASSERT_TRUE(files.ok());
    const TrainOptions o = Options("", 1);
    CtrSliceReader whole(FixedOrderSlices(*files, 1, false, 0), CtrReaderOptions(o));
    const std::vector<int64_t> want = AllIds(whole, o.ctr_fields);
    ASSERT_EQ(want.size(), 2100u * o.ctr_fields);
    EXPECT_EQ(whole.epochs_begun(), 1);
    for (int64_t slices : {1, 5, 12}) {
      auto plan = MakeCtrWorkPlan(*files, slices, 1, false, 0);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_TRUE(ps::CheckWorkPlan(*plan).ok());
      EXPECT_EQ(plan->slices.size(), static_cast<size_t>(std::max<int64_t>(slices, 3)));
      size_t next = 0;
      SliceSource in_order;
      in_order.next = [&](int64_t, int64_t) -> absl::StatusOr<std::optional<EpochSlice>> {
        if (next == plan->slices.size()) return std::optional<EpochSlice>();
        const ps::WorkSlice& w = plan->slices[next++];
        return std::optional<EpochSlice>(EpochSlice{
            {plan->files[w.file], w.begin, w.end == ps::kWorkSliceToEnd ? data::CriteoSlice::kToEnd : w.end}, 0});
      };
      CtrSliceReader sliced(in_order, CtrReaderOptions(o));
      EXPECT_TRUE(AllIds(sliced, o.ctr_fields) == want) << slices << " slices";
    }
  }
}

// Epochs: the fixed order passes over the files --num_epochs times, shuffled per epoch from the
// seed; the end of the last epoch ends training.
TEST_F(CtrFilesTest, EpochsPassOverTheFilesInTheirOrder) {
  WriteFiles("data", 4, 100, false);
  TrainOptions o = Options("", 1);
  o.train_files = Path("data") + "/train-*";
  auto files = data::ExpandCriteoFiles(o.train_files);
  ASSERT_TRUE(files.ok());
  std::vector<std::vector<int64_t>> per_file;
  for (const std::string& f : *files) {
    CtrSliceReader one(FixedOrderSlices({f}, 1, false, 0), CtrReaderOptions(o));
    per_file.push_back(AllIds(one, o.ctr_fields));
  }
  CtrSliceReader epochs(FixedOrderSlices(*files, 3, true, 11), CtrReaderOptions(o));
  const std::vector<int64_t> got = AllIds(epochs, o.ctr_fields);
  EXPECT_EQ(epochs.epochs_begun(), 3);
  std::vector<int64_t> want;
  for (int64_t e = 0; e < 3; ++e) {
    for (int f : ps::WorkOrder(4, true, 11, e)) want.insert(want.end(), per_file[f].begin(), per_file[f].end());
  }
  EXPECT_TRUE(got == want);
  EXPECT_NE(ps::WorkOrder(4, true, 11, 0), ps::WorkOrder(4, true, 11, 1));

  o.num_epochs = 3;  // 1200 examples: 18 whole batches of 64
  o.train_steps = kUntilTheDataEnds;
  std::string said;
  auto summary = RunCtrSingleProcess(o, [&](const std::string& line) { said += line + "\n"; });
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->global_step, 18);
  EXPECT_NE(said.find("training ends at step 18 (no --train_steps)"), std::string::npos) << said;
  EXPECT_NE(said.find("1200 examples read in 3 epoch(s)"), std::string::npos) << said;
}

// Sync: worker w of N takes part w of global batch s of N·B: the N parts make one process's batch
// of N·B, in order, also after a jump (a resume) and a step back (a rollback).
TEST_F(CtrFilesTest, SyncPartsMakeOneProcesssBatch) {
  WriteFiles("data", 2, 333, true);
  TrainOptions big = Options("", 1);
  big.train_files = Path("data") + "/train-*";
  TrainOptions small = big;
  big.batch_size = 96;
  small.batch_size = 32;
  auto one = CtrFileBatches::Open(big);
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<std::unique_ptr<CtrFileBatches>> parts;
  for (int w = 0; w < 3; ++w) {
    auto part = CtrFileBatches::Open(small, w, 3);
    ASSERT_TRUE(part.ok()) << part.status();
    parts.push_back(*std::move(part));
  }
  const int fields = big.ctr_fields;
  std::vector<int64_t> ids(96 * fields), part_ids(32 * fields);
  std::vector<float> dense(96 * kDense), labels(96), part_dense(32 * kDense), part_labels(32);
  for (int64_t step : {0, 1, 4, 2, 5}) {
    SCOPED_TRACE(step);
    ASSERT_TRUE((*one)->Fill(step, ids.data(), dense.data(), labels.data()).ok());
    for (int w = 0; w < 3; ++w) {
      ASSERT_TRUE(parts[w]->Fill(step, part_ids.data(), part_dense.data(), part_labels.data()).ok());
      EXPECT_TRUE(std::equal(part_ids.begin(), part_ids.end(), ids.begin() + w * 32 * fields));
      EXPECT_TRUE(std::equal(part_labels.begin(), part_labels.end(), labels.begin() + w * 32));
      EXPECT_TRUE(std::equal(part_dense.begin(), part_dense.end(), dense.begin() + w * 32 * kDense));
    }
  }
  // 666 examples: 6 whole global batches of 96; batch 6 is not whole, for every part alike.
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(parts[w]->Fill(6, part_ids.data(), part_dense.data(), part_labels.data()).code(),
              absl::StatusCode::kOutOfRange);
  }
}

}  // namespace
}  // namespace psflow::train
