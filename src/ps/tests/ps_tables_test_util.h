// ps/tests/ps_tables_test_util.h — what the embedding-table tests share: a plan with tables, table
// declarations, an in-process job (ps tasks, connected workers, the chief's Initialize) over gRPC or
// shared memory, and a table pull.
#ifndef PSFLOW_PS_TESTS_PS_TABLES_TEST_UTIL_H_
#define PSFLOW_PS_TESTS_PS_TABLES_TEST_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"

namespace psflow::ps::table_testing {

using testing::Sgd;
using testing::TestCluster;

inline dist::PlacementPlan TablePlan(const std::vector<dist::TableSpec>& tables, int num_ps, int shards) {
  dist::PartitionerSpec partitioner;
  if (shards > 1) {
    partitioner.kind = dist::PartitionerKind::kFixedSize;
    partitioner.num_shards = shards;
  }
  dist::PlacementPlan plan =
      dist::PlanPlacement({{"w", {2}}}, partitioner, dist::PlacementStrategy::kRoundRobin, num_ps);
  absl::Status s = dist::PlanTables(tables, partitioner, dist::PlacementStrategy::kRoundRobin, &plan);
  EXPECT_TRUE(s.ok()) << s;
  return plan;
}

inline dist::TableSpec Fixed(const std::string& name, int64_t n, int64_t dim, dist::TableStrategy strategy) {
  dist::TableSpec t;
  t.name = name;
  t.dim = dim;
  t.num_embeddings = n;
  t.strategy = strategy;
  t.initializer = dist::TableInitializer::Uniform(-1, 1, /*seed=*/7);
  return t;
}

inline dist::TableSpec Dynamic(const std::string& name, int64_t dim) {
  dist::TableSpec t;
  t.name = name;
  t.dim = dim;
  t.kind = dist::TableKind::kDynamic;
  t.initializer = dist::TableInitializer::Normal(0, 0.5f, /*seed=*/11);
  return t;
}

// A started cluster with the chief connected and the model initialized.
struct Job {
  std::unique_ptr<TestCluster> cluster;
  std::vector<std::unique_ptr<PsClient>> workers;
  dist::PlacementPlan plan;
};

// `transport`: "grpc", or "shm" (the shared-memory data plane, gRPC for the rest).
inline Job StartJob(const dist::PlacementPlan& plan, int num_workers, const TrainingConfig& config,
                    const std::string& transport = "grpc") {
  Job job;
  job.plan = plan;
  rpc::TransportOptions options;
  options.transport = transport;
  job.cluster = TestCluster::Start(plan.num_ps, num_workers, options);
  for (int w = 0; w < num_workers; ++w) {
    job.workers.push_back(job.cluster->Client(plan, w, options));
    EXPECT_TRUE(job.workers.back()->Connect().ok());
  }
  const Tensor w({2}, 0.0f);
  absl::Status s = job.workers[0]->Initialize({{"w", &w}}, config);
  EXPECT_TRUE(s.ok()) << s;
  for (int w = 1; w < num_workers; ++w) EXPECT_TRUE(job.workers[w]->WaitForInitialization(10).ok());
  return job;
}

inline Tensor PullRows(PsClient& client, const std::string& table, const std::vector<int64_t>& ids, int64_t dim) {
  Tensor rows({static_cast<int64_t>(ids.size()), dim});
  TableStep step;
  step.pulls.push_back({table, &ids, &rows, nullptr});
  absl::StatusOr<int64_t> r = client.Pull({}, step);
  EXPECT_TRUE(r.ok()) << r.status();
  return rows;
}

inline std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
  return ids;
}

}  // namespace psflow::ps::table_testing

#endif  // PSFLOW_PS_TESTS_PS_TABLES_TEST_UTIL_H_
