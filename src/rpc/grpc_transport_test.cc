// The gRPC transport on its own, over 127.0.0.1: tensors through a real connection, answers held
// and given later from another thread, deadlines, the cluster secret and TLS.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/tensor_coding.h"
#include "rpc/test_certs.h"
#include "rpc/test_handler.h"
#include "rpc/transport.h"

namespace psflow::rpc {
namespace {

// As every psflow process does at start: the tests cover the tuned allocator.
const bool kTuned = (TuneAllocatorForLargeMessages(), true);

using ::testing::HasSubstr;

// Every call answered at once with its tensors doubled, except WaitInitialized, held until ReleaseHeld().
class TestHandler final : public testing::DoublingHandler {
 public:
  TestHandler() : DoublingHandler(Method::kWaitInitialized) {}
};

CallOptions Options(double timeout_secs = 10) {
  CallOptions o;
  o.timeout_secs = timeout_secs;
  return o;
}

TEST(GrpcTransportTest, TensorsTravelBothWays) {
  TestHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &handler);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeGrpcChannel(absl::StrCat("127.0.0.1:", (*server)->port()), "ps task 0", {});
  ASSERT_TRUE(channel.ok());
  for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{70000}, int64_t{1} << 21}) {
    std::vector<float> data(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(i % 1000) - 0.5f;
    OutgoingMessage request;
    request.header = "header bytes";
    OutgoingTensor t;
    t.meta.set_name("w");
    t.meta.add_shape(n);
    t.data = data.data();  // borrowed: CallBlocking returns after the transport let go of it
    t.num_floats = n;
    request.tensors.push_back(t);
    for (bool pull : {false, true}) {
      CallOptions o = Options();
      o.pull_direction = pull;
      auto response = (*channel)->CallBlocking(Method::kStats, request, o);
      ASSERT_TRUE(response.ok()) << response.status();
      EXPECT_EQ(response->header(), "header bytes");
      ASSERT_EQ(response->num_tensors(), 1);
      std::vector<float> got(static_cast<size_t>(n));
      response->CopyTo(0, got.data());
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) wrong += got[i] != 2 * data[i];
      EXPECT_EQ(wrong, 0) << n;
    }
  }
  const ServerCounters counters = (*server)->counters();
  EXPECT_GT(counters.bytes_in, 2 * 4 * (int64_t{1} << 21));
  EXPECT_GT(counters.bytes_out, 2 * 4 * (int64_t{1} << 21));
}

// Several tensors per message, of sizes on both sides of the inline threshold (copied into the
// header slice below it, zero-copy slices above) and of the 16 MiB read buffers, both directions:
// every value arrives in place, read whole (CopyTo) and run by run (ForEachRun).
TEST(GrpcTransportTest, ManySizesRoundTripThroughZeroCopySlices) {
  ASSERT_TRUE(kTuned);
  TestHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &handler);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeGrpcChannel(absl::StrCat("127.0.0.1:", (*server)->port()), "ps task 0", {});
  ASSERT_TRUE(channel.ok());
  constexpr int64_t kInline = static_cast<int64_t>(kInlineTensorBytes / sizeof(float));
  const std::vector<std::vector<int64_t>> messages = {
      {1, kInline - 1, kInline, kInline + 1},
      {3, (int64_t{1} << 18) + 3, 5, kInline + 7},
      {(int64_t{16} << 20) / 4 + 5, 1},
      {(int64_t{4} << 20) / 4 - 1, (int64_t{4} << 20) / 4 + 1, 2},
  };
  for (const std::vector<int64_t>& sizes : messages) {
    std::vector<std::vector<float>> data;
    OutgoingMessage request;
    request.header = "sizes";
    for (size_t k = 0; k < sizes.size(); ++k) {
      data.emplace_back(static_cast<size_t>(sizes[k]));
      for (int64_t i = 0; i < sizes[k]; ++i) data[k][i] = static_cast<float>((i * 7 + k) % 100003) * 0.5f - 3.0f;
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      OutgoingTensor t;
      t.meta.set_name(absl::StrCat("t", k));
      t.meta.add_shape(sizes[k]);
      t.data = data[k].data();
      t.num_floats = sizes[k];
      request.tensors.push_back(std::move(t));
    }
    for (bool pull : {false, true}) {
      CallOptions o = Options(60);
      o.pull_direction = pull;
      auto response = (*channel)->CallBlocking(Method::kStats, request, o);
      ASSERT_TRUE(response.ok()) << response.status();
      ASSERT_EQ(response->num_tensors(), static_cast<int>(sizes.size()));
      for (size_t k = 0; k < sizes.size(); ++k) {
        ASSERT_EQ(response->num_floats(static_cast<int>(k)), sizes[k]);
        std::vector<float> got(static_cast<size_t>(sizes[k]));
        response->CopyTo(static_cast<int>(k), got.data());
        int64_t wrong = 0, wrong_runs = 0, seen = 0;
        for (int64_t i = 0; i < sizes[k]; ++i) wrong += got[i] != 2 * data[k][i];
        response->ForEachRun(static_cast<int>(k), [&](const float* run, int64_t first, int64_t n) {
          EXPECT_EQ(first, seen);
          for (int64_t j = 0; j < n; ++j) wrong_runs += run[j] != 2 * data[k][first + j];
          seen += n;
          return true;
        });
        EXPECT_EQ(wrong, 0) << "tensor " << k << " of " << sizes[k];
        EXPECT_EQ(wrong_runs, 0) << "tensor " << k << " of " << sizes[k];
        EXPECT_EQ(seen, sizes[k]);
      }
    }
  }
}

