// Surviving failures through real gRPC: optimizer state pulled from one layout and restored onto
// another, pushes retried across a ps task's outage, a restarted ps task recognized and restored,
// and a ps task that never comes back named after the bounded wait.
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"

namespace psflow::ps {
namespace {

using testing::Adam;
using testing::ExpectEqualTensors;
using testing::Filled;
using ::testing::HasSubstr;
using testing::Plan;
using testing::Sgd;
using testing::TestCluster;

struct Logged {
  absl::Mutex mu;
  std::vector<std::string> lines ABSL_GUARDED_BY(mu);
  std::string Text() {
    absl::MutexLock lock(&mu);
    return absl::StrJoin(lines, "\n");
  }
};

std::unique_ptr<PsClient> ClientWithLog(const TestCluster& cluster, const dist::PlacementPlan& plan,
                                        double unavailable_secs, Logged* logged) {
  PsClient::Options o;
  o.cluster = cluster.cluster;
  o.plan = plan;
  o.rpc_timeout_secs = 20;
  o.connect_timeout_secs = 5;
  o.ps_unavailable_timeout_secs = unavailable_secs;
  o.log = [logged](const std::string& line) {
    absl::MutexLock lock(&logged->mu);
    logged->lines.push_back(line);
  };
  auto client = PsClient::Create(o);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

const std::vector<dist::VariableSpec> kVars = {{"w", {6, 3}}, {"b", {3}}};

TEST(PsStateTest, AdamStateMovesFromTwoPartitionedPsToOneUnpartitionedPs) {
  auto two = TestCluster::Start(2, 1);
  ASSERT_NE(two, nullptr);
  auto source = two->Client(Plan(kVars, 2, /*shards=*/2), 0);
  PSFLOW_ASSERT_OK(source->Connect());
  const Tensor w = Filled({6, 3}, 0.5f, 0.25f), b = Filled({3}, -1.0f, 0.5f);
  PSFLOW_ASSERT_OK(source->Initialize({{"w", &w}, {"b", &b}}, Adam(0.1f)));
  for (int step = 0; step < 3; ++step) {
    const Tensor gw = Filled({6, 3}, 0.1f * (step + 1), -0.05f), gb = Filled({3}, 1.0f, -0.7f * step);
    ASSERT_TRUE(source->Push({{"w", &gw, nullptr}, {"b", &gb, nullptr}}, step).ok());
  }
  auto snapshot = source->PullState();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->global_step, 3);
  ASSERT_EQ(snapshot->variables.size(), 2u);
  Tensor w_now({6, 3}), b_now({3});
  ASSERT_TRUE(source->Pull({{"w", &w_now}, {"b", &b_now}}).ok());
  for (const VariableSnapshot& v : snapshot->variables) {
    EXPECT_EQ(v.updates, 3) << v.name;
    ASSERT_EQ(v.slots.size(), 2u) << v.name;  // m, v
    ExpectEqualTensors(v.value, v.name == "w" ? w_now : b_now);
  }

  // Restored whole onto one ps without partitioning, and also (as the control showing the slots
  // matter) initialized from the values alone.
  auto one = TestCluster::Start(1, 1);
  auto fresh = TestCluster::Start(1, 1);
  ASSERT_TRUE(one != nullptr && fresh != nullptr);
  auto restored = one->Client(Plan(kVars, 1), 0);
  auto values_only = fresh->Client(Plan(kVars, 1), 0);
  PSFLOW_ASSERT_OK(restored->Connect());
  PSFLOW_ASSERT_OK(values_only->Connect());
  PSFLOW_ASSERT_OK(restored->Initialize(*snapshot, Adam(0.1f)));
  PSFLOW_ASSERT_OK(values_only->Initialize({{"w", &w_now}, {"b", &b_now}}, Adam(0.1f)));
  auto round_trip = restored->PullState();
  ASSERT_TRUE(round_trip.ok()) << round_trip.status();
  EXPECT_EQ(round_trip->global_step, 3);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(round_trip->variables[i].updates, 3);
    for (size_t s = 0; s < 2; ++s)
      ExpectEqualTensors(round_trip->variables[i].slots[s], snapshot->variables[i].slots[s]);
  }

  const Tensor gw = Filled({6, 3}, -0.3f, 0.02f), gb = Filled({3}, 0.4f, 0.1f);
  std::vector<Tensor> results;
  for (PsClient* client : {source.get(), restored.get(), values_only.get()}) {
    auto pushed = client->Push({{"w", &gw, nullptr}, {"b", &gb, nullptr}}, 3);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    Tensor w_after({6, 3}), b_after({3});
    ASSERT_TRUE(client->Pull({{"w", &w_after}, {"b", &b_after}}).ok());
    results.push_back(w_after);
    results.push_back(b_after);
  }
  ExpectEqualTensors(results[2], results[0]);
  ExpectEqualTensors(results[3], results[1]);
  EXPECT_NE(results[4][0], results[0][0]);  // fresh Adam state (t=1, m=v=0) steps differently
}

TEST(PsStateTest, RestoreRefusesASnapshotThatDoesNotFitTheModel) {
  auto cluster = TestCluster::Start(1, 1);
  ASSERT_NE(cluster, nullptr);
  auto client = cluster->Client(Plan(kVars, 1), 0);
  PSFLOW_ASSERT_OK(client->Connect());
  ModelSnapshot state;
  state.variables.push_back({"w", Tensor({6, 3}), {Tensor({6, 3}), Tensor({6, 3})}, 1});
  absl::Status missing = client->Initialize(state, Adam(0.1f));
  EXPECT_TRUE(absl::IsInvalidArgument(missing)) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("no variable 'b'"));
  state.variables.push_back({"b", Tensor({3}), {Tensor({3})}, 1});
  absl::Status slots = client->Initialize(state, Adam(0.1f));
  EXPECT_THAT(slots.message(), HasSubstr("1 optimizer slots for 'b'"));
}

