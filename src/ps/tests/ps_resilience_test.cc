// Retries are safe and sized (ps/server/push_dedup.h, ps/client/call_deadline.h), over real in-process ps
// servers and real gRPC: a push sent twice with the same client id and sequence number is applied
// once and both copies get the first answer — in async mode, and in sync mode with the duplicate
// arriving while the original is held for its quorum (it never counts twice) and after it. Also
// the deadline of a call that moves many bytes, and an Initialize too big for its base deadline.
#include <limits>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/psflow.pb.h"
#include "ps/client/call_deadline.h"
#include "ps/server/push_dedup.h"
#include "ps/tests/ps_test_util.h"
#include "rpc/transport.h"

namespace psflow::ps {
namespace {

using testing::Filled;
using ::testing::HasSubstr;
using testing::Plan;
using testing::Sgd;
using testing::TestCluster;

std::vector<float> V(const Tensor& t) { return {t.data(), t.data() + t.size()}; }

// A raw push of gradient `g` for variable "w" (one shard on one ps), with its dedupe ids.
rpc::OutgoingMessage RawPush(const Tensor& g, int worker, uint64_t client_id, uint64_t seq, int64_t step_tag,
                             bool pull = false) {
  wire::PushRequest header;
  header.set_worker_index(worker);
  header.set_step_tag(step_tag);
  header.set_client_id(client_id);
  header.set_seq(seq);
  if (pull) header.add_pull_shards("w");
  rpc::OutgoingMessage message = rpc::OutgoingMessage::Of(header);
  rpc::OutgoingTensor t;
  t.meta.set_name("w");
  for (int64_t d : g.shape()) t.meta.add_shape(d);
  t.data = g.data();
  t.num_floats = g.size();
  message.tensors.push_back(std::move(t));
  return message;
}

// The answer to a push: its step and stale flag, or the call's error.
struct Answer {
  absl::Status status;
  int64_t step = -1;
  bool stale = false;
  std::vector<float> pulled;
};

Answer Decode(absl::StatusOr<rpc::IncomingMessage> r) {
  Answer a;
  a.status = r.status();
  if (!r.ok()) return a;
  wire::PushResponse header;
  a.status = r->ParseHeader(&header);
  a.step = header.step();
  a.stale = header.stale();
  if (r->num_tensors() == 1) {
    a.pulled.resize(static_cast<size_t>(r->num_floats(0)));
    r->CopyTo(0, a.pulled.data());
  }
  return a;
}

struct Fixture {
  std::unique_ptr<TestCluster> cluster;
  dist::PlacementPlan plan = Plan({{"w", {3, 2}}}, 1);
  std::unique_ptr<PsClient> chief;
  std::unique_ptr<rpc::ClientChannel> raw;  // pushes with ids chosen by the test
  Tensor w = Filled({3, 2}, 1.0f, 0.5f);

  explicit Fixture(const TrainingConfig& config, int workers = 2) {
    cluster = TestCluster::Start(1, workers);
    chief = cluster->Client(plan, 0);
    EXPECT_TRUE(chief->Connect().ok());
    EXPECT_TRUE(chief->Initialize({{"w", &w}}, config).ok());
    auto channel = rpc::MakeGrpcChannel(cluster->cluster.ps()[0], "ps task 0", {});
    EXPECT_TRUE(channel.ok()) << channel.status();
    raw = *std::move(channel);
  }

