// Real clusters: ps and worker processes talking gRPC over 127.0.0.1, started through
// `psflow local`, by hand with seed-style flags, and with TF_CONFIG.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "test_util.h"

namespace psflow::testing {
namespace {

TEST(ClusterTest, AsyncMlpOnePsTwoWorkers) {
  const std::string dir = TempDir("async_mlp");
  auto r = RunProcess(Psflow({"local", "--ps=1", "--workers=2", "--model=mlp", "--train_steps=1000",
                              "--data_dir=" + MnistDir(), "--metrics_json=" + dir + "/m.json", "--log_every=200"}),
                      300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all tasks exited 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[ps0] "), std::string::npos);
  EXPECT_NE(r.output.find("[worker1] "), std::string::npos);
  // The chief lists where every variable lives.
  EXPECT_NE(r.output.find("hidden/weights"), std::string::npos) << r.output;
  nlohmann::json m = ReadJson(dir + "/m.json");
  EXPECT_EQ(m["mode"], "async");
  EXPECT_EQ(m["workers"], 2);
  EXPECT_GE(m["global_step"].get<int64_t>(), 1000);
  EXPECT_GT(m["test_accuracy"].get<double>(), 0.93);
  ASSERT_EQ(m["ps_traffic"].size(), 1u);
  EXPECT_EQ(m["ps_traffic"][0]["num_params"], 79510);
  // Every step pulls and pushes the whole model: at least 4 bytes per parameter each way.
  EXPECT_GT(m["ps_traffic"][0]["bytes_in"].get<int64_t>(), int64_t(1000) * 79510 * 4);
  EXPECT_GT(m["ps_traffic"][0]["bytes_out"].get<int64_t>(), int64_t(1000) * 79510 * 4);
  // The ps's own final line shows the chief's table's numbers (regression: issue 11.6, they
  // differed by the Stats answer and the Shutdown), without the calls after it (issue 20.4).
  EXPECT_NE(r.output.find(absl::StrCat("[ps0] ps task 0 done at global step ", m["global_step"].get<int64_t>(),
                                       ": 79510 params, ", m["ps_traffic"][0]["bytes_in"].get<int64_t>(), " bytes in, ",
                                       m["ps_traffic"][0]["bytes_out"].get<int64_t>(), " bytes out\n")),
            std::string::npos)
      << r.output;
  // Every worker says how many steps it took, the chief too (issue 20.4).
  EXPECT_NE(r.output.find("[worker0] worker 0: done after "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[worker1] worker 1: done after "), std::string::npos) << r.output;
}

TEST(ClusterTest, SyncTwoWorkersEqualsOneProcessWithTwiceTheBatch) {
  // docs/design.md#sync-mode: sync with N workers of batch B sees exactly the examples of one process with
  // batch N*B, and applies the mean gradient: the parameters must agree.
  const std::string sync_dir = TempDir("sync_eq_dist"), single_dir = TempDir("sync_eq_single");
  auto dist =
      RunProcess(Psflow({"local", "--ps=2", "--workers=2", "--sync_replicas", "--model=mlp", "--partitioner=fixed:2",
                         "--train_steps=50", "--batch_size=50", "--seed=3", "--data_dir=" + MnistDir(),
                         "--checkpoint_dir=" + sync_dir, "--metrics_json=" + sync_dir + "/m.json"}),
                 300);
  ASSERT_EQ(dist.exit_code, 0) << dist.output;
  auto single = RunProcess(
      Psflow({"train", "--model=mlp", "--train_steps=50", "--batch_size=100", "--seed=3", "--data_dir=" + MnistDir(),
              "--checkpoint_dir=" + single_dir, "--metrics_json=" + single_dir + "/m.json"}),
      300);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  EXPECT_LT(MaxRelativeDifference(ReadFinalVariables(sync_dir), ReadFinalVariables(single_dir)), 1e-4);
  nlohmann::json a = ReadJson(sync_dir + "/m.json"), b = ReadJson(single_dir + "/m.json");
  EXPECT_EQ(a["mode"], "sync");
  EXPECT_EQ(a["global_step"], 50);
  EXPECT_NEAR(a["validation_cross_entropy"].get<double>(), b["validation_cross_entropy"].get<double>(),
              1e-4 * b["validation_cross_entropy"].get<double>());
}

TEST(ClusterTest, SyncMlpOnePsTwoWorkersWritesTensorBoardEvents) {
  const std::string dir = TempDir("sync_mlp");
  auto r = RunProcess(Psflow({"local", "--ps=1", "--workers=2", "--sync_replicas", "--model=mlp", "--train_steps=300",
                              "--save_summaries_steps=50", "--data_dir=" + MnistDir(), "--logdir=" + dir + "/logs",
                              "--metrics_json=" + dir + "/m.json"}),
                      300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json m = ReadJson(dir + "/m.json");
  EXPECT_EQ(m["mode"], "sync");
  EXPECT_EQ(m["global_step"], 300);
  EXPECT_GT(m["test_accuracy"].get<double>(), 0.9);
  // The chief's curves at the top of the logdir, the ps task's traffic in ps_0/.
  int chief_files = 0, ps_files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir + "/logs")) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) != 0) continue;
    (e.path().parent_path().filename() == "ps_0" ? ps_files : chief_files)++;
  }
  EXPECT_EQ(chief_files, 1);
  EXPECT_EQ(ps_files, 1);
}

TEST(ClusterTest, LocalSaysWhichTaskFailedAndStopsTheRest) {
  auto r = RunProcess(Psflow({"local", "--ps=1", "--workers=2", "--model=mlp", "--data_dir=/nonexistent/mnist"}), 120);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("exited with status 1; stopping the other tasks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/mnist"), std::string::npos) << r.output;
}