TEST(GrpcTransportTest, HeldCallsAnswerLaterAndDeadlinesNameThePeer) {
  TestHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &handler);
  ASSERT_TRUE(server.ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  auto channel = MakeGrpcChannel(address, absl::StrCat("ps task 3 (", address, ")"), {});
  ASSERT_TRUE(channel.ok());

  // A call nobody answers in time.
  auto late = (*channel)->CallBlocking(Method::kWaitInitialized, OutgoingMessage::Of(wire::Empty()), Options(0.2));
  EXPECT_TRUE(absl::IsDeadlineExceeded(late.status())) << late.status();
  EXPECT_THAT(std::string(late.status().message()),
              HasSubstr(absl::StrCat("ps task 3 (", address, "): WaitInitialized got no answer within 0.2 s")));

  // A call answered from another thread while the caller waits.
  absl::Notification answered;
  absl::StatusOr<IncomingMessage> result;
  (*channel)->Call(Method::kWaitInitialized, OutgoingMessage::Of(wire::Empty()), Options(),
                   [&](absl::StatusOr<IncomingMessage> r) {
                     result = std::move(r);
                     answered.Notify();
                   });
  // Bounded: a call that never reached the handler fails here, naming what it got, instead of hanging.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (handler.held() < 2 && !answered.HasBeenNotified() && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (handler.held() < 2) {
    const std::string ended = answered.HasBeenNotified() ? result.status().ToString() : "nothing yet";
    handler.ReleaseHeld();
    FAIL() << "the second call did not reach the handler within 30 s; it ended with " << ended;
  }
  EXPECT_FALSE(answered.HasBeenNotified());
  std::thread([&handler] { handler.ReleaseHeld(); }).join();  // also answers the timed-out call
  answered.WaitForNotification();
  EXPECT_TRUE(result.ok()) << result.status();
}

// A Push carrying one tensor of `n` floats.
OutgoingMessage PushOf(const std::vector<float>& data, const std::string& dtype = "") {
  OutgoingMessage request = OutgoingMessage::Of(wire::PushRequest());
  OutgoingTensor t;
  t.meta.set_name("w");
  t.meta.add_shape(static_cast<int64_t>(data.size()));
  t.meta.set_dtype(dtype);
  t.data = data.data();
  t.num_floats = static_cast<int64_t>(data.size());
  request.tensors.push_back(std::move(t));
  return request;
}

