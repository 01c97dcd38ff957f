// ps/tests/ps_test_util.h — in-process ps clusters for tests: real gRPC servers on 127.0.0.1 port 0
// and clients built from their real addresses.
#ifndef PSFLOW_PS_TESTS_PS_TEST_UTIL_H_
#define PSFLOW_PS_TESTS_PS_TEST_UTIL_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "psflow/dist/cluster.h"
#include "psflow/dist/partition.h"
#include "psflow/ps/ps_client.h"
#include "psflow/ps/ps_server.h"
#include "rpc/transport.h"

// ASSERT/EXPECT that an absl::Status is OK, printing it when it is not.
#define PSFLOW_ASSERT_OK(expr)            \
  do {                                    \
    const absl::Status _status = (expr);  \
    ASSERT_TRUE(_status.ok()) << _status; \
  } while (0)
#define PSFLOW_EXPECT_OK(expr)            \
  do {                                    \
    const absl::Status _status = (expr);  \
    EXPECT_TRUE(_status.ok()) << _status; \
  } while (0)

namespace psflow::ps::testing {

struct TestCluster {
  std::vector<std::unique_ptr<PsServer>> servers;
  dist::ClusterSpec cluster;  // the servers' real addresses, plus `num_workers` placeholder workers
  absl::Mutex log_mu;
  std::vector<std::string> log ABSL_GUARDED_BY(log_mu);  // lines the servers logged

  std::string LogText() {
    absl::MutexLock lock(&log_mu);
    return absl::StrJoin(log, "\n");
  }

  // Starts `num_ps` servers. `server_cluster`, when given, is what the servers believe the cluster
  // is (to test the mismatch check); by default they accept any cluster. `tweak` may change the
  // rest of the servers' options.
  static std::unique_ptr<TestCluster> Start(int num_ps, int num_workers, rpc::TransportOptions security = {},
                                            double shutdown_grace_secs = 10,
                                            const dist::ClusterSpec& server_cluster = {},
                                            const std::function<void(PsServer::Options*)>& tweak = nullptr) {
    auto c = std::make_unique<TestCluster>();
    std::vector<std::string> ps, workers;
    for (int k = 0; k < num_ps; ++k) {
      PsServer::Options o;
      o.listen_address = "127.0.0.1:0";
      o.task_index = k;
      o.cluster = server_cluster;
      o.security = security;
      o.shutdown_grace_secs = shutdown_grace_secs;
      if (tweak) tweak(&o);
      TestCluster* raw = c.get();
      o.log = [raw](const std::string& line) {
        absl::MutexLock lock(&raw->log_mu);
        raw->log.push_back(line);
      };
      auto server = PsServer::Start(o);
      EXPECT_TRUE(server.ok()) << server.status();
      if (!server.ok()) return nullptr;
      ps.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
      c->servers.push_back(*std::move(server));
    }
    // Placeholder worker addresses: nothing listens there; they only make the cluster complete.
    for (int w = 0; w < num_workers; ++w) workers.push_back(absl::StrCat("127.0.0.1:", 1 + w));
    auto cluster = dist::ClusterSpec::FromHostLists(absl::StrJoin(ps, ","), absl::StrJoin(workers, ","));
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    c->cluster = *cluster;
    return c;
  }

  // `log` (optional) receives the client's lines (waiting for a silent task, ...); default stderr.
  std::unique_ptr<PsClient> Client(const dist::PlacementPlan& plan, int worker_index,
                                   rpc::TransportOptions security = {},
                                   std::function<void(const std::string&)> log = nullptr, int64_t max_part_bytes = -1,
                                   const std::string& wire_dtype = "float32") const {
    PsClient::Options o;
    o.wire_dtype = wire_dtype;
    if (max_part_bytes >= 0) o.max_part_bytes = max_part_bytes;
    if (log) o.log = std::move(log);
    o.cluster = cluster;
    o.plan = plan;
    o.worker_index = worker_index;
    o.security = std::move(security);
    o.rpc_timeout_secs = 20;
    o.connect_timeout_secs = 5;
    auto client = PsClient::Create(o);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }
};

// `handler` served on 127.0.0.1 as a cluster's one ps task (a test's stand-in for a ps, or a proxy
// in front of one), and the cluster naming it (its worker address a placeholder).
struct LoopbackPs {
  std::unique_ptr<rpc::Server> server;
  dist::ClusterSpec cluster;
};
inline absl::StatusOr<LoopbackPs> ServeAsPs(rpc::Handler* handler) {
  absl::StatusOr<std::unique_ptr<rpc::Server>> server = rpc::StartGrpcServer("127.0.0.1:0", {}, handler);
  if (!server.ok()) return server.status();
  absl::StatusOr<dist::ClusterSpec> cluster =
      dist::ClusterSpec::FromHostLists(absl::StrCat("127.0.0.1:", (*server)->port()), "127.0.0.1:1");
  if (!cluster.ok()) return cluster.status();
  return LoopbackPs{*std::move(server), *std::move(cluster)};
}

inline dist::PlacementPlan Plan(const std::vector<dist::VariableSpec>& variables, int num_ps, int shards = 1,
                                int axis = 0) {
  dist::PartitionerSpec partitioner;
  if (shards > 1) {
    partitioner.kind = dist::PartitionerKind::kFixedSize;
    partitioner.num_shards = shards;
    partitioner.axis = axis;
  }
  return dist::PlanPlacement(variables, partitioner, dist::PlacementStrategy::kRoundRobin, num_ps);
}

inline Tensor Filled(const Shape& shape, float start, float step) {
  Tensor t(shape);
  for (int64_t i = 0; i < t.size(); ++i) t[i] = start + step * static_cast<float>(i);
  return t;
}

inline TrainingConfig Sgd(float lr) {
  TrainingConfig c;
  c.optimizer.name = "sgd";
  c.optimizer.learning_rate = lr;
  return c;
}

inline TrainingConfig Adam(float lr) {
  TrainingConfig c;
  c.optimizer.name = "adam";
  c.optimizer.learning_rate = lr;
  return c;
}

// `a` and `b` have the same shape and the same floats, bit for bit; `what` names them in failures.
inline void ExpectEqualTensors(const Tensor& a, const Tensor& b, const std::string& what = "") {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << what << (what.empty() ? "" : " ") << "element " << i;
}

// `got` holds exactly `want`'s variables, in order: names, update counts, values and `num_slots`
// optimizer slots each, bit for bit.
inline void ExpectSameSnapshot(const ModelSnapshot& got, const ModelSnapshot& want, size_t num_slots) {
  ASSERT_EQ(got.variables.size(), want.variables.size());
  for (size_t v = 0; v < want.variables.size(); ++v) {
    const VariableSnapshot &g = got.variables[v], &w = want.variables[v];
    EXPECT_EQ(g.name, w.name);
    EXPECT_EQ(g.updates, w.updates) << w.name;
    ExpectEqualTensors(g.value, w.value, "value of " + w.name);
    ASSERT_EQ(g.slots.size(), num_slots) << w.name;
    ASSERT_EQ(w.slots.size(), num_slots) << w.name;
    for (size_t j = 0; j < num_slots; ++j)
      ExpectEqualTensors(g.slots[j], w.slots[j], absl::StrCat("slot ", j, " of ", w.name));
  }
}

}  // namespace psflow::ps::testing

#endif  // PSFLOW_PS_TESTS_PS_TEST_UTIL_H_
