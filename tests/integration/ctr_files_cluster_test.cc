// `psflow train --model=ctr --train_files=...` on a cluster, real processes over loopback gRPC, on
// files `psflow data ctr-files` wrote (docs/data-files.md#the-work-queue):
//   - async, one worker slowed 3x (SIGSTOP/SIGCONT from here, 2/3 of the time stopped) reads well
//     under half of the work queue's slices, and every task exits 0 at the end of the data with
//     the job's examples and epochs in the summary;
//   - a job stopped by --train_steps resumes from its checkpoint where the queue stood, and a worker
//     stopped by steps inside a slice gives it back (the chief does not wait for it);
//   - a worker killed while it reads and started again: its slice goes back to the queue;
//   - sync reads the fixed order and ends at the step the files give;
//   - files of 5 integers and 7 categoricals (--ctr_dense, --ctr_fields) train a hybrid job, which
//     names itself hybrid, and --eval_every_steps evaluates beside training: each figure equals
//     `psflow eval` of that step's checkpoint.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "test_util.h"

namespace psflow::testing {
namespace {

constexpr int kFiles = 4, kPerFile = 6000, kExamples = kFiles * kPerFile;

// The generator's files for --ctr_fields=4 --seed=2, gzip, under DIR/data.
std::string WriteFiles(const std::string& dir, int per_file = kPerFile) {
  auto r = RunProcess(Psflow({"data", "ctr-files", "--out=" + dir + "/data", absl::StrCat("--files=", kFiles),
                              absl::StrCat("--examples_per_file=", per_file), "--seed=2", "--ctr_fields=4",
                              "--ctr_test_examples=2048", "--batch_size=128", "--gzip"}),
                      300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir + "/data";
}

struct Cluster {
  std::string ps, workers;
};
Cluster Addresses(int workers) {
  const std::vector<int> ports = FreePorts(1 + workers);
  Cluster c{absl::StrCat("127.0.0.1:", ports[0]), ""};
  for (int w = 0; w < workers; ++w) absl::StrAppend(&c.workers, w ? "," : "", "127.0.0.1:", ports[1 + w]);
  return c;
}

// Every job here: the small ctr model over DATA's training files.
std::vector<std::string> CtrJob(const std::string& data) {
  return {"--model=ctr",
          "--ctr_fields=4",
          "--ctr_dim=4",
          "--batch_size=128",
          "--seed=2",
          "--train_files=" + data + "/train-*",
          "--ctr_test_examples=2048"};
}

std::vector<std::string> Task(const Cluster& c, const std::string& job, int index, const std::string& data,
                              std::vector<std::string> more, int log_every = 50) {
  std::vector<std::string> args = {"train", "--job_name=" + job, absl::StrCat("--task_index=", index),
                                   "--ps_hosts=" + c.ps, "--worker_hosts=" + c.workers};
  for (std::string& flag : CtrJob(data)) args.push_back(std::move(flag));
  for (std::string flag : {"--test_files=" + data + "/test.gz", absl::StrCat("--log_every=", log_every),
                           std::string("--file_slices=10")}) {
    args.push_back(std::move(flag));
  }
  args.insert(args.end(), more.begin(), more.end());
  return Psflow(args);
}

// psflow local, 1 ps + 2 workers, async unless `more` says otherwise: the ctr job over DATA's
// training files, its checkpoints under DIR/ckpt and its summary in DIR/m.json.
std::vector<std::string> LocalJob(const std::string& dir, const std::string& data, std::vector<std::string> more) {
  std::vector<std::string> job = {"local", "--ps=1", "--workers=2"};
  for (std::string& flag : CtrJob(data)) job.push_back(std::move(flag));
  for (std::string flag :
       {std::string("--log_every=1000"), "--checkpoint_dir=" + dir + "/ckpt", "--metrics_json=" + dir + "/m.json"}) {
    job.push_back(std::move(flag));
  }
  job.insert(job.end(), more.begin(), more.end());
  return job;
}

// "worker W: training files: N examples read in K slices": K.
int SlicesRead(const std::string& output) {
  std::smatch m;
  static const std::regex re("training files: [0-9]+ examples read in ([0-9]+) slices");
  return std::regex_search(output, m, re) ? std::stoi(m[1]) : -1;
}

TEST(CtrFilesClusterTest, AsyncSlowWorkerReadsLessAndTheEndOfTheDataEndsTheJob) {
  const std::string dir = TempDir("ctr_files_slow");
  const std::string data = WriteFiles(dir);
  const Cluster c = Addresses(2);
  Process ps(Task(c, "ps", 0, data, {}));
  Process chief(Task(c, "worker", 0, data, {"--metrics_json=" + dir + "/m.json", "--checkpoint_dir=" + dir + "/ckpt"}));
  Process slow(Task(c, "worker", 1, data, {}));
  // Worker 1 runs a third of the time: stopped 20 ms of every 30.
  std::atomic<bool> done{false};
  std::thread throttle([&] {
    while (!done.load()) {
      kill(slow.pid(), SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      kill(slow.pid(), SIGCONT);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  ProcessResult chief_r = chief.Wait(600);
  ProcessResult slow_r = slow.Wait(600);
  done = true;
  throttle.join();
  kill(slow.pid(), SIGCONT);
  ProcessResult ps_r = ps.Wait(120);
  ASSERT_EQ(chief_r.exit_code, 0) << chief_r.output;
  ASSERT_EQ(slow_r.exit_code, 0) << slow_r.output;
  ASSERT_EQ(ps_r.exit_code, 0) << ps_r.output;
  const int fast = SlicesRead(chief_r.output), slowed = SlicesRead(slow_r.output);
  std::printf("work queue, worker 1 slowed 3x: worker 0 read %d slices, worker 1 %d\n", fast, slowed);
  ASSERT_GT(fast, 0) << chief_r.output;
  ASSERT_GE(slowed, 0) << slow_r.output;
  EXPECT_EQ(fast + slowed, 20);  // --file_slices=10 x 2 workers, one epoch, none handed twice
  EXPECT_LT(slowed, 7) << "the slowed worker read " << slowed << " of 20 slices";
  const nlohmann::json m = ReadJson(dir + "/m.json");
  ASSERT_TRUE(m.contains("train_file_examples")) << m.dump();
  EXPECT_EQ(m["train_file_examples"], kExamples) << m.dump();
  EXPECT_EQ(m["train_file_epochs"], 1) << m.dump();
  EXPECT_EQ(m["train_file_bad_lines"], 0) << m.dump();
  // Each worker trains whole batches only: at most a batch left over per worker.
  const int64_t step = m["global_step"];
  EXPECT_LE(step * 128, kExamples);
  EXPECT_GE(step * 128, kExamples - 2 * 128);
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(dir, "/ckpt/model.ckpt-", step, ".safetensors")));
}

// Async, --train_steps short of the files: worker 1 takes a slice (the chief stopped meanwhile at
// its first slice), steps and is stopped (SIGSTOP);
// the chief reads every other slice and waits at the queue's end for the one worker 1 holds; worker
// 1, let go, trains until the job's last step, in the middle of its slice. It gives the slice back
// as it stops, so the chief's wait ends then, not after --worker_timeout_secs ("ending without
// them"), and the queue has the slice back in line for a resumed job.
TEST(CtrFilesClusterTest, AsyncEndByStepsGivesTheHeldSliceBack) {
  const std::string dir = TempDir("ctr_files_end_by_steps");
  // One slice per file (187.5 batches each): worker 1 holds one, the chief reads the other three
  // (562 batches) and waits with the global step at 562 + worker 1's steps before it was stopped;
  // step 700 then falls inside worker 1's slice. Worker 1 runs ~2000 steps a second, so it may
  // step well past its first line before the SIGSTOP lands (under load, dozens of steps): it may
  // take up to 135 of its 187 before the chief's wait would end past step 700 (a flake seen with
  // 47-batch slices and step 170, where 28 were enough to break it).
  const std::string data = WriteFiles(dir, 4 * kPerFile);
  const Cluster c = Addresses(2);
  const std::vector<std::string> more = {"--train_steps=700", "--worker_timeout_secs=60", "--file_slices=2"};
  Process ps(Task(c, "ps", 0, data, more, 1));
  Process chief(Task(c, "worker", 0, data, more, 1));
  Process held(Task(c, "worker", 1, data, more, 1));
  const auto wait_for = [](Process& p, const std::string& text) {
    for (int i = 0; i < 30000 && p.OutputSoFar().find(text) == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  // The chief is held at its first step (it holds its first slice) until worker 1 has a slice of
  // its own: otherwise a chief that starts first can read every slice before worker 1 asks.
  wait_for(chief, " loss ");
  kill(chief.pid(), SIGSTOP);
  wait_for(held, " loss ");
  kill(held.pid(), SIGSTOP);
  kill(chief.pid(), SIGCONT);
  wait_for(chief, "the chief's data ended; waiting for 1 slice(s)");
  kill(held.pid(), SIGCONT);
  ProcessResult chief_r = chief.Wait(600), held_r = held.Wait(600), ps_r = ps.Wait(120);
  ASSERT_EQ(chief_r.exit_code, 0) << chief_r.output;
  ASSERT_EQ(held_r.exit_code, 0) << held_r.output;
  ASSERT_EQ(ps_r.exit_code, 0) << ps_r.output;
  EXPECT_THAT(chief_r.output, ::testing::HasSubstr("the chief's data ended; waiting for 1 slice(s)"));
  EXPECT_THAT(chief_r.output, ::testing::Not(::testing::HasSubstr("ending without them"))) << chief_r.output;
  EXPECT_THAT(held_r.output, ::testing::Not(::testing::HasSubstr("work queue is at its end"))) << held_r.output;
  std::smatch given;
  ASSERT_TRUE(std::regex_search(chief_r.output, given, std::regex("([0-9]+) given back and handed again")))
      << chief_r.output;
  EXPECT_EQ(std::stoi(given[1]), 1) << chief_r.output;
}

// psflow local, async: a job stopped by --train_steps and run again continues where the queue stood.
TEST(CtrFilesClusterTest, AsyncResumeContinuesTheQueue) {
  const std::string dir = TempDir("ctr_files_resume");
  const std::string data = WriteFiles(dir);
  const std::vector<std::string> job = LocalJob(dir, data, {"--num_epochs=2", "--shuffle_files"});
  std::vector<std::string> first = job;
  first.push_back("--train_steps=150");
  auto r1 = RunProcess(Psflow(first), 600);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_EQ(ReadJson(dir + "/m.json")["global_step"], 150);
  auto r2 = RunProcess(Psflow(job), 600);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_NE(r2.output.find("chief: restored the work queue at "), std::string::npos) << r2.output;
  const nlohmann::json m = ReadJson(dir + "/m.json");
  // Two epochs in all: the second run read what the first had not, plus the slices held when the
  // first run's final checkpoint was taken (at-least-once), at most one slice per worker.
  const double examples = m["train_file_examples"];
  EXPECT_GE(examples, 2 * kExamples) << m.dump();
  EXPECT_LE(examples, 2 * kExamples + 2 * (kExamples / 20 + kPerFile)) << m.dump();
  EXPECT_EQ(m["train_file_epochs"], 2);
  EXPECT_GE(m["global_step"].get<int64_t>() * 128, 2 * kExamples - 4 * 128) << m.dump();
}

// A worker killed while it reads, and started again: its slice goes back to the queue.
TEST(CtrFilesClusterTest, AKilledWorkersSliceGoesBackToTheQueue) {
  const std::string dir = TempDir("ctr_files_kill");
  const std::string data = WriteFiles(dir);
  const Cluster c = Addresses(2);
  // Every task logs every step. The chief is stopped once it has stepped (it configured the queue
  // with its first ask) until the killed worker 1 has been started again and has stepped: the whole
  // job takes about a second, and on a loaded machine the chief could otherwise read every slice and
  // end the job before worker 1 first steps, or before the new worker 1 connects.
  Process ps(Task(c, "ps", 0, data, {}, 1));
  Process chief(Task(c, "worker", 0, data, {"--metrics_json=" + dir + "/m.json"}, 1));
  const auto wait_for_a_step = [](Process& p) {
    for (int i = 0; i < 3000 && p.OutputSoFar().find(" loss ") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  wait_for_a_step(chief);
  kill(chief.pid(), SIGSTOP);
  {
    Process victim(Task(c, "worker", 1, data, {}, 1));
    wait_for_a_step(victim);  // worker 1 holds a slice
    kill(victim.pid(), SIGKILL);
    victim.Wait(30);
  }
  Process again(Task(c, "worker", 1, data, {}, 1));
  wait_for_a_step(again);
  kill(chief.pid(), SIGCONT);
  ProcessResult chief_r = chief.Wait(600), again_r = again.Wait(600), ps_r = ps.Wait(120);
  ASSERT_EQ(chief_r.exit_code, 0) << chief_r.output;
  ASSERT_EQ(again_r.exit_code, 0) << again_r.output;
  ASSERT_EQ(ps_r.exit_code, 0) << ps_r.output;
  std::smatch given;
  ASSERT_TRUE(std::regex_search(chief_r.output, given, std::regex("([0-9]+) given back and handed again")))
      << chief_r.output;
  EXPECT_EQ(std::stoi(given[1]), 1) << chief_r.output;
  const nlohmann::json m = ReadJson(dir + "/m.json");
  // Every example read at least once: the slices the killed worker finished were reported when it
  // asked for the next, and the one it held was read again whole by another.
  EXPECT_GE(m["train_file_examples"].get<double>(), kExamples) << m.dump();
}

// Sync: the fixed order, worker w's part of each global batch; the end of the files ends the job
// at the step they give (24000 examples, global batches of 2 x 128: 93 whole ones).
TEST(CtrFilesClusterTest, SyncEndsAtTheFilesStep) {
  const std::string dir = TempDir("ctr_files_sync");
  const std::string data = WriteFiles(dir);
  auto r = RunProcess(Psflow(LocalJob(dir, data, {"--sync_replicas", "--test_files=" + data + "/test.gz"})), 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json m = ReadJson(dir + "/m.json");
  EXPECT_EQ(m["global_step"], kExamples / 256);
  EXPECT_EQ(m["train_file_examples"], kExamples);
  EXPECT_EQ(m["train_file_epochs"], 1);
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(dir, "/ckpt/model.ckpt-", kExamples / 256, ".safetensors")));
  EXPECT_NE(r.output.find("the training files end after"), std::string::npos) << r.output;
}

// A bad line fails the job with one line naming file and line; the job's last checkpoint holds the
// queue's state. With --max_bad_lines=1 the line is skipped and counted.
TEST(CtrFilesClusterTest, ABadLineFailsTheJobAndLeavesTheCheckpointAndQueue) {
  const std::string dir = TempDir("ctr_files_bad");
  const std::string data = WriteFiles(dir);
  std::ofstream(data + "/train-00009") << "1\t2\n";  // last in the files' order: a bad line
  std::vector<std::string> job = LocalJob(dir, data, {"--save_checkpoint_steps=20"});
  auto failed = RunProcess(Psflow(job), 600);
  EXPECT_NE(failed.exit_code, 0) << failed.output;
  EXPECT_NE(failed.output.find("data file " + data + "/train-00009 line 1: 2 tab-separated fields; expected 18"),
            std::string::npos)
      << failed.output;
  std::string newest;
  int64_t newest_step = -1;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt")) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, std::regex("model\\.ckpt-([0-9]+)\\.safetensors")) &&
        std::stoll(m[1]) > newest_step) {
      newest_step = std::stoll(m[1]);
      newest = entry.path().string();
    }
  }
  ASSERT_GT(newest_step, 0) << failed.output;
  // The file's header (8 bytes of length, then JSON) holds the metadata.
  std::ifstream in(newest, std::ios::binary);
  uint64_t header_bytes = 0;
  in.read(reinterpret_cast<char*>(&header_bytes), 8);
  std::string header(header_bytes, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_bytes));
  const nlohmann::json metadata = nlohmann::json::parse(header)["__metadata__"];
  ASSERT_TRUE(metadata.contains("work_queue")) << newest;
  const nlohmann::json queue = nlohmann::json::parse(metadata["work_queue"].get<std::string>());
  EXPECT_GT(queue["handed"].get<int64_t>(), 0) << queue.dump();
  EXPECT_EQ(queue["files"].size(), 5u) << queue.dump();

  job.push_back("--max_bad_lines=1");  // the same job goes on from its checkpoint, skipping the line
  auto skipped = RunProcess(Psflow(job), 600);
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_EQ(ReadJson(dir + "/m.json")["train_file_bad_lines"], 1);
}

// Files of another layout train on a cluster (hybrid: sync dense, async tables); the chief's
// --eval_every_steps evaluation runs beside training on the checkpoint of each step S, and its
// figures are `psflow eval`'s on that checkpoint.
TEST(CtrFilesClusterTest, OtherFieldCountsHybridAndEvaluationBesideTraining) {
  const std::string dir = TempDir("ctr_files_beside");
  auto wrote = RunProcess(
      Psflow({"data", "ctr-files", "--out=" + dir + "/data", "--files=2", "--examples_per_file=4000", "--seed=2",
              "--ctr_fields=7", "--ctr_dense=5", "--ctr_test_examples=1024", "--batch_size=128"}),
      300);
  ASSERT_EQ(wrote.exit_code, 0) << wrote.output;
  const std::vector<std::string> layout = {"--model=ctr",
                                           "--ctr_fields=7",
                                           "--ctr_dense=5",
                                           "--ctr_dim=4",
                                           "--seed=2",
                                           "--test_files=" + dir + "/data/test",
                                           "--ctr_test_examples=1024"};
  std::vector<std::string> job = {"local",
                                  "--ps=1",
                                  "--workers=2",
                                  "--batch_size=64",
                                  "--sync_replicas",
                                  "--table_sync=async",
                                  "--train_files=" + dir + "/data/train-*",
                                  "--train_steps=30",
                                  "--eval_every_steps=10",
                                  "--log_every=10",
                                  "--checkpoint_dir=" + dir + "/ckpt",
                                  "--metrics_json=" + dir + "/m.json"};
  job.insert(job.end(), layout.begin(), layout.end());
  auto r = RunProcess(Psflow(job), 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json m = ReadJson(dir + "/m.json");
  EXPECT_EQ(m["mode"], "hybrid") << m.dump();
  EXPECT_EQ(m["global_step"], 30) << m.dump();
  EXPECT_NE(r.output.find("hybrid: step 30/30 loss"), std::string::npos) << r.output;
  // "eval at global step S: test_log_loss=A test_auc=B ... (Ts beside training, PATH)"; a checkpoint
  // waiting while the evaluation before it runs may be replaced by a newer one (heavy load).
  static const std::regex line(
      "eval at global step ([0-9]+): test_log_loss=([0-9.e-]+) test_auc=([0-9.e-]+)[^\n]*"
      "beside training, ([^;)]+)");
  int evaluated = 0;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it) {
    const int64_t step = std::stoll((*it)[1]);
    const std::string path = (*it)[4];
    SCOPED_TRACE(path);
    EXPECT_EQ(step % 10, 0);
    EXPECT_EQ(path, absl::StrCat(dir, "/ckpt/model.ckpt-", step, ".safetensors"));
    // psflow eval of that file alone (full saves), with the job's layout and test set.
    const std::string alone = absl::StrCat(dir, "/alone-", step);
    std::filesystem::create_directories(alone);
    std::filesystem::copy_file(path, alone + "/" + std::filesystem::path(path).filename().string());
    std::vector<std::string> eval = {"eval", "--checkpoint_dir=" + alone};
    eval.insert(eval.end(), layout.begin(), layout.end());
    auto e = RunProcess(Psflow(eval), 300);
    ASSERT_EQ(e.exit_code, 0) << e.output;
    std::smatch got;
    ASSERT_TRUE(std::regex_search(e.output, got,
                                  std::regex(absl::StrCat("global_step=", step,
                                                          " test_log_loss=([0-9.]+) \\(bayes nan\\) "
                                                          "test_auc=([0-9.]+)"))))
        << e.output;
    // The same doubles, printed to 6 significant digits there and 5 decimals here.
    EXPECT_NEAR(std::stod((*it)[2]), std::stod(got[1]), 6e-6) << e.output;
    EXPECT_NEAR(std::stod((*it)[3]), std::stod(got[2]), 6e-6) << e.output;
    ++evaluated;
  }
  EXPECT_GE(evaluated, 1) << r.output;
  std::printf("evaluations beside training reported: %d of 3\n", evaluated);
}

}  // namespace
}  // namespace psflow::testing