// Inside a CompletionsHere, the calls this thread starts complete on this thread when the scope
// closes (their callbacks run here, as on a transport thread), including a call such a callback
// starts and a call that runs into its deadline; a call another thread starts meanwhile completes
// on the transport's own thread; outside the scope this thread is an ordinary one again.
TEST(GrpcTransportTest, CompletionsHereRunsTheThreadsOwnCallsOnIt) {
  TestHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &handler);
  ASSERT_TRUE(server.ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  auto channel = MakeGrpcChannel(address, absl::StrCat("ps task 0 (", address, ")"), {});
  ASSERT_TRUE(channel.ok());
  ClientChannel& ch = **channel;
  const std::thread::id me = std::this_thread::get_id();
  const std::vector<float> data = {1, 2, 3};

  struct Seen {
    absl::Mutex mu;
    std::vector<std::string> calls ABSL_GUARDED_BY(mu);  // "name:ok|code:thread is me:transport thread"
  };
  Seen seen;
  auto record = [&seen, me](const std::string& name) {
    return [&seen, me, name](absl::StatusOr<IncomingMessage> r) {
      std::string result = r.ok() ? "ok" : absl::StatusCodeToString(r.status().code());
      if (r.ok()) {
        std::vector<float> got(static_cast<size_t>(r->num_floats(0)));
        r->CopyTo(0, got.data());
        if (got != std::vector<float>({2, 4, 6})) result = "wrong values";
      }
      absl::MutexLock lock(&seen.mu);
      seen.calls.push_back(absl::StrCat(name, ":", result, ":", std::this_thread::get_id() == me ? "here" : "elsewhere",
                                        ":", OnTransportThread() ? "transport" : "user"));
    };
  };
  // A call on a channel still connecting completes on the shared completion thread, which polls
  // while the connection is made (its errors are gRPC's account of the cause); afterwards, on the
  // connected channel, calls inside a scope complete here. Both directions' channels connect.
  absl::Notification connected;
  {
    CompletionsHere here;
    ch.Call(Method::kStats, PushOf(data), Options(), [&, then = record("connecting")](auto r) {
      then(std::move(r));
      connected.Notify();
    });
  }
  connected.WaitForNotification();
  CallOptions pull_connect = Options();
  pull_connect.pull_direction = true;
  ASSERT_TRUE(ch.CallBlocking(Method::kStats, PushOf(data), pull_connect).ok());
  {
    absl::MutexLock lock(&seen.mu);
    EXPECT_THAT(seen.calls, ::testing::ElementsAre("connecting:ok:elsewhere:transport"));
    seen.calls.clear();
  }

  absl::Notification other_thread_done;
  {
    CompletionsHere here;
    ch.Call(Method::kStats, PushOf(data), Options(), record("first"));
    CallOptions pull = Options();
    pull.pull_direction = true;
    ch.Call(Method::kStats, PushOf(data), pull, [&, then = record("second")](absl::StatusOr<IncomingMessage> r) {
      then(std::move(r));
      ch.Call(Method::kStats, PushOf(data), Options(), record("chained"));  // started while the scope drains
    });
    ch.Call(Method::kWaitInitialized, OutgoingMessage::Of(wire::Empty()), Options(0.2), record("late"));
    std::thread([&] {
      ch.Call(Method::kStats, PushOf(data), Options(), [&, then = record("other thread")](auto r) {
        then(std::move(r));
        other_thread_done.Notify();
      });
    }).join();
    {
      absl::MutexLock lock(&seen.mu);
      EXPECT_THAT(seen.calls, ::testing::Not(::testing::Contains(HasSubstr(":here:"))))
          << "a call completed on this thread before its scope closed";
    }
    CompletionsHere nested;  // closing first, it completes the outer scope's calls too
    ch.Call(Method::kStats, PushOf(data), Options(), record("nested"));
  }
  EXPECT_FALSE(OnTransportThread());
  other_thread_done.WaitForNotification();
  handler.ReleaseHeld();  // the held call already failed on its deadline
  absl::MutexLock lock(&seen.mu);
  EXPECT_THAT(seen.calls,
              ::testing::UnorderedElementsAre("first:ok:here:transport", "second:ok:here:transport",
                                              "chained:ok:here:transport", "late:DEADLINE_EXCEEDED:here:transport",
                                              "nested:ok:here:transport", "other thread:ok:elsewhere:transport"));
  // CallBlocking completes its call on the calling thread the same way, and blocking stays
  // refused inside a callback.
  auto blocking = ch.CallBlocking(Method::kStats, PushOf(data), Options());
  ASSERT_TRUE(blocking.ok()) << blocking.status();
  EXPECT_EQ(blocking->num_floats(0), 3);
}

