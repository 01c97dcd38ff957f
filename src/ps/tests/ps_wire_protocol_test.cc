// A worker and a ps task of different psflow builds (wire protocols, ps/common/wire_config.h)
// refuse each other at Hello in one line naming both versions, at once: a ps refuses a worker that
// speaks another version (or none: a build from before the check), and a worker refuses a ps that
// answers with another (an older ps ignores the field, so the worker must check).
#include <chrono>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/psflow.pb.h"
#include "ps/common/wire_config.h"
#include "ps/tests/ps_test_util.h"
#include "rpc/transport.h"

namespace psflow::ps {
namespace {

using ::testing::HasSubstr;
using testing::Plan;
using testing::TestCluster;

TEST(WireProtocolTest, APsRefusesAWorkerOfAnotherBuild) {
  auto cluster = TestCluster::Start(1, 1);
  ASSERT_NE(cluster, nullptr);
  auto channel = rpc::MakeGrpcChannel(cluster->cluster.ps()[0], "ps task 0", {});
  ASSERT_TRUE(channel.ok()) << channel.status();
  wire::HelloRequest old;  // as a build before the check sends it: no wire_protocol
  old.set_worker_index(1);
  old.set_client_id(7);
  old.set_cluster_fingerprint(cluster->cluster.Fingerprint());
  old.set_cluster_text(cluster->cluster.ToString());
  rpc::CallOptions options;
  options.timeout_secs = 20;
  auto answer = (*channel)->CallBlocking(rpc::Method::kHello, rpc::OutgoingMessage::Of(old), options);
  ASSERT_TRUE(absl::IsFailedPrecondition(answer.status())) << answer.status();
  const std::string message(answer.status().message());
  EXPECT_THAT(message, HasSubstr("worker 1 speaks psflow wire protocol 0 but this ps task speaks"));
  EXPECT_THAT(message, HasSubstr("start every task from the same psflow build"));
  EXPECT_EQ(cluster->servers[0]->Stats().connected_workers, 0);

  wire::HelloRequest current = old;  // the same worker of this build is welcome
  current.set_wire_protocol(kWireProtocol);
  answer = (*channel)->CallBlocking(rpc::Method::kHello, rpc::OutgoingMessage::Of(current), options);
  ASSERT_TRUE(answer.ok()) << answer.status();
  wire::HelloResponse response;
  ASSERT_TRUE(answer->ParseHeader(&response).ok());
  EXPECT_EQ(response.wire_protocol(), kWireProtocol);
}

// What a ps of a build before the check answers to Hello: no wire_protocol.
class OldPs : public rpc::Handler {
 public:
  void Handle(rpc::Method method, rpc::IncomingMessage, rpc::Responder responder) override {
    if (method != rpc::Method::kHello) return responder.Respond(absl::UnimplementedError("not in this test"));
    wire::HelloResponse hello;
    hello.set_ps_task(0);
    responder.Respond(rpc::OutgoingMessage::Of(hello));
  }
};

TEST(WireProtocolTest, AWorkerRefusesAPsOfAnotherBuildAtOnce) {
  OldPs old;
  absl::StatusOr<testing::LoopbackPs> ps = testing::ServeAsPs(&old);
  ASSERT_TRUE(ps.ok()) << ps.status();
  PsClient::Options o;
  o.cluster = ps->cluster;
  o.plan = Plan({{"w", {4}}}, 1);
  o.connect_timeout_secs = 120;  // a refusal does not wait for this
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = (*client)->Connect();
  ASSERT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("speaks psflow wire protocol 0 but this worker speaks"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("start every task from the same psflow build"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << "the refusal was retried";
  ps->server->Shutdown(1);
}

}  // namespace
}  // namespace psflow::ps
