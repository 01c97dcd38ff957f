// The shared-memory transport through real sockets and memfds (and, for kill -9, a real server
// process): tensors both ways, answers held and given later from another thread, deadlines, a
// server that stops or dies and one that comes back on the same port, the secret, concurrency.
#include "rpc/shm_transport.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/delta_pull.h"
#include "rpc/test_handler.h"
#include "rpc/transport.h"

namespace psflow::rpc {
namespace {

using ::testing::HasSubstr;

// Every call answered at once with its tensors doubled, except Pull, held until ReleaseHeld().
class TestHandler final : public testing::DoublingHandler {
 public:
  TestHandler() : DoublingHandler(Method::kPull) {}
};

TransportOptions Shm(std::string secret = "") {
  TransportOptions s;
  s.transport = "shm";
  s.secret = std::move(secret);
  return s;
}

CallOptions Options(double timeout_secs = 10) {
  CallOptions o;
  o.timeout_secs = timeout_secs;
  return o;
}

OutgoingMessage TensorMessage(const std::vector<float>& data, const std::string& name) {
  OutgoingMessage m;
  m.header = "hdr-" + name;
  OutgoingTensor t;
  t.meta.set_name(name);
  t.meta.add_shape(static_cast<int64_t>(data.size()));
  t.data = data.data();
  t.num_floats = static_cast<int64_t>(data.size());
  m.tensors.push_back(std::move(t));
  return m;
}

// The shm channel inside a factory-made channel (which wraps it for delta pulls), or null.
ShmChannel* AsShm(ClientChannel* channel) {
  auto* delta = dynamic_cast<DeltaChannel*>(channel);
  return dynamic_cast<ShmChannel*>(delta != nullptr ? delta->inner() : channel);
}

struct Fixture {
  TestHandler handler;
  std::unique_ptr<Server> server;
  std::unique_ptr<ClientChannel> channel;
  ShmChannel* shm = nullptr;

  explicit Fixture(TransportOptions server_security = Shm(), TransportOptions client_security = Shm()) {
    auto s = StartServer("127.0.0.1:0", server_security, &handler);
    CHECK(s.ok()) << s.status();
    server = *std::move(s);
    auto c = MakeChannel(absl::StrCat("127.0.0.1:", server->port()), "ps task 0 (test)", client_security);
    CHECK(c.ok()) << c.status();
    channel = *std::move(c);
    shm = AsShm(channel.get());
    CHECK(shm != nullptr);
  }
};

TEST(ShmTransportTest, TensorsTravelBothWaysOverSharedMemory) {
  Fixture f;
  // Growing sizes make both regions grow; 16 MiB is the largest.
  for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{70000}, int64_t{1} << 20, int64_t{4} << 20, int64_t{5}}) {
    std::vector<float> a(static_cast<size_t>(n)), b(17);
    for (int64_t i = 0; i < n; ++i) a[i] = static_cast<float>(i % 1000) - 0.5f;
    for (int i = 0; i < 17; ++i) b[i] = static_cast<float>(i) * 0.25f;
    OutgoingMessage request = TensorMessage(a, "a");
    OutgoingMessage second = TensorMessage(b, "b");
    request.tensors.push_back(std::move(second.tensors[0]));
    absl::StatusOr<IncomingMessage> response = f.channel->CallBlocking(Method::kPush, std::move(request), Options());
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->header(), "hdr-a");
    ASSERT_EQ(response->num_tensors(), 2);
    EXPECT_EQ(response->meta(0).name(), "a");
    ASSERT_EQ(response->num_floats(0), n);
    std::vector<float> got(static_cast<size_t>(n));
    response->CopyTo(0, got.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 2 * a[i]) << "n=" << n << " i=" << i;
    std::vector<float> got_b(17);
    response->CopyTo(1, got_b.data());
    for (int i = 0; i < 17; ++i) EXPECT_EQ(got_b[i], 2 * b[i]);
  }
  EXPECT_EQ(f.shm->shm_calls(), 6);
  EXPECT_EQ(f.shm->fallback_calls(), 0);
  EXPECT_GT(f.server->counters().bytes_in, int64_t{16} << 20);
  EXPECT_GT(f.server->counters().bytes_out, int64_t{16} << 20);
  // Control methods too.
  ASSERT_TRUE(f.channel->CallBlocking(Method::kStats, OutgoingMessage::Of(wire::Empty()), Options()).ok());
  EXPECT_EQ(f.shm->shm_calls(), 7);
  EXPECT_EQ(f.shm->fallback_calls(), 0);
}

