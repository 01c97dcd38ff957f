// Embedding tables through the worker session (psflow/train/session.h: Lookup, table_batch,
// Prefetch, Step), against real ps servers over gRPC on loopback, workers on threads: a toy
// model (prediction = ⟨row(id), w⟩, half squared error, gradients by hand) trained sync by 2
// workers × B gives the same dense values and rows as 1 worker × 2B on the same examples
// (--sparse_sync_mean=workers), with and without prefetch; Lookup dedups (index round trip); misuse
// is refused with one line naming it.
#include <cmath>
#include <map>
#include <thread>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"
#include "psflow/core/random.h"
#include "psflow/train/session.h"

namespace psflow::train {
namespace {

dist::TableSpec Named(std::string name, dist::TableSpec spec) {
  spec.name = std::move(name);
  return spec;
}

using ps::testing::TestCluster;

constexpr int64_t kDim = 3;
constexpr int64_t kVocab = 40;  // ids drawn from [0, kVocab) (repeats within a batch)
constexpr int64_t kSteps = 6;

// Example j of global batch s: its id and target, a function of (s, j) only.
int64_t IdOf(int64_t s, int64_t j) { return static_cast<int64_t>(Rng::Mix(s * 1000 + j, 17) % kVocab) * 7919; }
float TargetOf(int64_t s, int64_t j) { return static_cast<float>(Rng::Mix(s * 1000 + j, 29) % 1000) / 500.0f - 1.0f; }

struct Result {
  std::vector<float> w;
  std::map<int64_t, std::vector<float>> rows;  // every id of the vocabulary, as the ps holds it
};

// One worker of a sync job of `workers` workers, each taking `batch` examples of the global batch
// (worker k: examples [k·batch, (k+1)·batch)). The chief returns the final values.
absl::StatusOr<Result> RunWorker(const dist::ClusterSpec& cluster, int index, int workers, int64_t batch, bool dynamic,
                                 bool prefetch) {
  WorkerSession::Options options;
  options.train.job_name = "worker";
  options.train.task_index = index;
  options.train.ps_hosts = absl::StrJoin(cluster.ps(), ",");
  options.train.worker_hosts = absl::StrJoin(cluster.workers(), ",");
  options.train.optimizer = "sgd";
  options.train.learning_rate = 0.3f;
  options.train.lr_decay_steps = 0;
  options.train.sparse_optimizer = "adagrad";
  options.train.sparse_learning_rate = 0.7f;
  options.train.sync_replicas = true;
  options.train.train_steps = kSteps;
  options.train.batch_size = static_cast<int>(batch);
  options.model_name = "toy";
  options.log = [](const std::string&) {};
  Tensor w(Shape{kDim}, std::vector<float>{0.5f, -0.25f, 1.0f});
  Tensor w_grad(Shape{kDim}, 0.0f);
  dist::TableSpec spec;
  spec.dim = kDim;
  spec.kind = dynamic ? dist::TableKind::kDynamic : dist::TableKind::kFixed;
  spec.num_embeddings = dynamic ? 0 : kVocab * 7919;
  spec.initializer = dist::TableInitializer::Uniform(-1, 1);
  spec.initializer.seed = 3;
  auto session_or = WorkerSession::Create(options, {{"w", &w, &w_grad, nullptr}}, {Named("emb", spec)});
  if (!session_or.ok()) return session_or.status();
  WorkerSession& session = **session_or;
  if (auto s = session.Open(); !s.ok()) return s;
  auto ids_of = [&](int64_t s) {
    std::vector<int64_t> ids;
    for (int64_t j = 0; j < batch; ++j) ids.push_back(IdOf(s, index * batch + j));
    return ids;
  };
  while (!session.ShouldStop()) {
    const int64_t s = session.data_step();
    const std::vector<int64_t> ids = ids_of(s);
    if (auto st = session.Lookup({ids}); !st.ok()) return st;
    TableBatch& b = session.table_batch(0);
    // Forward and backward of mean_j 0.5 (⟨row(id_j), w⟩ − y_j)², by hand.
    Tensor grads(Shape{static_cast<int64_t>(b.ids.size()), kDim}, 0.0f);
    for (int64_t d = 0; d < kDim; ++d) w_grad[d] = 0;
    double loss = 0;
    for (int64_t j = 0; j < batch; ++j) {
      const int64_t u = b.index[j];
      if (b.ids[u] != ids[j]) return absl::InternalError("index does not point at the example's id");
      const float* row = b.rows.data() + u * kDim;
      double pred = 0;
      for (int64_t d = 0; d < kDim; ++d) pred += row[d] * w[d];
      const double err = pred - TargetOf(s, index * batch + j);
      loss += 0.5 * err * err / batch;
      for (int64_t d = 0; d < kDim; ++d) {
        grads[u * kDim + d] += static_cast<float>(err * w[d] / batch);
        w_grad[d] += static_cast<float>(err * row[d] / batch);
      }
    }
    b.grads = std::move(grads);
    if (prefetch) {
      const std::vector<int64_t> next = ids_of(s + 1);
      if (auto st = session.Prefetch({next}); !st.ok()) return st;
    }
    if (auto st = session.Step(loss); !st.ok()) return st;
  }
  Result result;
  auto summary = session.Close([&]() -> absl::StatusOr<SessionEval> {
    std::vector<int64_t> all;
    for (int64_t v = 0; v < kVocab; ++v) all.push_back(v * 7919);
    if (auto st = session.Lookup({all}); !st.ok()) return st;
    const TableBatch& b = session.table_batch(0);
    for (size_t u = 0; u < b.ids.size(); ++u) {
      result.rows[b.ids[u]].assign(b.rows.data() + u * kDim, b.rows.data() + (u + 1) * kDim);
    }
    return SessionEval{};
  });
  if (!summary.ok()) return summary.status();
  result.w.assign(w.data(), w.data() + kDim);
  return result;
}

Result RunJob(int workers, int64_t batch, bool dynamic, bool prefetch) {
  auto cluster = TestCluster::Start(2, workers);
  EXPECT_NE(cluster, nullptr);
  std::vector<absl::StatusOr<Result>> results(workers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int k = 0; k < workers; ++k) {
    threads.emplace_back([&, k] { results[k] = RunWorker(cluster->cluster, k, workers, batch, dynamic, prefetch); });
  }
  for (std::thread& t : threads) t.join();
  for (int k = 0; k < workers; ++k) EXPECT_TRUE(results[k].ok()) << "worker " << k << ": " << results[k].status();
  return results[0].ok() ? *results[0] : Result{};
}

TEST(SessionTablesTest, SyncTwoWorkersEqualOneWorkerWithTheirExamples) {
  for (bool dynamic : {true, false}) {
    for (bool prefetch : {false, true}) {
      SCOPED_TRACE(absl::StrCat(dynamic ? "dynamic" : "fixed", prefetch ? ", prefetch" : ""));
      const Result two = RunJob(2, 8, dynamic, prefetch);
      const Result one = RunJob(1, 16, dynamic, prefetch);
      ASSERT_EQ(two.w.size(), static_cast<size_t>(kDim));
      ASSERT_EQ(one.w.size(), static_cast<size_t>(kDim));
      for (int64_t d = 0; d < kDim; ++d) EXPECT_NEAR(two.w[d], one.w[d], 1e-5f) << "w[" << d << "]";
      ASSERT_EQ(two.rows.size(), one.rows.size());
      int moved = 0;
      for (const auto& [id, row] : one.rows) {
        for (int64_t d = 0; d < kDim; ++d) EXPECT_NEAR(two.rows.at(id)[d], row[d], 1e-5f) << "id " << id;
      }
      // The rows did train (the toy's ids repeat, so most were pushed): compare with a fresh job's.
      const Result fresh = [&] {
        auto cluster = TestCluster::Start(1, 1);
        Result r;
        WorkerSession::Options options;
        options.train.job_name = "worker";
        options.train.ps_hosts = cluster->cluster.ps()[0];
        options.train.worker_hosts = cluster->cluster.workers()[0];
        options.train.train_steps = 1;
        options.log = [](const std::string&) {};
        Tensor w(Shape{kDim}, 0.0f);
        dist::TableSpec spec;
        spec.dim = kDim;
        spec.kind = dynamic ? dist::TableKind::kDynamic : dist::TableKind::kFixed;
        spec.num_embeddings = dynamic ? 0 : kVocab * 7919;
        spec.initializer = dist::TableInitializer::Uniform(-1, 1);
        spec.initializer.seed = 3;
        auto session = WorkerSession::Create(options, {{"w", &w, nullptr, nullptr}}, {Named("emb", spec)});
        EXPECT_TRUE(session.ok()) << session.status();
        EXPECT_TRUE((*session)->Open().ok());
        std::vector<int64_t> all;
        for (int64_t v = 0; v < kVocab; ++v) all.push_back(v * 7919);
        EXPECT_TRUE((*session)->Lookup({all}).ok());
        const TableBatch& b = (*session)->table_batch(0);
        for (size_t u = 0; u < b.ids.size(); ++u) {
          r.rows[b.ids[u]].assign(b.rows.data() + u * kDim, b.rows.data() + (u + 1) * kDim);
        }
        EXPECT_TRUE((*session)->Step(0.0).ok());
        EXPECT_TRUE((*session)->Close().ok());
        return r;
      }();
      for (const auto& [id, row] : one.rows) moved += row != fresh.rows.at(id);
      EXPECT_GT(moved, kVocab / 2);
    }
  }
}

TEST(SessionTablesTest, MisuseIsRefusedWithOneLine) {
  WorkerSession::Options options;
  options.train.job_name = "worker";
  options.train.ps_hosts = "127.0.0.1:1";
  options.train.worker_hosts = "127.0.0.1:2";
  Tensor w(Shape{2}, 0.0f);
  dist::TableSpec spec;
  spec.dim = 2;
  spec.kind = dist::TableKind::kDynamic;
  auto twice = WorkerSession::Create(options, {{"w", &w, nullptr, nullptr}}, {Named("t", spec), Named("t", spec)});
  EXPECT_TRUE(absl::IsInvalidArgument(twice.status())) << twice.status();
  auto like_param = WorkerSession::Create(options, {{"w", &w, nullptr, nullptr}}, {Named("w", spec)});
  EXPECT_TRUE(absl::IsInvalidArgument(like_param.status())) << like_param.status();
  auto session = WorkerSession::Create(options, {{"w", &w, nullptr, nullptr}}, {Named("t", spec)});
  ASSERT_TRUE(session.ok()) << session.status();
  const std::vector<int64_t> ids = {1, 2};
  EXPECT_TRUE(absl::IsFailedPrecondition((*session)->Lookup({ids})));
  EXPECT_EQ((*session)->num_tables(), 1);
  auto unnamed = WorkerSession::Create(options, {{"w", &w, nullptr, nullptr}}, {spec});
  EXPECT_TRUE(absl::IsInvalidArgument(unnamed.status())) << unnamed.status();
}

// The deprecated SessionTable{name, spec} still declares a table for this release, named by `name`.
TEST(SessionTablesTest, TheDeprecatedSessionTableFormStillWorks) {
  WorkerSession::Options options;
  options.train.job_name = "worker";
  options.train.ps_hosts = "127.0.0.1:1";
  options.train.worker_hosts = "127.0.0.1:2";
  Tensor w(Shape{2}, 0.0f);
  dist::TableSpec spec;
  spec.dim = 2;
  spec.kind = dist::TableKind::kDynamic;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  auto twice = WorkerSession::Create(options, {{"w", &w, nullptr, nullptr}},
                                     std::vector<SessionTable>{{"t", spec}, {"t", spec}});
  EXPECT_TRUE(absl::IsInvalidArgument(twice.status())) << twice.status();
  auto session = WorkerSession::Create(options, {{"w", &w, nullptr, nullptr}}, std::vector<SessionTable>{{"t", spec}});
#pragma GCC diagnostic pop
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->num_tables(), 1);
}

}  // namespace
}  // namespace psflow::train