  Answer Push(const rpc::OutgoingMessage& message) {
    rpc::CallOptions o;
    o.timeout_secs = 20;
    return Decode(raw->CallBlocking(rpc::Method::kPush, message, o));
  }
  void PushAsync(const rpc::OutgoingMessage& message, Answer* out, absl::Notification* done) {
    rpc::CallOptions o;
    o.timeout_secs = 20;
    raw->Call(rpc::Method::kPush, message, o, [out, done](absl::StatusOr<rpc::IncomingMessage> r) {
      *out = Decode(std::move(r));
      done->Notify();
    });
  }
  Tensor Values() {
    Tensor got({3, 2});
    EXPECT_TRUE(chief->Pull({{"w", &got}}).ok());
    return got;
  }
};

TEST(DeadlineTest, FollowsTheBytes) {
  // 30 s base, 156 MB (vgg19's parameters) at the 1 MiB/s floor: 30 + 148.8 s.
  EXPECT_NEAR(AttemptDeadlineSecs(30, 156'000'000), 30 + 156e6 / 1048576.0, 1e-9);
  EXPECT_EQ(AttemptDeadlineSecs(30, 0), 30);
  EXPECT_EQ(AttemptDeadlineSecs(2, 1 << 20), 3);
}

TEST(DedupTest, AsyncDuplicateIsAnsweredWithTheFirstAnswerAndNotAppliedAgain) {
  Fixture f(Sgd(0.5f));
  const Tensor g = Filled({3, 2}, 1.0f, 1.0f);
  const rpc::OutgoingMessage push = RawPush(g, 1, /*client_id=*/77, /*seq=*/1, 0, /*pull=*/true);
  const Answer first = f.Push(push);
  PSFLOW_ASSERT_OK(first.status);
  EXPECT_EQ(first.step, 1);
  const Answer again = f.Push(push);
  PSFLOW_ASSERT_OK(again.status);
  EXPECT_EQ(again.step, 1);  // the first answer, not step 2
  EXPECT_EQ(again.pulled, first.pulled);
  Tensor expected = f.w;
  for (int64_t i = 0; i < expected.size(); ++i) expected[i] -= 0.5f * g[i];  // applied once
  EXPECT_EQ(V(f.Values()), V(expected));
  EXPECT_EQ(first.pulled, V(expected));
  // The next push of the client, and another client's push with the same number, are new.
  EXPECT_EQ(f.Push(RawPush(g, 1, 77, 2, 1)).step, 2);
  EXPECT_EQ(f.Push(RawPush(g, 2, 78, 1, 1)).step, 3);
  // A client id of 0 (an old client) is never deduplicated.
  EXPECT_EQ(f.Push(RawPush(g, 1, 0, 1, 1)).step, 4);
  EXPECT_EQ(f.Push(RawPush(g, 1, 0, 1, 1)).step, 5);
}

// A push whose first arrival comes after more than the window of newer pushes of its client (a
// slice's retry overtaken by the later slices) is applied; a duplicate of an answered push that
// old is still refused, not applied again.
TEST(DedupTest, AFirstArrivalBehindMoreThanTheWindowIsAppliedAndAnOldDuplicateIsNot) {
  Fixture f(Sgd(0.5f));
  const Tensor g = Filled({3, 2}, 1.0f, 1.0f);
  constexpr uint64_t kClient = 93;
  const int newer = PushDedup::kWindow + 10;
  for (int i = 0; i < newer; ++i) PSFLOW_ASSERT_OK(f.Push(RawPush(g, 1, kClient, 2 + i, i)).status);
  const Answer late = f.Push(RawPush(g, 1, kClient, 1, newer));
  PSFLOW_ASSERT_OK(late.status);
  EXPECT_EQ(late.step, newer + 1);
  const Answer again = f.Push(RawPush(g, 1, kClient, 2, 0));  // answered long ago
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status)) << again.status;
  EXPECT_THAT(std::string(again.status.message()), HasSubstr("push 2 of this client was applied before"));
  Tensor expected = f.w;  // newer + 1 pushes applied, each once
  for (int n = 0; n < newer + 1; ++n) {
    for (int64_t i = 0; i < expected.size(); ++i) expected[i] -= 0.5f * g[i];
  }
  EXPECT_EQ(V(f.Values()), V(expected));
}

// Sequence numbers run on past the bits' window (each slot reused for a number kSeenSeqs newer): every
// new push is applied once, a recent duplicate answered with its first answer, and one older than the
// window refused without being applied.
TEST(DedupTest, PushesPastTheBitsWindowAreNewAndOlderOnesAreRefused) {
  Fixture f(Sgd(0.5f));
  const Tensor g = Filled({3, 2}, 1.0f, 1.0f);
  constexpr uint64_t kClient = 94;
  const uint64_t last = PushDedup::kSeenSeqs + 70;
  for (uint64_t seq = 1; seq <= last; ++seq) {
    const Answer a = f.Push(RawPush(g, 1, kClient, seq, static_cast<int64_t>(seq) - 1));
    ASSERT_TRUE(a.status.ok()) << "push " << seq << ": " << a.status;
    ASSERT_EQ(a.step, static_cast<int64_t>(seq));
  }
  const Answer recent = f.Push(RawPush(g, 1, kClient, last, 0));
  PSFLOW_ASSERT_OK(recent.status);
  EXPECT_EQ(recent.step, static_cast<int64_t>(last));  // the first answer
  const Answer old = f.Push(RawPush(g, 1, kClient, 3, 0));
  EXPECT_TRUE(absl::IsFailedPrecondition(old.status)) << old.status;
  EXPECT_THAT(std::string(old.status.message()), HasSubstr("cannot tell whether it was applied"));
  EXPECT_EQ(f.Push(RawPush(g, 1, kClient, last + 1, 0)).step, static_cast<int64_t>(last + 1));
}