// Two ps tasks, w on one and b on the other; the one holding b is killed.
struct KilledPs {
  std::unique_ptr<TestCluster> cluster;
  dist::PlacementPlan plan;
  int victim = -1;
  std::string address;
};

KilledPs StartAndPickVictim() {
  KilledPs k;
  k.cluster = TestCluster::Start(2, 1);
  k.plan = Plan(kVars, 2);
  k.victim = k.plan.ShardsOf("b")[0]->ps_task;
  EXPECT_NE(k.victim, k.plan.ShardsOf("w")[0]->ps_task);
  k.address = k.cluster->cluster.ps()[k.victim];
  return k;
}

TEST(PsRecoveryTest, PushRetriedAcrossARestartIsRecognizedAndTheRestoredPsServesAgain) {
  KilledPs k = StartAndPickVictim();
  ASSERT_NE(k.cluster, nullptr);
  Logged logged;
  auto client = ClientWithLog(*k.cluster, k.plan, 30, &logged);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w = Filled({6, 3}, 1.0f, 0.5f), b = Filled({3}, 2.0f, -1.0f);
  const TrainingConfig sgd = Sgd(0.5f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}, {"b", &b}}, sgd));
  const Tensor gw = Filled({6, 3}, 1.0f, 0.0f), gb = Filled({3}, 2.0f, 0.0f);
  ASSERT_TRUE(client->Push({{"w", &gw, nullptr}, {"b", &gb, nullptr}}, 0).ok());
  auto snapshot = client->PullState();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();

  // Kill the ps holding b; bring a new (empty) one up on the same port while the push retries.
  const int port = k.cluster->servers[k.victim]->port();
  k.cluster->servers[k.victim]->Stop();
  k.cluster->servers[k.victim].reset();
  std::thread restart([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    PsServer::Options o;
    o.listen_address = k.address;
    o.task_index = k.victim;
    o.log = [](const std::string&) {};
    auto server = PsServer::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) k.cluster->servers[k.victim] = *std::move(server);
  });
  auto pushed = client->Push({{"w", &gw, nullptr}, {"b", &gb, nullptr}}, 1);
  restart.join();
  ASSERT_FALSE(pushed.ok());
  EXPECT_TRUE(IsPsRestarted(pushed.status())) << pushed.status();
  EXPECT_EQ(RestartedPsTask(pushed.status()), k.victim);
  EXPECT_THAT(pushed.status().message(), HasSubstr(absl::StrCat(":", port)));
  EXPECT_FALSE(IsPsRestarted(absl::FailedPreconditionError("something else")));
  EXPECT_THAT(logged.Text(), HasSubstr(absl::StrCat("waiting for ps task ", k.victim, " (", k.address, ")")));

  PSFLOW_ASSERT_OK(client->InitializePs(k.victim, *snapshot, sgd));
  auto again = client->Push({{"w", &gw, nullptr}, {"b", &gb, nullptr}}, 2);
  ASSERT_TRUE(again.ok()) << again.status();
  Tensor w_now({6, 3}), b_now({3});
  ASSERT_TRUE(client->Pull({{"w", &w_now}, {"b", &b_now}}).ok());
  // w's ps kept every push that reached it (three, each -0.5 * 1); b was restored after its first
  // push (-0.5 * 2) and got one more.
  for (int64_t i = 0; i < 18; ++i) EXPECT_FLOAT_EQ(w_now[i], w[i] - 1.5f) << i;
  for (int64_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(b_now[i], b[i] - 2.0f) << i;
}

TEST(PsRecoveryTest, APsThatNeverComesBackIsNamedAfterTheBoundedWait) {
  KilledPs k = StartAndPickVictim();
  ASSERT_NE(k.cluster, nullptr);
  Logged logged;
  auto client = ClientWithLog(*k.cluster, k.plan, 0.5, &logged);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w = Filled({6, 3}, 1.0f, 0.5f), b = Filled({3}, 2.0f, -1.0f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}, {"b", &b}}, Sgd(0.5f)));
  k.cluster->servers[k.victim]->Stop();
  Tensor w_now({6, 3}), b_now({3});
  auto pulled = client->Pull({{"w", &w_now}, {"b", &b_now}});
  ASSERT_FALSE(pulled.ok());
  EXPECT_TRUE(absl::IsUnavailable(pulled.status())) << pulled.status();
  EXPECT_THAT(pulled.status().message(), HasSubstr(absl::StrCat("ps task ", k.victim, " (", k.address, ")")));
  EXPECT_THAT(pulled.status().message(), HasSubstr("after 0.5 s"));
  EXPECT_FALSE(IsPsRestarted(pulled.status()));
}

}  // namespace
}  // namespace psflow::ps