TEST(ShmTransportTest, HeldCallIsAnsweredLaterFromAnotherThread) {
  Fixture f;
  absl::Notification done;
  absl::Status status = absl::UnknownError("not called");
  f.channel->Call(Method::kPull, OutgoingMessage::Of(wire::Empty()), Options(), [&](absl::StatusOr<IncomingMessage> r) {
    status = r.status();
    done.Notify();
  });
  ASSERT_TRUE(f.handler.WaitHeld(1));
  EXPECT_FALSE(done.HasBeenNotified());
  std::thread([&] { f.handler.ReleaseHeld(); }).join();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(f.shm->shm_calls(), 1);
}

TEST(ShmTransportTest, DeadlineExceededNamesPeerAndMethodAndTheSlotIsReusedAfterTheLateAnswer) {
  Fixture f;
  absl::StatusOr<IncomingMessage> r =
      f.channel->CallBlocking(Method::kPull, OutgoingMessage::Of(wire::Empty()), Options(0.3));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("ps task 0 (test)"));
  EXPECT_THAT(r.status().message(), HasSubstr("Pull"));
  f.handler.ReleaseHeld();  // the late answer frees the slot
  // More calls than slots, one after the other: every slot is reusable.
  std::vector<float> x = {1, 2, 3};
  for (int i = 0; i < 2 * kShmSlots; ++i) {
    absl::StatusOr<IncomingMessage> ok = f.channel->CallBlocking(Method::kPush, TensorMessage(x, "x"), Options());
    ASSERT_TRUE(ok.ok()) << ok.status();
  }
  EXPECT_EQ(f.shm->fallback_calls(), 0);
}