TEST(ClusterTest, CnnOnTwoPsWithFixedPartitioner) {
  const std::string dir = TempDir("cnn_2ps");
  auto r = RunProcess(
      Psflow({"local", "--ps=2", "--workers=2", "--model=cnn", "--partitioner=fixed:2", "--placement=greedy",
              "--train_steps=6", "--batch_size=16", "--data_dir=" + MnistDir(), "--metrics_json=" + dir + "/m.json"}),
      300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fc1/weights/part_1"), std::string::npos) << r.output;
  // Both ps tasks log the real final step, also the one that does not hold the global step
  // (it said "step 0" before the chief's Shutdown carried the step).
  for (const char* line : {"ps task 0: training finished at step 6 ", "ps task 1: training finished at step 6 ",
                           "ps task 0 done at global step 6:", "ps task 1 done at global step 6:"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << " missing from:\n" << r.output;
  }
  nlohmann::json m = ReadJson(dir + "/m.json");
  ASSERT_EQ(m["ps_traffic"].size(), 2u);
  const int64_t p0 = m["ps_traffic"][0]["num_params"], p1 = m["ps_traffic"][1]["num_params"];
  EXPECT_EQ(p0 + p1, 3274634);
  EXPECT_LE(double(std::max(p0, p1)) / ((p0 + p1) / 2.0), 1.02);
}

TEST(ClusterTest, TasksStartedByHandWithTfConfig) {
  const std::vector<int> ports = FreePorts(3);
  const std::string chief = absl::StrCat("127.0.0.1:", ports[0]), worker = absl::StrCat("127.0.0.1:", ports[1]),
                    ps = absl::StrCat("127.0.0.1:", ports[2]);
  auto tf_config = [&](const std::string& type, int index) {
    return absl::StrCat(R"(TF_CONFIG={"cluster": {"chief": [")", chief, R"("], "worker": [")", worker,
                        R"("], "ps": [")", ps, R"("]}, "task": {"type": ")", type, R"(", "index": )", index, "}}");
  };
  const std::vector<std::string> flags = {"train", "--model=softmax", "--train_steps=200", "--data_dir=" + MnistDir()};
  Process ps_task(Psflow(flags), {tf_config("ps", 0)});
  Process worker_task(Psflow(flags), {tf_config("worker", 0)});
  Process chief_task(Psflow(flags), {tf_config("chief", 0)});
  ProcessResult c = chief_task.Wait(300), w = worker_task.Wait(60), p = ps_task.Wait(60);
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(w.exit_code, 0) << w.output;
  EXPECT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(c.output.find("test_accuracy"), std::string::npos) << c.output;
}

