// The next batch's rows pulled ahead (psflow/train/session.h PrefetchAhead;
// docs/sync-async.md#overlap), against a real ps server over gRPC on loopback, one worker: in async
// mode (--overlap other than none) PrefetchAhead pulls the rows at once, in a call of its own — the
// ps counts the rows pulled before Step was even called, and the rows the next Lookup takes miss
// this step's own update (one step stale) — while in sync mode, with --overlap=none, and with a
// plain Prefetch nothing is pulled before the step's push, and the prefetched rows come back with
// the push's answer, updated. No timing: the order is read from the ps's counters and the values.
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"
#include "psflow/train/session.h"

namespace psflow::train {
namespace {

using ps::testing::TestCluster;

constexpr int64_t kDim = 2;

int64_t RowsPulled(const TestCluster& cluster) {
  int64_t rows = 0;
  for (const auto& server : cluster.servers) {
    for (const ps::TableTaskStats& t : server->Stats().tables) rows += t.rows_pulled;
  }
  return rows;
}

// Waits until the ps counted `rows` rows pulled (bounded; no timing is asserted).
bool WaitForRowsPulled(const TestCluster& cluster, int64_t rows) {
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (RowsPulled(cluster) < rows) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

struct Job {
  std::unique_ptr<TestCluster> cluster = TestCluster::Start(1, 1);
  Tensor w{Shape{1}, 0.5f};
  Tensor w_grad{Shape{1}, 0.25f};
  std::unique_ptr<WorkerSession> session;

  Job(bool sync, const std::string& overlap) {
    WorkerSession::Options options;
    options.train.job_name = "worker";
    options.train.task_index = 0;
    options.train.ps_hosts = cluster->cluster.ps()[0];
    options.train.worker_hosts = cluster->cluster.workers()[0];
    options.train.optimizer = "sgd";
    options.train.learning_rate = 0.5f;
    options.train.sparse_optimizer = "sgd";
    options.train.sparse_learning_rate = 0.5f;
    options.train.sync_replicas = sync;
    options.train.overlap = overlap;
    options.train.train_steps = 100;
    options.log = [](const std::string&) {};
    dist::TableSpec spec;
    spec.name = "emb";
    spec.dim = kDim;
    spec.kind = dist::TableKind::kFixed;
    spec.num_embeddings = 10;
    spec.initializer = dist::TableInitializer::Uniform(-1, 1);
    spec.initializer.seed = 5;
    auto s = WorkerSession::Create(options, {{"w", &w, &w_grad, nullptr}}, {spec});
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return;
    session = *std::move(s);
    EXPECT_TRUE(session->Open().ok());
  }

  std::vector<float> Rows() const {
    const TableBatch& b = session->table_batch(0);
    return std::vector<float>(b.rows.data(), b.rows.data() + b.rows.size());
  }
};

const std::vector<int64_t> kIds = {3, 7, 3};  // unique: 3, 7

// One step on kIds with the next batch (kIds again) prefetched; returns the rows looked up before
// the step, and fills `pulled_at_prefetch` (rows the ps counted right after Prefetch returned or,
// when `wait_for_ahead`, once the pull ahead was served) and `pulled_after_step`.
std::vector<float> StepWithPrefetch(Job& job, bool ahead, bool wait_for_ahead, int64_t* pulled_at_prefetch,
                                    int64_t* pulled_after_step) {
  EXPECT_TRUE(job.session->Lookup({kIds}).ok());
  const std::vector<float> before = job.Rows();
  const int64_t pulled = RowsPulled(*job.cluster);
  job.session->table_batch(0).grads = Tensor(Shape{2, kDim}, 1.0f);
  EXPECT_TRUE((ahead ? job.session->PrefetchAhead({kIds}) : job.session->Prefetch({kIds})).ok());
  if (wait_for_ahead) {
    EXPECT_TRUE(WaitForRowsPulled(*job.cluster, pulled + 2)) << "the rows were never pulled ahead";
  }
  *pulled_at_prefetch = RowsPulled(*job.cluster) - pulled;
  EXPECT_TRUE(job.session->Step(1.0).ok());
  *pulled_after_step = RowsPulled(*job.cluster) - pulled;
  return before;
}

TEST(SessionPullAheadTest, AsyncPullsTheNextRowsBeforeTheStepsPushOneStepStale) {
  Job job(/*sync=*/false, "auto");
  ASSERT_NE(job.session, nullptr);
  int64_t at_prefetch = 0, after_step = 0;
  const std::vector<float> before =
      StepWithPrefetch(job, /*ahead=*/true, /*wait_for_ahead=*/true, &at_prefetch, &after_step);
  // Served before Step was called, so before the push was sent.
  EXPECT_EQ(at_prefetch, 2);
  EXPECT_EQ(after_step, 2);  // nothing more pulled by the step's push
  const int64_t pulled = RowsPulled(*job.cluster);
  ASSERT_TRUE(job.session->Lookup({kIds}).ok());
  EXPECT_EQ(RowsPulled(*job.cluster), pulled);  // the prefetched rows were taken
  EXPECT_EQ(job.Rows(), before);                // ... as they stood before this worker's update
  // The update did happen: the same ids, pulled now (no prefetch), moved by sgd 0.5 × 1.
  job.session->table_batch(0).grads = Tensor();
  ASSERT_TRUE(job.session->Step(1.0).ok());
  ASSERT_TRUE(job.session->Lookup({kIds}).ok());
  const std::vector<float> now = job.Rows();
  ASSERT_EQ(now.size(), before.size());
  for (size_t i = 0; i < now.size(); ++i) EXPECT_FLOAT_EQ(now[i], before[i] - 0.5f) << i;
  EXPECT_TRUE(job.session->Close().ok());
}

// Sync, async with --overlap=none, and a plain Prefetch: nothing leaves before the step's push;
// the prefetch rides on it and its rows come back updated by the step.
TEST(SessionPullAheadTest, SyncOverlapNoneAndPrefetchKeepThePrefetchOnThePush) {
  struct Case {
    bool sync;
    const char* overlap;
    bool ahead;
  };
  for (const Case& c :
       {Case{true, "auto", true}, Case{true, "push", true}, Case{false, "none", true}, Case{false, "auto", false}}) {
    SCOPED_TRACE(absl::StrCat(c.sync ? "sync" : "async", " --overlap=", c.overlap, c.ahead ? " PrefetchAhead" : ""));
    Job job(c.sync, c.overlap);
    ASSERT_NE(job.session, nullptr);
    int64_t at_prefetch = 0, after_step = 0;
    const std::vector<float> before =
        StepWithPrefetch(job, c.ahead, /*wait_for_ahead=*/false, &at_prefetch, &after_step);
    EXPECT_EQ(at_prefetch, 0);  // Prefetch sent nothing
    EXPECT_EQ(after_step, 2);   // the push's answer brought them
    const int64_t pulled = RowsPulled(*job.cluster);
    ASSERT_TRUE(job.session->Lookup({kIds}).ok());
    EXPECT_EQ(RowsPulled(*job.cluster), pulled);
    const std::vector<float> rows = job.Rows();
    ASSERT_EQ(rows.size(), before.size());
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_FLOAT_EQ(rows[i], before[i] - 0.5f) << i;
    EXPECT_TRUE(job.session->Close().ok());
  }
}

}  // namespace
}  // namespace psflow::train
