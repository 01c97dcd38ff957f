// A large Push over a real gRPC connection on 127.0.0.1 goes in chunks on one stream
// (rpc/chunked_message.h): it arrives whole and in order, over the limit it is refused in one
// line naming its whole size, and a stream that breaks off reaches no handler.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/chunked_message.h"
#include "rpc/tensor_coding.h"
#include "rpc/test_certs.h"
#include "rpc/transport.h"

namespace psflow::rpc {
namespace {

using ::testing::HasSubstr;

// Answers every call with its header; remembers each Push's first tensor and its first non-finite
// float.
class RecordingHandler final : public Handler {
 public:
  struct Seen {
    std::vector<float> values;
    int64_t first_bad = -1;
  };
  void Handle(Method method, IncomingMessage request, Responder responder) override {
    if (method == Method::kPush && request.num_tensors() > 0) {
      Seen seen;
      seen.values.resize(static_cast<size_t>(request.num_floats(0)));
      request.CopyTo(0, seen.values.data());
      seen.first_bad = request.FirstNonFinite(0, 0, request.num_floats(0));
      absl::MutexLock lock(&mu_);
      pushes_.push_back(std::move(seen));
    }
    OutgoingMessage answer;
    answer.header = request.header();
    responder.Respond(std::move(answer));
  }
  std::vector<Seen> pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Seen> pushes_ ABSL_GUARDED_BY(mu_);
};

OutgoingMessage PushOf(const std::vector<float>& data) {
  OutgoingMessage m;
  m.header = "push header";
  OutgoingTensor t;
  t.meta.set_name("w");
  t.meta.add_shape(static_cast<int64_t>(data.size()));
  t.data = data.data();  // borrowed: CallBlocking returns after the transport let go of it
  t.num_floats = static_cast<int64_t>(data.size());
  m.tensors.push_back(std::move(t));
  return m;
}

CallOptions Options(double timeout_secs = 20) {
  CallOptions o;
  o.timeout_secs = timeout_secs;
  return o;
}

std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f - 7.0f;  // exact, distinct per element
  return v;
}

// Pushes below kChunkedMinBytes go in one message, larger ones in chunks; every float arrives in
// its place (chunks out of order would move them), and a NaN in the last chunk is found at its
// element. Other methods never go in chunks.
TEST(GrpcChunkedTest, LargePushesArriveWholeInOrder) {
  RecordingHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &handler);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeGrpcChannel(absl::StrCat("127.0.0.1:", (*server)->port()), "ps task 0", {});
  ASSERT_TRUE(channel.ok());
  const size_t small = kChunkedMinBytes / 4 - 1000, large = 3 * kChunkBytes + 12345;  // floats
  std::vector<float> data = Ramp(large);
  data.back() = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {small, large}) {
    std::vector<float> sent(data.end() - static_cast<int64_t>(n), data.end());
    auto answer = (*channel)->CallBlocking(Method::kPush, PushOf(sent), Options());
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->header(), "push header");
  }
  EXPECT_TRUE((*channel)->CallBlocking(Method::kStats, PushOf(data), Options()).ok());
  EXPECT_EQ((*server)->counters().calls_in_chunks, 1);
  const std::vector<RecordingHandler::Seen> seen = handler.pushes();
  ASSERT_EQ(seen.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const size_t n = k == 0 ? small : large;
    ASSERT_EQ(seen[k].values.size(), n);
    int64_t moved = 0;
    for (size_t i = 0; i + 1 < n; ++i) moved += seen[k].values[i] != data[large - n + i];
    EXPECT_EQ(moved, 0) << n;
    EXPECT_TRUE(std::isnan(seen[k].values.back()));
    EXPECT_EQ(seen[k].first_bad, static_cast<int64_t>(n - 1));
  }
}