TEST(ClusterTest, MismatchedClusterIsRefusedByName) {
  const std::vector<int> ports = FreePorts(3);
  const std::string ps = absl::StrCat("127.0.0.1:", ports[0]);
  const std::string w0 = absl::StrCat("127.0.0.1:", ports[1]), w1 = absl::StrCat("127.0.0.1:", ports[2]);
  Process ps_task(Psflow({"train", "--job_name=ps", "--task_index=0", "--ps_hosts=" + ps, "--worker_hosts=" + w0}));
  // This worker believes in a cluster of two workers; the ps was started with one.
  auto r = RunProcess(Psflow({"train", "--job_name=worker", "--task_index=0", "--ps_hosts=" + ps,
                              "--worker_hosts=" + w0 + "," + w1, "--model=softmax", "--data_dir=" + MnistDir()}),
                      120);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cluster"), std::string::npos) << r.output;
}

// docs/design.md#failure-model: a ps task that does not come back ends the job everywhere, bounded, with
// every task naming it — no process waits for ever.
TEST(ClusterTest, APsThatNeverComesBackEndsEveryTaskNamingIt) {
  const std::vector<int> ports = FreePorts(4);
  const std::string ps_hosts = absl::StrCat("127.0.0.1:", ports[0], ",127.0.0.1:", ports[1]);
  const std::string worker_hosts = absl::StrCat("127.0.0.1:", ports[2], ",127.0.0.1:", ports[3]);
  auto task = [&](const std::string& job, int index) {
    return Psflow({"train", "--job_name=" + job, absl::StrCat("--task_index=", index), "--ps_hosts=" + ps_hosts,
                   "--worker_hosts=" + worker_hosts, "--model=softmax", "--train_steps=100000000",
                   "--data_dir=" + MnistDir(), "--ps_timeout_secs=3", "--init_timeout_secs=60"});
  };
  Process ps0(task("ps", 0)), ps1(task("ps", 1)), chief(task("worker", 0)), worker(task("worker", 1));
  std::this_thread::sleep_for(std::chrono::seconds(3));  // connected and training (or about to)
  ASSERT_EQ(kill(ps1.pid(), SIGKILL), 0);
  for (Process* p : {&chief, &worker, &ps0}) {
    const ProcessResult r = p->Wait(60);
    EXPECT_FALSE(r.timed_out) << r.output;
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_LT(r.exit_code, 128) << r.output;  // an orderly exit, not a crash
    EXPECT_NE(r.output.find("ps task 1 (127.0.0.1:" + std::to_string(ports[1]) + ")"), std::string::npos) << r.output;
  }
}

TEST(ClusterTest, APsTaskWithoutAChiefGivesUpNamingIt) {
  const std::vector<int> ports = FreePorts(2);
  auto r =
      RunProcess(Psflow({"train", "--job_name=ps", "--task_index=0", absl::StrCat("--ps_hosts=127.0.0.1:", ports[0]),
                         absl::StrCat("--worker_hosts=127.0.0.1:", ports[1]), "--init_timeout_secs=1"}),
                 30);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the chief (worker 0) did not initialize the variables within 1 s"), std::string::npos)
      << r.output;
}

TEST(ClusterTest, BadClusterFlagsAreOneLineErrors) {
  for (const auto& [flags, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--job_name=worker", "--task_index=5", "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2"},
            "task_index"},
           {{"--job_name=worker", "--ps_hosts=127.0.0.1", "--worker_hosts=127.0.0.1:2"}, "127.0.0.1"},
           {{"--job_name=ps", "--ps_hosts=127.0.0.1:3,127.0.0.1:3", "--worker_hosts=127.0.0.1:2"}, "appears twice"},
           {{"--job_name=chef", "--ps_hosts=127.0.0.1:3", "--worker_hosts=127.0.0.1:2"}, "chef"}}) {
    std::vector<std::string> args = {"train"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = RunProcess(Psflow(args), 30);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_LT(r.exit_code, 128) << r.output;
    EXPECT_EQ(CountLines(r.output), 1) << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace psflow::testing