TEST(DedupTest, RefusedPushIsRefusedAgainAndNeverApplied) {
  Fixture f(Sgd(0.5f));
  Tensor bad = Filled({3, 2}, 1.0f, 1.0f);
  bad[2] = std::numeric_limits<float>::quiet_NaN();
  const rpc::OutgoingMessage push = RawPush(bad, 1, 91, 1, 0);
  const Answer first = f.Push(push), again = f.Push(push);
  EXPECT_TRUE(absl::IsInvalidArgument(first.status)) << first.status;
  EXPECT_EQ(again.status, first.status);
  EXPECT_EQ(V(f.Values()), V(f.w));
}

TrainingConfig SyncSgd(float lr) {
  TrainingConfig c = Sgd(lr);
  c.sync = true;
  c.replicas_to_aggregate = 2;
  c.total_num_replicas = 2;
  c.sync_timeout_secs = 60;
  return c;
}

TEST(DedupTest, SyncDuplicateHeldForTheQuorumWaitsForTheSameOutcomeAndCountsOnce) {
  Fixture f(SyncSgd(1.0f));
  const Tensor g0 = Filled({3, 2}, 1.0f, 1.0f), g1 = Filled({3, 2}, 3.0f, -1.0f);
  // Worker 0's push is held for the quorum of 2; its retry arrives while it is held.
  Answer original, retry;
  absl::Notification original_done, retry_done;
  f.PushAsync(RawPush(g0, 0, 500, 1, 0), &original, &original_done);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  f.PushAsync(RawPush(g0, 0, 500, 1, 0), &retry, &retry_done);
  // Were the retry counted, the quorum of 2 would be complete with worker 0 alone.
  EXPECT_FALSE(original_done.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
  EXPECT_FALSE(retry_done.HasBeenNotified());
  const Answer other = f.Push(RawPush(g1, 1, 600, 1, 0));
  ASSERT_TRUE(original_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(retry_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (const Answer* a : std::vector<const Answer*>{&original, &retry, &other}) {
    PSFLOW_EXPECT_OK(a->status);
    EXPECT_EQ(a->step, 1);
    EXPECT_FALSE(a->stale);
  }
  // The mean of worker 0's and worker 1's gradients, applied once.
  Tensor expected = f.w;
  for (int64_t i = 0; i < expected.size(); ++i) expected[i] -= (g0[i] + g1[i]) / 2;
  EXPECT_EQ(V(f.Values()), V(expected));
  // A retry after the step: the first answer (step 1, not stale), nothing applied, the step stays.
  const Answer late = f.Push(RawPush(g0, 0, 500, 1, 0));
  PSFLOW_EXPECT_OK(late.status);
  EXPECT_EQ(late.step, 1);
  EXPECT_FALSE(late.stale);
  EXPECT_EQ(V(f.Values()), V(expected));
  auto stats = f.chief->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ((*stats)[0].global_step, 1);
  EXPECT_EQ((*stats)[0].stale_gradients_dropped, 0);
}

TEST(DedupTest, PsClientPushesCarryIdsSoTheirRetriesAreSafe) {
  // Two pushes from one PsClient are two updates (distinct numbers), whatever their content.
  Fixture f(Sgd(0.5f));
  const Tensor g = Filled({3, 2}, 1.0f, 0.0f);
  auto a = f.chief->Push({{"w", &g, nullptr}}, 0);
  auto b = f.chief->Push({{"w", &g, nullptr}}, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->global_step, 1);
  EXPECT_EQ(b->global_step, 2);
}

// The fault-recovery race of DiskTablesFaultTest.AKilledPsRestartedOnItsTableDirRestores...: a worker's
// push of step k, computed before the chief restored the ps tasks to a checkpoint, reached a task
// after the restore (its retry into the restarted task, or a late call) and joined the restored
// step ("tags newer than the step join it"), so the steps trained again were not the job's. A push
// names the model its values came from; one of a model the task no longer holds is refused as
// "not initialized" (the worker waits for the chief and pulls), and the push after the pull counts.
TEST(RestoreTest, APushComputedBeforeARestoreIsRefusedAfterItAndTheOneAfterAPullCounts) {
  TrainingConfig config = SyncSgd(1.0f);
  config.replicas_to_aggregate = 1;  // (an accepted push is applied at once, not held)
  Fixture f(config);
  std::unique_ptr<PsClient> worker = f.cluster->Client(f.plan, 1);
  PSFLOW_ASSERT_OK(worker->Connect());
  PSFLOW_ASSERT_OK(worker->WaitForInitialization(10));
  const Tensor g = Filled({3, 2}, 1.0f, 0.0f), before = Filled({3, 2}, 100.0f, 0.0f);
  Tensor values({3, 2});
  for (int64_t step = 0; step < 3; ++step) {
    PSFLOW_ASSERT_OK(worker->Pull({{"w", &values}}).status());
    auto pushed = worker->Push({{"w", &g, nullptr}}, step);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    ASSERT_EQ(pushed->global_step, step + 1);
  }
  // The chief restores step 0 (the initial values) while the worker's push of step 4 is on its way.
  PSFLOW_ASSERT_OK(f.chief->Initialize({{"w", &f.w}}, config));
  auto late = worker->Push({{"w", &before, nullptr}}, 3);
  ASSERT_FALSE(late.ok()) << "a push computed before the restore was applied to the restored step "
                          << late->global_step;
  EXPECT_TRUE(IsPsRestarted(late.status())) << late.status();
  EXPECT_EQ(V(f.Values()), V(f.w));  // nothing of it applied
  // The worker pulls the restored values and trains step 1 again: counted.
  auto pulled = worker->Pull({{"w", &values}});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(*pulled, 0);
  auto redo = worker->Push({{"w", &g, nullptr}}, *pulled);
  ASSERT_TRUE(redo.ok()) << redo.status();
  EXPECT_EQ(redo->global_step, 1);
  EXPECT_FALSE(redo->stale);
  Tensor expected = f.w;
  for (int64_t i = 0; i < expected.size(); ++i) expected[i] -= g[i];
  EXPECT_EQ(V(f.Values()), V(expected));
}

TEST(DedupTest, InitializeTooBigForItsBaseDeadlineSucceeds) {
  // 24 MB of parameters with a 0.2 s base deadline: gRPC moves it well within the 24 s its size
  // adds, while a fixed 0.2 s deadline (before deadlines followed the bytes) failed it.
  auto cluster = TestCluster::Start(1, 1);
  const dist::PlacementPlan plan = Plan({{"big", {3000, 2000}}}, 1);
  PsClient::Options o;
  o.cluster = cluster->cluster;
  o.plan = plan;
  o.rpc_timeout_secs = 0.2;
  o.ps_unavailable_timeout_secs = 0.2;
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  PSFLOW_ASSERT_OK((*client)->Connect());
  const Tensor big = Filled({3000, 2000}, 0.0f, 1e-6f);
  PSFLOW_ASSERT_OK((*client)->Initialize({{"big", &big}}, Sgd(0.1f)));
  Tensor back({3000, 2000});
  auto step = (*client)->Pull({{"big", &back}});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(V(back), V(big));
}

TEST(FailureTest, EveryWorkerLeavingOneOfThemFailedEndsThePsAtOnce) {
  auto cluster = TestCluster::Start(1, 2);
  const dist::PlacementPlan plan = Plan({{"w", {3, 2}}}, 1);
  auto chief = cluster->Client(plan, 0), worker = cluster->Client(plan, 1);
  PSFLOW_ASSERT_OK(chief->Connect());
  PSFLOW_ASSERT_OK(worker->Connect());
  const Tensor w({3, 2}, 1.0f);
  PSFLOW_ASSERT_OK(chief->Initialize({{"w", &w}}, Sgd(0.1f)));
  PSFLOW_ASSERT_OK(worker->Goodbye("gave up on ps task 1 (127.0.0.1:9): Push got no answer in 30 s"));
  PSFLOW_ASSERT_OK(chief->Goodbye());
  const absl::Status s = cluster->servers[0]->Wait();  // no --worker_timeout_secs configured: not a timeout
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("worker 1 gave up: gave up on ps task 1"));
}

}  // namespace
}  // namespace psflow::ps