TEST(GrpcTransportTest, OversizedMessagesAreRefusedNamingTheLimitAndTheServerKeepsServing) {
  TestHandler handler;
  TransportOptions limited;
  limited.max_message_bytes = 1 << 20;
  auto server = StartGrpcServer("127.0.0.1:0", limited, &handler);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  const std::string peer = absl::StrCat("ps task 0 (", address, ")");
  const std::vector<float> big(size_t{1} << 19), small(1000, 1.0f);  // 2 MiB and 4 KB

  // The server's limit refuses a 2 MiB push from a client with the default 1 GiB limit.
  auto channel = MakeGrpcChannel(address, peer, {});
  ASSERT_TRUE(channel.ok());
  auto refused = (*channel)->CallBlocking(Method::kPush, PushOf(big), Options());
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  const std::string message(refused.status().message());
  EXPECT_THAT(message, HasSubstr(peer + ": Push refused: a message of 2.0 MiB is over the 1 MiB limit"));
  EXPECT_THAT(message, HasSubstr("--max_message_mb"));
  EXPECT_EQ(message.find('\n'), std::string::npos);

  // The server still answers, on the same connection and on a new one.
  for (int i = 0; i < 2; ++i) {
    auto c = i == 0 ? std::move(*channel) : *MakeGrpcChannel(address, peer, {});
    auto ok = c->CallBlocking(Method::kPush, PushOf(small), Options());
    ASSERT_TRUE(ok.ok()) << ok.status();
    std::vector<float> doubled(small.size());
    ok->CopyTo(0, doubled.data());
    EXPECT_EQ(doubled[999], 2.0f);
  }

  // A client's own limit refuses before sending: the same message, the client's limit.
  TransportOptions client_limit;
  client_limit.max_message_bytes = 1 << 20;
  auto limited_channel = MakeGrpcChannel(address, peer, client_limit);
  ASSERT_TRUE(limited_channel.ok());
  const int64_t bytes_before = (*server)->counters().bytes_in;
  auto not_sent = (*limited_channel)->CallBlocking(Method::kPush, PushOf(big), Options());
  ASSERT_TRUE(absl::IsResourceExhausted(not_sent.status())) << not_sent.status();
  EXPECT_THAT(std::string(not_sent.status().message()),
              HasSubstr(peer + ": Push refused: a message of 2.0 MiB is over the 1 MiB limit"));
  EXPECT_EQ((*server)->counters().bytes_in, bytes_before);
  EXPECT_TRUE((*limited_channel)->CallBlocking(Method::kPush, PushOf(small), Options()).ok());

  // Limits gRPC cannot represent are refused up front.
  for (int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{2048} << 20}) {
    TransportOptions s;
    s.max_message_bytes = bad;
    auto no_server = StartGrpcServer("127.0.0.1:0", s, &handler);
    ASSERT_FALSE(no_server.ok());
    EXPECT_THAT(std::string(no_server.status().message()), HasSubstr("--max_message_mb between 1 and 2047"));
    EXPECT_FALSE(MakeGrpcChannel(address, peer, s).ok());
  }
}

TEST(GrpcTransportTest, ServerRefusesTensorsOfAnotherDtypeAndKeepsServing) {
  TestHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &handler);
  ASSERT_TRUE(server.ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  auto channel = MakeGrpcChannel(address, "ps task 0", {});
  const std::vector<float> data(100, 1.0f);
  auto refused = (*channel)->CallBlocking(Method::kPush, PushOf(data, "float64"), Options());
  ASSERT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("ps task 0: refused Push: malformed message: tensor 0 ('w') has dtype 'float64'"));
  EXPECT_TRUE((*channel)->CallBlocking(Method::kPush, PushOf(data), Options()).ok());
}

std::string WriteTemp(const std::string& name, const char* text) {
  const std::string path =
      (std::filesystem::temp_directory_path() / absl::StrCat("psflow_tls_", getpid(), "_", name)).string();
  std::ofstream(path) << text;
  return path;
}