TEST(ShmTransportTest, StoppedServerFailsUnavailableAndARestartedOneOnTheSamePortServes) {
  Fixture f;
  const int port = f.server->port();
  absl::Notification done;
  absl::Status status;
  f.channel->Call(Method::kPull, OutgoingMessage::Of(wire::Empty()), Options(30),
                  [&](absl::StatusOr<IncomingMessage> r) {
                    status = r.status();
                    done.Notify();
                  });
  ASSERT_TRUE(f.handler.WaitHeld(1));
  f.server->Shutdown(0);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("ps task 0 (test)"));
  f.handler.ReleaseHeld();  // answering a call of a closed connection does nothing
  f.server.reset();

  // Nothing listens: gRPC's answer (Unavailable) over the fallback.
  std::vector<float> x = {1, 2, 3};
  absl::StatusOr<IncomingMessage> down = f.channel->CallBlocking(Method::kPush, TensorMessage(x, "x"), Options(2));
  EXPECT_FALSE(down.ok());

  TestHandler handler2;
  auto restarted = StartServer(absl::StrCat("127.0.0.1:", port), Shm(), &handler2);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  const int64_t before = f.shm->shm_calls();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (f.shm->shm_calls() == before && std::chrono::steady_clock::now() < give_up) {
    absl::StatusOr<IncomingMessage> r = f.channel->CallBlocking(Method::kPush, TensorMessage(x, "x"), Options(2));
    if (r.ok()) {
      std::vector<float> got(3);
      r->CopyTo(0, got.data());
      EXPECT_EQ(got, (std::vector<float>{2, 4, 6}));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(f.shm->shm_calls(), before) << "never reconnected: " << f.shm->last_connect_error();
}

TEST(ShmTransportTest, WrongSecretIsRefused) {
  Fixture f(Shm("right"), Shm("wrong"));
  std::vector<float> x = {1};
  absl::StatusOr<IncomingMessage> r = f.channel->CallBlocking(Method::kPush, TensorMessage(x, "x"), Options());
  EXPECT_TRUE(absl::IsUnauthenticated(r.status())) << r.status();  // from gRPC, where the call went
  EXPECT_EQ(f.shm->shm_calls(), 0);
  EXPECT_THAT(f.shm->last_connect_error(), HasSubstr("wrong cluster secret"));
  EXPECT_GE(f.server->counters().calls_unauthenticated, 1);

  Fixture good(Shm("right"), Shm("right"));
  ASSERT_TRUE(good.channel->CallBlocking(Method::kPush, TensorMessage(x, "x"), Options()).ok());
  EXPECT_EQ(good.shm->shm_calls(), 1);
}

TEST(ShmTransportTest, ConcurrentCallsAndMoreThanTheSlots) {
  Fixture f;
  // More held calls than slots: the rest go over gRPC, and all are answered.
  constexpr int kHeld = kShmSlots + 2;
  std::atomic<int> answered{0};
  for (int i = 0; i < kHeld; ++i) {
    f.channel->Call(Method::kPull, OutgoingMessage::Of(wire::Empty()), Options(),
                    [&](absl::StatusOr<IncomingMessage> r) {
                      EXPECT_TRUE(r.ok()) << r.status();
                      answered.fetch_add(1);
                    });
  }
  ASSERT_TRUE(f.handler.WaitHeld(kHeld));
  EXPECT_EQ(f.shm->shm_calls(), kShmSlots);
  EXPECT_EQ(f.shm->fallback_calls(), 2);
  f.handler.ReleaseHeld();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (answered.load() < kHeld && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(answered.load(), kHeld);

  // Several threads at once, each checking its own answers.
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        std::vector<float> x(1000 + t * 100 + i, static_cast<float>(t * 1000 + i));
        absl::StatusOr<IncomingMessage> r = f.channel->CallBlocking(Method::kPush, TensorMessage(x, "x"), Options());
        std::vector<float> got(x.size());
        if (!r.ok() || r->num_floats(0) != static_cast<int64_t>(x.size())) {
          failures.fetch_add(1);
          continue;
        }
        r->CopyTo(0, got.data());
        if (got != std::vector<float>(x.size(), 2 * x[0])) failures.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ShmTransportTest, FactoriesPickTheTransport) {
  TransportOptions bad;
  bad.transport = "tcp";
  auto refused = MakeChannel("127.0.0.1:1", "ps", bad);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_THAT(refused.status().message(), HasSubstr("--transport=tcp"));
  auto remote = MakeChannel("10.1.2.3:2222", "ps", Shm());
  ASSERT_TRUE(remote.ok());
  EXPECT_EQ(AsShm(remote->get()), nullptr);
  auto grpc = MakeChannel("127.0.0.1:2222", "ps", {});
  ASSERT_TRUE(grpc.ok());
  EXPECT_EQ(AsShm(grpc->get()), nullptr);
  EXPECT_TRUE(IsLoopbackAddress("localhost:1"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:1"));
  EXPECT_FALSE(IsLoopbackAddress("192.168.0.1:1"));

  // A shm client of a gRPC-only ps: everything over gRPC.
  Fixture f(TransportOptions{}, Shm());
  std::vector<float> x = {1, 2};
  ASSERT_TRUE(f.channel->CallBlocking(Method::kPush, TensorMessage(x, "x"), Options()).ok());
  EXPECT_EQ(f.shm->shm_calls(), 0);
  EXPECT_EQ(f.shm->fallback_calls(), 1);
}

// Run only as the child of KilledServerProcessFailsCallsUnavailable: serves until killed.
TEST(ShmTransportChild, DISABLED_Serve) {
  const char* port_file = std::getenv("PSFLOW_SHM_TEST_PORT_FILE");
  if (port_file == nullptr) GTEST_SKIP() << "only run as a child process";  // e.g. all disabled tests run
  TestHandler handler;
  auto server = StartServer("127.0.0.1:0", Shm(), &handler);
  ASSERT_TRUE(server.ok());
  {
    std::ofstream out(std::string(port_file) + ".tmp");
    out << (*server)->port();
  }
  std::filesystem::rename(std::string(port_file) + ".tmp", port_file);
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

TEST(ShmTransportTest, KilledServerProcessFailsCallsUnavailable) {
  const std::string port_file = absl::StrCat(::testing::TempDir(), "/shm_port_", getpid());
  std::filesystem::remove(port_file);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("PSFLOW_SHM_TEST_PORT_FILE", port_file.c_str(), 1);
    execl("/proc/self/exe", "shm_child", "--gtest_filter=ShmTransportChild.DISABLED_Serve",
          "--gtest_also_run_disabled_tests", nullptr);
    _exit(127);
  }
  int port = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (port == 0 && std::chrono::steady_clock::now() < give_up) {
    std::ifstream in(port_file);
    if (!(in >> port)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(port, 0);
  auto channel = MakeChannel(absl::StrCat("127.0.0.1:", port), "ps task 0 (child)", Shm());
  ASSERT_TRUE(channel.ok());
  auto* shm = AsShm(channel->get());
  std::vector<float> x = {1, 2, 3};
  ASSERT_TRUE((*channel)->CallBlocking(Method::kPush, TensorMessage(x, "x"), Options()).ok());
  EXPECT_EQ(shm->shm_calls(), 1);
  absl::Notification done;
  absl::Status status;
  (*channel)->Call(Method::kPull, OutgoingMessage::Of(wire::Empty()), Options(60),
                   [&](absl::StatusOr<IncomingMessage> r) {
                     status = r.status();
                     done.Notify();
                   });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the child holds the Pull
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10))) << "a killed server left the call hanging";
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("ps task 0 (child)"));
  std::filesystem::remove(port_file);
}

}  // namespace
}  // namespace psflow::rpc
