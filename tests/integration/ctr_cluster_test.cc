// `psflow train --model=ctr` on a cluster, real processes over loopback gRPC:
// 2 ps + 2 workers async learn the generator's interactions (test AUC clearly above the
// best any dense-only model can reach, computed here from the teacher) and the summary reports
// the figures beside Bayes; a worker's peak RSS (VmHWM from /proc, polled while it runs) is the
// same with a 1e5-row and a 1e7-row fixed table, since it holds only its batch's rows.
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "psflow/data/ctr.h"
#include "psflow/data/ctr_metrics.h"
#include "test_util.h"

namespace psflow::testing {
namespace {

// The best test AUC of a model that sees the dense features only: ranking by the teacher's w*·x
// (the click probability given x alone is increasing in it; the ids are independent of x).
double DenseOnlyBayesAuc(uint64_t seed, int fields, int64_t n) {
  data::CtrConfig config;
  config.seed = seed;
  config.num_fields = fields;
  auto generator = data::CtrGenerator::Create(config);
  EXPECT_TRUE(generator.ok()) << generator.status();
  auto test = generator->TestSet(n);
  EXPECT_TRUE(test.ok()) << test.status();
  std::vector<double> score(test->num_examples);
  const auto w = generator->dense_weights();
  for (int64_t i = 0; i < test->num_examples; ++i) {
    for (int d = 0; d < test->num_dense; ++d) score[i] += w[d] * test->dense[i * test->num_dense + d];
  }
  return *data::Auc(test->labels, score);
}

TEST(CtrClusterTest, AsyncTwoPsTwoWorkersLearnTheInteractions) {
  const std::string dir = TempDir("ctr_async");
  auto r = RunProcess(
      Psflow({"local", "--ps=2", "--workers=2", "--model=ctr", "--ctr_fields=6", "--ctr_dim=8", "--batch_size=256",
              "--train_steps=1500", "--seed=5", "--sparse_learning_rate=5", "--learning_rate=0.003",
              "--ctr_test_examples=16384", "--log_every=500", "--metrics_json=" + dir + "/m.json"}),
      600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json m = ReadJson(dir + "/m.json");
  ASSERT_TRUE(m.contains("ctr")) << m.dump();
  const double auc = m["ctr"]["test_auc"], bayes_auc = m["ctr"]["bayes_auc"];
  const double dense_only = DenseOnlyBayesAuc(5, 6, 16384);
  std::printf("ctr 2 ps + 2 workers async: test AUC %.4f (Bayes %.4f, dense-only Bayes %.4f), %.0f examples/s\n", auc,
              bayes_auc, dense_only, m.value("examples_per_sec", 0.0));
  EXPECT_EQ(m["mode"], "async");
  EXPECT_EQ(m["global_step"], 1500);
  EXPECT_GT(auc, dense_only + 0.03);
  EXPECT_LT(auc, bayes_auc + 0.005);
  EXPECT_GT(m["ctr"]["table_rows"].get<int64_t>(), 0);
}

// The largest VmHWM (kB) seen in /proc/PID/status while the process runs.
int64_t PollPeakKb(const Process& p, const std::function<bool()>& running) {
  int64_t peak = 0;
  while (running()) {
    std::ifstream in(absl::StrCat("/proc/", p.pid(), "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmHWM:", 0) == 0) peak = std::max<int64_t>(peak, std::stoll(line.substr(6)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return peak;
}

// One job on 2 ps + 2 workers with fixed tables of `vocab` rows; returns worker 1's peak RSS (kB).
int64_t WorkerPeakKb(int64_t vocab) {
  const std::vector<int> ports = FreePorts(4);
  const std::string ps = absl::StrCat("127.0.0.1:", ports[0], ",127.0.0.1:", ports[1]);
  const std::string workers = absl::StrCat("127.0.0.1:", ports[2], ",127.0.0.1:", ports[3]);
  auto task = [&](const std::string& job, int index) {
    return Psflow({"train", "--job_name=" + job, absl::StrCat("--task_index=", index), "--ps_hosts=" + ps,
                   "--worker_hosts=" + workers, "--model=ctr", "--ctr_fields=2", "--ctr_dim=4",
                   absl::StrCat("--ctr_vocab=", vocab), "--sparse_optimizer=sgd", "--batch_size=512",
                   "--train_steps=300", "--ctr_test_examples=4096", "--log_every=1000"});
  };
  Process ps0(task("ps", 0)), ps1(task("ps", 1)), chief(task("worker", 0)), worker(task("worker", 1));
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    ProcessResult r = worker.Wait(600);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    done = true;
  });
  const int64_t peak = PollPeakKb(worker, [&] { return !done.load(); });
  waiter.join();
  for (Process* p : {&chief, &ps0, &ps1}) {
    ProcessResult r = p->Wait(600);
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  return peak;
}

TEST(CtrClusterTest, WorkerPeakMemoryDoesNotGrowWithTheTable) {
  const int64_t small = WorkerPeakKb(100000), big = WorkerPeakKb(10000000);
  std::printf("worker peak RSS: %.1f MB with 1e5-row tables, %.1f MB with 1e7-row tables\n", small / 1024.0,
              big / 1024.0);
  ASSERT_GT(small, 0);
  ASSERT_GT(big, 0);
  EXPECT_LT(std::abs(big - small), 50 * 1024) << "the worker's memory grew with the table";
}

}  // namespace
}  // namespace psflow::testing