TEST(GrpcTransportTest, SecretIsChecked) {
  TestHandler handler;
  TransportOptions secured;
  secured.secret = "s3cret";
  auto server = StartGrpcServer("127.0.0.1:0", secured, &handler);
  ASSERT_TRUE(server.ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  TransportOptions wrong;
  wrong.secret = "guess";
  for (const TransportOptions& s : {TransportOptions{}, wrong}) {
    auto channel = MakeGrpcChannel(address, "ps task 0", s);
    auto r = (*channel)->CallBlocking(Method::kStats, OutgoingMessage::Of(wire::Empty()), Options());
    EXPECT_TRUE(absl::IsUnauthenticated(r.status())) << r.status();
  }
  auto channel = MakeGrpcChannel(address, "ps task 0", secured);
  EXPECT_TRUE((*channel)->CallBlocking(Method::kStats, OutgoingMessage::Of(wire::Empty()), Options()).ok());
  EXPECT_EQ((*server)->counters().calls_unauthenticated, 2);
}

TEST(GrpcTransportTest, MutualTlsWithTheClusterCertificate) {
  TransportOptions tls;
  tls.tls_cert = WriteTemp("task.pem", testing::kTestTaskCertPem);
  tls.tls_key = WriteTemp("task.key", testing::kTestTaskKeyPem);
  tls.tls_ca = WriteTemp("ca.pem", testing::kTestCaPem);
  TestHandler handler;
  auto server = StartGrpcServer("127.0.0.1:0", tls, &handler);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());

  auto good = MakeGrpcChannel(address, "ps task 0", tls);
  ASSERT_TRUE(good.ok()) << good.status();
  auto r = (*good)->CallBlocking(Method::kStats, OutgoingMessage::Of(wire::Empty()), Options());
  EXPECT_TRUE(r.ok()) << r.status();
  const int64_t bytes_in_before = (*server)->counters().bytes_in;

  // Plain text to a TLS server, a client trusting another CA, and a client without a
  // certificate (the server requires one) all fail, saying which TLS flag to fix: at once, and
  // after waiting for the connection (the way workers connect), when the transport asks the
  // connection why it fails.
  TransportOptions other_ca = tls;
  other_ca.tls_ca = WriteTemp("other_ca.pem", testing::kOtherCaPem);
  TransportOptions no_client_cert;
  no_client_cert.tls_ca = tls.tls_ca;
  const std::vector<std::pair<TransportOptions, std::string>> mismatches = {
      {TransportOptions{}, "it uses TLS and this task must be started with the same --tls_cert/--tls_key/--tls_ca"},
      {other_ca, "certificate verify failed (the task's certificate is not signed by the CA in this task's --tls_ca"},
      {no_client_cert,
       "if it requires client certificates (it has --tls_ca), give this task --tls_cert and --tls_key"}};
  for (const auto& [s, hint] : mismatches) {
    auto channel = MakeGrpcChannel(address, "ps task 0", s);
    ASSERT_TRUE(channel.ok());
    auto failed = (*channel)->CallBlocking(Method::kStats, OutgoingMessage::Of(wire::Empty()), Options(2));
    EXPECT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
    EXPECT_THAT(std::string(failed.status().message()), HasSubstr(hint));
    // 2 s, not 1: under load a reconnect attempt (with its TLS handshake) may not have failed yet
    // after 1 s, and then the transport has no reason to name.
    CallOptions waiting = Options(2);
    waiting.wait_for_ready = true;
    auto timed_out = (*channel)->CallBlocking(Method::kStats, OutgoingMessage::Of(wire::Empty()), waiting);
    EXPECT_TRUE(absl::IsDeadlineExceeded(timed_out.status())) << timed_out.status();
    EXPECT_THAT(std::string(timed_out.status().message()),
                HasSubstr("ps task 0: Stats got no answer within 2 s: connecting fails: "));
    EXPECT_THAT(std::string(timed_out.status().message()), HasSubstr(hint));
  }
  // None of those reached the handler.
  EXPECT_EQ((*server)->counters().bytes_in, bytes_in_before);

  // A TLS client dialling a plain-text server, and a server that is gone.
  TestHandler plain_handler;
  auto plain = StartGrpcServer("127.0.0.1:0", {}, &plain_handler);
  ASSERT_TRUE(plain.ok());
  const std::string plain_address = absl::StrCat("127.0.0.1:", (*plain)->port());
  auto tls_to_plain = (*MakeGrpcChannel(plain_address, "ps task 1", tls))
                          ->CallBlocking(Method::kStats, OutgoingMessage::Of(wire::Empty()), Options(2));
  EXPECT_THAT(std::string(tls_to_plain.status().message()),
              HasSubstr("this task speaks TLS but the other does not: give every task the same "
                        "--tls_cert/--tls_key/--tls_ca"));
  plain->reset();
  CallOptions waiting = Options(0.5);
  waiting.wait_for_ready = true;
  auto gone = (*MakeGrpcChannel(plain_address, "ps task 1", {}))
                  ->CallBlocking(Method::kStats, OutgoingMessage::Of(wire::Empty()), waiting);
  EXPECT_TRUE(absl::IsDeadlineExceeded(gone.status())) << gone.status();
  EXPECT_THAT(std::string(gone.status().message()),
              HasSubstr("Connection refused (nothing listens there: is the task running, and is the address right?)"));

  TransportOptions missing = tls;
  missing.tls_key = "/nonexistent/task.key";
  auto refused = StartGrpcServer("127.0.0.1:0", missing, &handler);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("/nonexistent/task.key"));
  for (const std::string& f : {tls.tls_cert, tls.tls_key, tls.tls_ca, other_ca.tls_ca}) std::filesystem::remove(f);
}

}  // namespace
}  // namespace psflow::rpc