// Several Pushes in chunks in flight at once from Call (completed on the shared completion
// thread, which writes each stream's next chunk as the previous one's write completes), beside a
// blocking one: each arrives whole.
TEST(GrpcChunkedTest, SeveralStreamsInFlightAtOnce) {
  RecordingHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &handler);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeGrpcChannel(absl::StrCat("127.0.0.1:", (*server)->port()), "ps task 0", {});
  ASSERT_TRUE(channel.ok());
  ASSERT_TRUE((*channel)->CallBlocking(Method::kPush, PushOf({1.0f}), Options()).ok());  // connected
  constexpr int kCalls = 4;
  std::vector<std::vector<float>> data;
  for (int k = 0; k < kCalls + 1; ++k) {
    data.push_back(Ramp(kChunkedMinBytes / 4 + 1000 * k));
    data.back()[0] = static_cast<float>(k);
  }
  absl::Mutex mu;
  int done = 0;
  std::vector<absl::Status> statuses(kCalls);
  for (int k = 0; k < kCalls; ++k) {
    (*channel)->Call(Method::kPush, PushOf(data[k]), Options(), [&, k](absl::StatusOr<IncomingMessage> r) {
      absl::MutexLock lock(&mu);
      statuses[k] = r.status();
      ++done;
    });
  }
  EXPECT_TRUE((*channel)->CallBlocking(Method::kPush, PushOf(data[kCalls]), Options()).ok());
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* d) { return *d == kCalls; }, &done));
  }
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ((*server)->counters().calls_in_chunks, kCalls + 1);
  const std::vector<RecordingHandler::Seen> seen = handler.pushes();
  ASSERT_EQ(seen.size(), kCalls + 2u);
  std::vector<bool> found(kCalls + 1, false);
  for (size_t i = 1; i < seen.size(); ++i) {
    const int k = static_cast<int>(seen[i].values[0]);
    ASSERT_TRUE(k >= 0 && k <= kCalls);
    EXPECT_EQ(seen[i].values, data[k]) << k;
    found[k] = true;
  }
  for (int k = 0; k <= kCalls; ++k) EXPECT_TRUE(found[k]) << k;
}

