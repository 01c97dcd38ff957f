// A sliced push (--transfer_slice_bytes) whose one part stays unanswered: the rest of the ps
// task's parts go on, but never more than kSliceSpan (32, ps/client/slice_pipe.cc) past the first
// one not answered, so a part held up (a retry in back-off, a slow answer) cannot be overtaken by
// more of the task's pushes than its ps remembers; once the answer comes, the push completes whole.
// Through a real ps behind a real gRPC proxy (in this test) that holds one push's answer.
#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/psflow.pb.h"
#include "ps/tests/ps_test_util.h"
#include "rpc/transport.h"

namespace psflow::ps {
namespace {

using testing::Filled;
using testing::LoopbackPs;
using testing::Plan;
using testing::ServeAsPs;
using testing::Sgd;
using testing::TestCluster;

// The floats of `m`, copied into a message that owns them (a proxy forwards what it received).
rpc::OutgoingMessage Copy(const rpc::IncomingMessage& m) {
  rpc::OutgoingMessage out;
  out.header = m.header();
  for (int i = 0; i < m.num_tensors(); ++i) {
    auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(m.num_floats(i)));
    m.CopyTo(i, values->data());
    rpc::OutgoingTensor t;
    t.meta = m.meta(i);
    t.data = values->data();
    t.num_floats = m.num_floats(i);
    t.owner = std::move(values);
    out.tensors.push_back(std::move(t));
  }
  return out;
}

// Forwards every call to one ps task; the answer of the `hold`-th push (0-based, in arrival
// order) is kept until Release(). Counts the pushes that arrived after the held one meanwhile.
class HoldingProxy : public rpc::Handler {
 public:
  HoldingProxy(std::unique_ptr<rpc::ClientChannel> ps, int hold) : ps_(std::move(ps)), hold_(hold) {}

  void Handle(rpc::Method method, rpc::IncomingMessage request, rpc::Responder responder) override {
    bool held = false;
    if (method == rpc::Method::kPush) {
      absl::MutexLock lock(&mu_);
      held = pushes_++ == hold_;
      if (!held && held_seen_ && !released_) ++overtaking_;
    }
    auto shared = std::make_shared<rpc::Responder>(std::move(responder));
    rpc::CallOptions options;
    options.timeout_secs = 60;
    ps_->Call(method, Copy(request), options, [this, shared, held](absl::StatusOr<rpc::IncomingMessage> answer) {
      absl::StatusOr<rpc::OutgoingMessage> reply =
          answer.ok() ? absl::StatusOr<rpc::OutgoingMessage>(Copy(*answer)) : answer.status();
      if (held) {
        absl::MutexLock lock(&mu_);
        held_seen_ = true;
        held_reply_ = std::move(reply);
        held_responder_ = std::move(*shared);
        return;
      }
      shared->Respond(std::move(reply));
    });
  }

  // Waits (up to 20 s) for the held push's answer, then until no push arrived for `quiet` (or
  // `enough` overtook it); answers the held push; returns how many pushes overtook it.
  int ReleaseWhenQuiet(absl::Duration quiet, int enough) {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&held_seen_), absl::Seconds(20))) << "the held push's answer";
    for (int last = -1; last != overtaking_ && overtaking_ < enough;) {
      last = overtaking_;
      auto moved = [this, last]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return overtaking_ != last; };
      mu_.AwaitWithTimeout(absl::Condition(&moved), quiet);
    }
    released_ = true;
    held_responder_.Respond(std::move(held_reply_));
    return overtaking_;
  }

 private:
  std::unique_ptr<rpc::ClientChannel> ps_;
  const int hold_;
  absl::Mutex mu_;
  int pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int overtaking_ ABSL_GUARDED_BY(mu_) = 0;
  bool held_seen_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<rpc::OutgoingMessage> held_reply_ ABSL_GUARDED_BY(mu_);
  rpc::Responder held_responder_ ABSL_GUARDED_BY(mu_);
};

TEST(SliceSpanTest, AHeldPartIsOvertakenByAtMostTheSpanAndThePushAppliesWhole) {
  auto cluster = TestCluster::Start(1, 1);
  ASSERT_NE(cluster, nullptr);
  auto to_ps = rpc::MakeGrpcChannel(cluster->cluster.ps()[0], "ps task 0", {});
  ASSERT_TRUE(to_ps.ok()) << to_ps.status();
  constexpr int kHeld = 3;  // a part in the middle of the shard (not its first nor its last)
  HoldingProxy proxy(*std::move(to_ps), kHeld);
  absl::StatusOr<LoopbackPs> through_proxy = ServeAsPs(&proxy);
  ASSERT_TRUE(through_proxy.ok()) << through_proxy.status();

  PsClient::Options o;
  o.cluster = through_proxy->cluster;
  o.plan = Plan({{"w", {64, 8}}}, 1);
  o.transfer_slice_bytes = 8;  // 2 floats: 256 parts in one shard
  o.rpc_timeout_secs = 60;
  o.connect_timeout_secs = 5;
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Connect().ok());
  const Tensor w = Filled({64, 8}, 0.5f, 0.01f);
  ASSERT_TRUE((*client)->Initialize({{"w", &w}}, Sgd(1.0f)).ok());
  Tensor vw({64, 8});
  std::unique_ptr<SlicePulls> slices = (*client)->PullBackSlices({{"w", &vw}});
  ASSERT_NE(slices, nullptr);
  const Tensor gw = Filled({64, 8}, -0.25f, 0.003f);

  absl::StatusOr<PushResult> result = absl::UnknownError("not run");
  std::thread pusher([&] {
    std::unique_ptr<PushStream> stream = (*client)->StartPush(0);
    stream->Send({{"w", &gw, nullptr}});
    result = stream->Finish({}, {});
  });
  // Without the span, every part but the shard's last (which waits for all earlier answers) would
  // overtake the held one: 256 - 1 - kHeld - 1.
  const int overtaking = proxy.ReleaseWhenQuiet(absl::Seconds(1), 256 - kHeld - 2);
  pusher.join();
  EXPECT_GE(overtaking, 1) << "the other parts wait for a held one only within the span";
  EXPECT_LE(overtaking, 31) << "parts left more than 32 past the first one unanswered";
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(slices->TakeStarted(), std::vector<int>{0});
  slices->Wait(0);
  ASSERT_TRUE(slices->Settle().ok());
  for (int64_t i = 0; i < w.size(); ++i) ASSERT_EQ(vw[i], w[i] - gw[i]) << i;  // applied once, whole
  through_proxy->server->Shutdown(1);
}

}  // namespace
}  // namespace psflow::ps
