// Connecting, authentication, initialization notification, model and cluster checks, shutdown.
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/work_queue.h"
#include "ps/tests/ps_test_util.h"

namespace psflow::ps {
namespace {

using ::testing::HasSubstr;
using testing::Plan;
using testing::Sgd;
using testing::TestCluster;

const std::vector<dist::VariableSpec> kVars = {{"w", {3, 2}}};

TEST(LifecycleTest, SecretIsRequiredAndChecked) {
  rpc::TransportOptions server_security;
  server_security.secret = "right-secret";
  auto cluster = TestCluster::Start(1, 1, server_security);
  const dist::PlacementPlan plan = Plan(kVars, 1);

  auto none = cluster->Client(plan, 0);
  absl::Status s = none->Connect();
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("no cluster secret"));

  rpc::TransportOptions wrong;
  wrong.secret = "wrong-secret";
  s = cluster->Client(plan, 0, wrong)->Connect();
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("wrong cluster secret"));
  EXPECT_EQ(cluster->servers[0]->Stats().calls_unauthenticated, 2);

  auto right = cluster->Client(plan, 0, server_security);
  PSFLOW_ASSERT_OK(right->Connect());
  const Tensor w({3, 2}, 1.0f);
  PSFLOW_EXPECT_OK(right->Initialize({{"w", &w}}, Sgd(0.1f)));
  Tensor got({3, 2});
  EXPECT_TRUE(right->Pull({{"w", &got}}).ok());
  // Data calls without the secret are refused too, not only Connect.
  Tensor other({3, 2});
  EXPECT_TRUE(absl::IsUnauthenticated(none->Pull({{"w", &other}}).status()));
}

TEST(LifecycleTest, WaitForInitializationReturnsWhenTheChiefInitializes) {
  auto cluster = TestCluster::Start(2, 2);
  const dist::PlacementPlan plan = Plan(kVars, 2, 2);
  auto chief = cluster->Client(plan, 0), worker = cluster->Client(plan, 1);
  PSFLOW_ASSERT_OK(chief->Connect());
  PSFLOW_ASSERT_OK(worker->Connect());
  absl::Notification waited;
  absl::Status wait_status;
  std::thread waiter([&] {
    wait_status = worker->WaitForInitialization(60);
    waited.Notify();
  });
  // Held by the ps until the chief initializes.
  EXPECT_FALSE(waited.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  const Tensor w({3, 2}, 2.0f);
  PSFLOW_ASSERT_OK(chief->Initialize({{"w", &w}}, Sgd(0.1f)));
  waiter.join();
  EXPECT_TRUE(wait_status.ok()) << wait_status;
  Tensor got({3, 2});
  ASSERT_TRUE(worker->Pull({{"w", &got}}).ok());
  EXPECT_EQ(got[5], 2.0f);
  auto initialized = worker->IsInitialized();
  ASSERT_TRUE(initialized.ok());
  EXPECT_TRUE(*initialized);
}

TEST(LifecycleTest, WaitForInitializationTimesOutNamingThePs) {
  auto cluster = TestCluster::Start(1, 2);
  auto worker = cluster->Client(Plan(kVars, 1), 1);
  PSFLOW_ASSERT_OK(worker->Connect());
  absl::Status s = worker->WaitForInitialization(0.3);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_EQ(std::string(s.message()),
            absl::StrCat("waited 0.3 s for the chief (worker 0) to initialize the variables on ps task 0 (",
                         cluster->cluster.ps()[0], ")"));
}

TEST(LifecycleTest, DifferentModelIsRefusedNamingTheVariable) {
  auto cluster = TestCluster::Start(1, 2);
  auto chief = cluster->Client(Plan({{"w", {3, 2}}, {"b", {2}}}, 1), 0);
  auto worker = cluster->Client(Plan({{"w", {3, 2}}, {"b", {5}}}, 1), 1);
  PSFLOW_ASSERT_OK(chief->Connect());
  PSFLOW_ASSERT_OK(worker->Connect());
  const Tensor w({3, 2}, 1.0f), b({2}, 1.0f);
  PSFLOW_ASSERT_OK(chief->Initialize({{"w", &w}, {"b", &b}}, Sgd(0.1f)));
  absl::Status s = worker->WaitForInitialization(10);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'b'"));
}

TEST(LifecycleTest, ClusterMismatchIsRefusedNamingBothClusters) {
  auto server_cluster = dist::ClusterSpec::FromHostLists("127.0.0.1:1", "127.0.0.1:2");
  ASSERT_TRUE(server_cluster.ok());
  auto cluster = TestCluster::Start(1, 1, {}, 10, *server_cluster);
  absl::Status s = cluster->Client(Plan(kVars, 1), 0)->Connect();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("cluster mismatch"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(server_cluster->ToString()));
  EXPECT_THAT(std::string(s.message()), HasSubstr(cluster->cluster.ToString()));
  EXPECT_THAT(std::string(s.message()), HasSubstr("ps task 0 ("));
}

TEST(LifecycleTest, ConnectToNothingFailsWithinTheTimeoutNamingTheAddress) {
  const int port = [] {
    auto probe = TestCluster::Start(1, 1);
    return probe->servers[0]->port();
  }();  // that server is gone now
  auto cluster = dist::ClusterSpec::FromHostLists(absl::StrCat("127.0.0.1:", port), "127.0.0.1:1");
  ASSERT_TRUE(cluster.ok());
  PsClient::Options o;
  o.cluster = *cluster;
  o.plan = Plan(kVars, 1);
  o.connect_timeout_secs = 0.5;
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok());
  absl::Status s = (*client)->Connect();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("ps task 0 (127.0.0.1:", port, ")")));
}