// A server with a smaller limit refuses a Push in chunks in one line naming the whole message's
// size (not a chunk's), and still answers afterwards.
TEST(GrpcChunkedTest, OverTheServersLimitIsRefusedInOneLine) {
  RecordingHandler handler;
  TransportOptions limited;
  limited.max_message_bytes = 1 << 20;
  auto server = StartGrpcServer("127.0.0.1:0", limited, &handler);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string peer = absl::StrCat("ps task 0 (127.0.0.1:", (*server)->port(), ")");
  auto channel = MakeGrpcChannel(absl::StrCat("127.0.0.1:", (*server)->port()), peer, {});
  ASSERT_TRUE(channel.ok());
  const std::vector<float> big(size_t{5} << 18);  // 5 MiB
  auto refused = (*channel)->CallBlocking(Method::kPush, PushOf(big), Options());
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  const std::string message(refused.status().message());
  EXPECT_THAT(message, HasSubstr(peer + ": Push refused: a message of 5.0 MiB is over the 1 MiB limit"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_TRUE((*channel)->CallBlocking(Method::kPush, PushOf(std::vector<float>(1000)), Options()).ok());
  EXPECT_EQ(handler.pushes().size(), 1u);
}

// A stream that breaks off after its first chunks (the client cancels it) reaches no handler,
// and the server goes on answering.
TEST(GrpcChunkedTest, AStreamBrokenOffMidPushReachesNoHandler) {
  RecordingHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &handler);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  const std::vector<float> data = Ramp(3 * kChunkBytes / 4);
  std::vector<grpc::ByteBuffer> chunks = CutIntoChunks(EncodeMessage(PushOf(data)), kChunkBytes);
  ASSERT_EQ(chunks.size(), 4u);
  {
    grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::CompletionQueue cq;
    grpc::ClientContext context;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream =
        stub.PrepareCall(&context, "/psflow.wire.Ps/PushChunks", &cq);
    void* tag = nullptr;
    bool ok = false;
    stream->StartCall(reinterpret_cast<void*>(1));
    ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
    for (int k = 0; k < 2; ++k) {  // two of the four chunks
      stream->Write(chunks[k], reinterpret_cast<void*>(2));
      ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
    }
    context.TryCancel();
    grpc::Status status;
    stream->Finish(&status, reinterpret_cast<void*>(3));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }
  auto channel = MakeGrpcChannel(address, "ps task 0", {});
  ASSERT_TRUE(channel.ok());
  EXPECT_TRUE((*channel)->CallBlocking(Method::kPush, PushOf(data), Options()).ok());
  (*server)->Shutdown(5);  // every call of the server has ended
  const std::vector<RecordingHandler::Seen> seen = handler.pushes();
  ASSERT_EQ(seen.size(), 1u);  // the whole push only
  EXPECT_EQ(seen[0].values, data);
}

// A Push in chunks whose deadline passes on the way fails in one line naming the peer and the
// method; the handler never sees part of it.
TEST(GrpcChunkedTest, ADeadlineOnTheWayFailsTheCallInOneLine) {
  RecordingHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &handler);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeGrpcChannel(absl::StrCat("127.0.0.1:", (*server)->port()), "ps task 0", {});
  ASSERT_TRUE(channel.ok());
  const std::vector<float> data = Ramp(size_t{16} << 20);  // 64 MiB: more than 1 ms on any loopback
  auto late = (*channel)->CallBlocking(Method::kPush, PushOf(data), Options(0.001));
  ASSERT_TRUE(absl::IsDeadlineExceeded(late.status())) << late.status();
  const std::string message(late.status().message());
  EXPECT_THAT(message, HasSubstr("ps task 0: Push got no answer within 0.001 s"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
  (*server)->Shutdown(5);
  for (const RecordingHandler::Seen& s : handler.pushes()) EXPECT_EQ(s.values, data);  // whole, if at all
}

// Over TLS with the cluster secret: the secret travels in the metadata sent with the first chunk;
// a wrong one is refused before any chunk reaches a handler.
TEST(GrpcChunkedTest, TlsAndTheClusterSecret) {
  auto temp = [](const std::string& name, const char* text) {
    const std::string path =
        (std::filesystem::temp_directory_path() / absl::StrCat("psflow_chunked_", getpid(), "_", name)).string();
    std::ofstream(path) << text;
    return path;
  };
  TransportOptions secured;
  secured.secret = "s3cret";
  secured.tls_cert = temp("task.pem", testing::kTestTaskCertPem);
  secured.tls_key = temp("task.key", testing::kTestTaskKeyPem);
  secured.tls_ca = temp("ca.pem", testing::kTestCaPem);
  RecordingHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", secured, &handler);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  const std::vector<float> data = Ramp(3 * kChunkBytes / 4 + 5);
  TransportOptions wrong = secured;
  wrong.secret = "guess";
  auto refused = (*MakeGrpcChannel(address, "ps task 0", wrong))->CallBlocking(Method::kPush, PushOf(data), Options());
  EXPECT_TRUE(absl::IsUnauthenticated(refused.status())) << refused.status();
  auto good = (*MakeGrpcChannel(address, "ps task 0", secured))->CallBlocking(Method::kPush, PushOf(data), Options());
  EXPECT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*server)->counters().calls_in_chunks, 1);
  EXPECT_EQ((*server)->counters().calls_unauthenticated, 1);
  ASSERT_EQ(handler.pushes().size(), 1u);
  EXPECT_EQ(handler.pushes()[0].values, data);
  for (const std::string& f : {secured.tls_cert, secured.tls_key, secured.tls_ca}) std::filesystem::remove(f);
}

}  // namespace
}  // namespace psflow::rpc