TEST(LifecycleTest, ShutdownThenWaitReturnsAfterEveryWorkerSaidGoodbye) {
  auto cluster = TestCluster::Start(1, 2, {}, /*shutdown_grace_secs=*/60);
  const dist::PlacementPlan plan = Plan(kVars, 1);
  auto chief = cluster->Client(plan, 0), worker = cluster->Client(plan, 1);
  PSFLOW_ASSERT_OK(chief->Connect());
  PSFLOW_ASSERT_OK(worker->Connect());
  const Tensor w({3, 2}, 1.0f);
  PSFLOW_ASSERT_OK(chief->Initialize({{"w", &w}}, Sgd(0.1f)));
  const Tensor g({3, 2}, 1.0f);
  ASSERT_TRUE(worker->Push({{"w", &g, nullptr}}, 0).ok());

  absl::Notification returned;
  std::thread waiter([&] {
    EXPECT_TRUE(cluster->servers[0]->Wait().ok());
    returned.Notify();
  });
  PSFLOW_ASSERT_OK(chief->Shutdown());
  auto after = worker->Push({{"w", &g, nullptr}}, 1);
  EXPECT_TRUE(absl::IsOutOfRange(after.status())) << after.status();
  EXPECT_THAT(std::string(after.status().message()), HasSubstr("training finished at step 1"));
  // Worker 1 is still connected: the ps waits for its goodbye.
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  PSFLOW_ASSERT_OK(worker->Goodbye());
  waiter.join();
  EXPECT_TRUE(returned.HasBeenNotified());
}

TEST(LifecycleTest, WaitGivesUpOnSilentWorkersAfterTheGrace) {
  auto cluster = TestCluster::Start(1, 2, {}, /*shutdown_grace_secs=*/0.2);
  const dist::PlacementPlan plan = Plan(kVars, 1);
  auto chief = cluster->Client(plan, 0), silent = cluster->Client(plan, 1);
  PSFLOW_ASSERT_OK(chief->Connect());
  PSFLOW_ASSERT_OK(silent->Connect());
  PSFLOW_ASSERT_OK(chief->Shutdown());
  EXPECT_TRUE(cluster->servers[0]->Wait().ok());
  EXPECT_THAT(cluster->LogText(), HasSubstr("did not say goodbye"));
}

// The bounds on waiting: a ps task never hangs for a chief or workers that are gone.
TEST(LifecycleTest, WaitGivesUpWhenTheChiefNeverInitializes) {
  auto cluster = TestCluster::Start(1, 1, {}, 10, {}, [](PsServer::Options* o) { o->init_timeout_secs = 1; });
  const absl::Status s = cluster->servers[0]->Wait();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("the chief (worker 0) did not initialize the variables within 1 s"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--init_timeout_secs"));
}

TEST(LifecycleTest, WaitGivesUpWhenNoWorkerCallsAnyMore) {
  auto cluster = TestCluster::Start(1, 1, {}, 10, {}, [](PsServer::Options* o) {
    o->init_timeout_secs = 30;
    o->idle_timeout_secs = 1.5;
  });
  const dist::PlacementPlan plan = Plan(kVars, 1);
  auto chief = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(chief->Connect());
  const Tensor w({3, 2}, 1.0f);
  PSFLOW_ASSERT_OK(chief->Initialize({{"w", &w}}, Sgd(0.1f)));
  // Calls keep it alive: pull every 0.5 s for 2.5 s (longer than the bound), then go silent.
  std::atomic<bool> waited{false};
  absl::Status wait_status;
  std::thread waiter([&] {
    wait_status = cluster->servers[0]->Wait();
    waited = true;
  });
  Tensor got({3, 2});
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(chief->Pull({{"w", &got}}).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_FALSE(waited.load()) << "gave up while a worker was calling";
  }
  waiter.join();  // bounded: 1.5 s after the last pull (plus the 1 s check period)
  EXPECT_TRUE(absl::IsDeadlineExceeded(wait_status)) << wait_status;
  EXPECT_THAT(std::string(wait_status.message()), HasSubstr("no call from any worker for 1.5 s"));
}

TEST(LifecycleTest, AbortEndsEveryPsWithTheChiefsReason) {
  auto cluster = TestCluster::Start(2, 2);
  const dist::PlacementPlan plan = Plan(kVars, 2, 2);
  auto chief = cluster->Client(plan, 0), worker = cluster->Client(plan, 1);
  PSFLOW_ASSERT_OK(chief->Connect());
  PSFLOW_ASSERT_OK(worker->Connect());
  const Tensor w({3, 2}, 1.0f);
  PSFLOW_ASSERT_OK(chief->Initialize({{"w", &w}}, Sgd(0.1f)));
  chief->Abort("gave up on ps task 7 (127.0.0.1:9) after 120 s unreachable");
  // Workers still calling learn why the job ended (not "finished", which would exit 0)...
  const Tensor g({3, 2}, 1.0f);
  const absl::Status pushed = worker->Push({{"w", &g, nullptr}}, 0).status();
  EXPECT_TRUE(absl::IsAborted(pushed)) << pushed;
  EXPECT_THAT(std::string(pushed.message()), HasSubstr("ps task 7"));
  PSFLOW_EXPECT_OK(worker->Goodbye());
  // ...and every ps task ends with the reason, so its process exits non-zero.
  for (auto& server : cluster->servers) {
    const absl::Status s = server->Wait();
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("gave up on ps task 7"));
  }
}

TEST(LifecycleTest, PortInUseIsAnErrorNamingTheAddress) {
  auto cluster = TestCluster::Start(1, 1);
  PsServer::Options o;
  o.listen_address = cluster->cluster.ps()[0];
  auto second = PsServer::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(o.listen_address));
}

// The work queue over the wire: ps task 0 answers "not configured" until the chief configures it,
// then hands slices to workers, repeats an answer for a retried call, and gives its state.
TEST(LifecycleTest, WorkQueueCallsReachPsTaskZero) {
  auto cluster = TestCluster::Start(2, 2);
  const dist::PlacementPlan plan = Plan(kVars, 2, 2);
  auto chief = cluster->Client(plan, 0), worker = cluster->Client(plan, 1);
  PSFLOW_ASSERT_OK(chief->Connect());
  PSFLOW_ASSERT_OK(worker->Connect());
  WorkQueueCall next;
  next.fresh = true;
  auto early = worker->CallWorkQueue(next);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_FALSE(early->configured);

  WorkPlan files;
  files.files = {"/d/train-0", "/d/train-1"};
  files.slices = {{0, 0, 10}, {0, 10, kWorkSliceToEnd}, {1, 0, kWorkSliceToEnd}};
  WorkQueueCall configure;
  configure.op = WorkQueueCall::Op::kConfigure;
  configure.state_json = *WorkPlanState(files);
  configure.replace = true;
  PSFLOW_ASSERT_OK(chief->CallWorkQueue(configure).status());

  auto first = worker->CallWorkQueue(next);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->configured);
  EXPECT_EQ(first->path, "/d/train-0");
  EXPECT_EQ(first->begin, 0);
  EXPECT_EQ(first->end_offset, 10);
  next.fresh = false;
  next.seq = 1;
  auto second = worker->CallWorkQueue(next);
  auto repeated = worker->CallWorkQueue(next);
  ASSERT_TRUE(second.ok() && repeated.ok());
  EXPECT_EQ(second->slice, 1);
  EXPECT_EQ(second->end_offset, -1);
  EXPECT_EQ(repeated->slice, 1);
  EXPECT_EQ(repeated->handed, 2);
  EXPECT_EQ(repeated->holders, std::vector<int>{1});

  WorkQueueCall state;
  state.op = WorkQueueCall::Op::kState;
  auto saved = chief->CallWorkQueue(state);
  ASSERT_TRUE(saved.ok()) << saved.status();
  WorkQueue copy;
  PSFLOW_ASSERT_OK(copy.Restore(saved->state_json, true));
  EXPECT_EQ(copy.progress().handed, 2);
}

}  // namespace
}  // namespace psflow::ps
