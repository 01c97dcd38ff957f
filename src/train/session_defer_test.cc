// The deferred push (psflow/train/session.h; docs/sync-async.md#overlap): an async worker with
// overlap whose caller waits for values returns from Step once its push is sent. Against a real ps
// over gRPC on loopback, through a proxy that can hold the ps's answers: Step returns while its
// answer is held (the push is in flight), the next Step sends nothing until that answer arrives
// (the ps's step counter stays put), the last push before --train_steps is waited for (one worker
// ends at exactly train_steps), a failure of a push already returned from is the next call's
// error naming its step (Step's, or Close's), table gradients the caller lends are held until the
// push is answered, and one worker trains to the same bits, taking the same batches, deferred or
// not. The data order's disjointness is checked on simulated interleavings. No timing is asserted:
// the order is read from the ps's counters.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"
#include "psflow/train/session.h"
#include "train/session_pending.h"

namespace psflow::train {
namespace {

using ps::testing::TestCluster;

// A TCP proxy on 127.0.0.1 in front of one ps task: bytes to the ps always pass; the ps's bytes
// back pass unless held (then they wait in the kernel's buffers). Drop() closes every connection
// and refuses new ones.
class HoldingProxy {
 public:
  explicit HoldingProxy(int target_port) : target_port_(target_port) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(listener_, 16), 0);
    socklen_t len = sizeof(a);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    threads_.emplace_back([this] { Accept(); });
  }
  ~HoldingProxy() {
    Drop();
    for (std::thread& t : threads_) t.join();
  }
  int port() const { return port_; }
  void HoldAnswers(bool hold) { hold_ = hold; }
  void Drop() {
    if (stop_.exchange(true)) return;
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  }

 private:
  void Accept() {
    for (;;) {
      pollfd p{listener_, POLLIN, 0};
      poll(&p, 1, 5);
      if (stop_) break;
      if (!(p.revents & POLLIN)) continue;
      int client = accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(client);
        close(server);
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        fds_.push_back(client);
        fds_.push_back(server);
      }
      threads_.emplace_back([this, client, server] { Pump(client, server); });
    }
    close(listener_);
  }

  // Both directions of one connection; the ps's side is not read while answers are held.
  void Pump(int client, int server) {
    char buffer[1 << 16];
    for (;;) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, short(hold_ ? 0 : POLLIN), 0}};
      poll(p, 2, 5);
      if (stop_) break;
      if (!Move(p[0], client, server, buffer, sizeof(buffer))) break;
      if (!hold_ && !Move(p[1], server, client, buffer, sizeof(buffer))) break;
    }
    shutdown(client, SHUT_RDWR);
    shutdown(server, SHUT_RDWR);
  }
  static bool Move(const pollfd& p, int from, int to, char* buffer, size_t size) {
    if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) return true;
    const ssize_t n = read(from, buffer, size);
    if (n <= 0) return false;
    for (ssize_t sent = 0; sent < n;) {
      const ssize_t k = write(to, buffer + sent, static_cast<size_t>(n - sent));
      if (k <= 0) return false;
      sent += k;
    }
    return true;
  }

  const int target_port_;
  int listener_ = -1, port_ = 0;
  std::atomic<bool> hold_{false}, stop_{false};
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;  // the acceptor's first; joined by the destructor
};

int64_t PsStep(const TestCluster& cluster) { return cluster.servers[0]->Stats().global_step; }

// Waits (bounded) until the ps's global step is `step`; no timing is asserted.
bool WaitForPsStep(const TestCluster& cluster, int64_t step) {
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (PsStep(cluster) < step) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return PsStep(cluster) == step;
}

WorkerSession::Options Async(const std::string& ps, const std::string& overlap, int64_t train_steps) {
  WorkerSession::Options options;
  options.train.job_name = "worker";
  options.train.task_index = 0;
  options.train.ps_hosts = ps;
  options.train.worker_hosts = "127.0.0.1:1";
  options.train.optimizer = "sgd";
  options.train.learning_rate = 0.5f;
  options.train.overlap = overlap;
  options.train.train_steps = train_steps;
  options.waits_for_values = true;
  options.log = [](const std::string&) {};
  return options;
}

struct Proxied {
  std::unique_ptr<TestCluster> cluster = TestCluster::Start(1, 1);
  HoldingProxy proxy{cluster->servers[0]->port()};
  Tensor w{Shape{1}, 0.5f};
  Tensor w_grad{Shape{1}, 0.25f};
  std::unique_ptr<WorkerSession> session;

  explicit Proxied(int64_t train_steps, double ps_timeout_secs = 120) {
    WorkerSession::Options options = Async(absl::StrCat("127.0.0.1:", proxy.port()), "push", train_steps);
    options.train.ps_timeout_secs = ps_timeout_secs;
    options.train.rpc_timeout_secs = ps_timeout_secs < 30 ? 1 : 30;
    auto s = WorkerSession::Create(options, {{"w", &w, &w_grad, nullptr}});
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return;
    session = *std::move(s);
    EXPECT_TRUE(session->Open().ok());
  }
};

TEST(SessionDeferTest, StepReturnsWithThePushInFlightAndTheNextStepWaitsForItsAnswer) {
  Proxied job(/*train_steps=*/4);
  ASSERT_NE(job.session, nullptr);
  job.proxy.HoldAnswers(true);
  ASSERT_TRUE(job.session->Step(1.0).ok());  // returned although its answer cannot arrive
  EXPECT_EQ(job.session->global_step(), 1);  // the estimate: the push in flight counted
  EXPECT_FALSE(job.session->ShouldStop());
  ASSERT_TRUE(WaitForPsStep(*job.cluster, 1));  // the push was applied; its answer is held

  // The next Step sends nothing while the answer is held: the ps stays at step 1.
  std::atomic<bool> returned{false};
  absl::Status second;
  std::thread stepping([&] {
    second = job.session->Step(1.0);
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(300));  // (a wrong session could only pass by chance here)
  EXPECT_EQ(PsStep(*job.cluster), 1);
  EXPECT_FALSE(returned);
  job.proxy.HoldAnswers(false);
  stepping.join();
  ASSERT_TRUE(second.ok()) << second;
  ASSERT_TRUE(WaitForPsStep(*job.cluster, 2));
  EXPECT_EQ(job.session->global_step(), 2);

  ASSERT_TRUE(job.session->Step(1.0).ok());  // deferred: claims 3, train_steps 4
  EXPECT_EQ(job.session->global_step(), 3);
  // The push that reaches train_steps is waited for: the ps is at 4 when Step returns.
  ASSERT_TRUE(job.session->Step(1.0).ok());
  EXPECT_EQ(PsStep(*job.cluster), 4);
  EXPECT_EQ(job.session->global_step(), 4);
  EXPECT_TRUE(job.session->ShouldStop());
  auto summary = job.session->Close();
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->global_step, 4);
  EXPECT_FLOAT_EQ(job.w[0], 0.5f - 4 * 0.5f * 0.25f);  // four updates, none lost or doubled
}

TEST(SessionDeferTest, ALateFailureIsTheNextCallsErrorNamingItsStep) {
  for (const bool close : {false, true}) {
    SCOPED_TRACE(close ? "Close" : "Step");
    Proxied job(/*train_steps=*/10, /*ps_timeout_secs=*/1);
    ASSERT_NE(job.session, nullptr);
    for (int step = 0; step < 2; ++step) {  // (the chief's first worker check is behind it)
      ASSERT_TRUE(job.session->Step(1.0).ok());
      job.session->WaitForValues();  // the answer is in
    }
    job.proxy.HoldAnswers(true);
    ASSERT_TRUE(job.session->Step(1.0).ok());  // local step 3, in flight
    job.proxy.Drop();                          // its answer never comes: the push fails
    const absl::Status late = close ? job.session->Close().status() : job.session->Step(1.0);
    ASSERT_FALSE(late.ok());
    EXPECT_NE(late.message().find("the push of local step 3 (global step 3), answered after its step returned: "),
              std::string::npos)
        << late;
    EXPECT_EQ(late.message().find('\n'), std::string::npos) << late;
    job.session->Abort(late);
  }
}

// Table gradients the caller lends (TableBatch::grads_values and grads_owner) are pushed as they
// are and held while the push is in flight (its answer held by the proxy, then arrived but not yet
// taken), let go of when the session takes the answer (here the next Lookup, which must pull); a
// Step that waits for its push (the last one) lets go of them before it returns. The row each
// Lookup pulls holds the SGD updates of the values lent before.
TEST(SessionDeferTest, LentTableGradientsAreHeldUntilThePushIsAnswered) {
  std::unique_ptr<TestCluster> cluster = TestCluster::Start(1, 1);
  HoldingProxy proxy{cluster->servers[0]->port()};
  Tensor w{Shape{1}, 0.5f}, w_grad{Shape{1}, 0.25f};
  dist::TableSpec spec;
  spec.name = "emb";
  spec.dim = 2;
  spec.kind = dist::TableKind::kFixed;
  spec.num_embeddings = 10;
  spec.initializer = dist::TableInitializer::Uniform(-1, 1);
  WorkerSession::Options options = Async(absl::StrCat("127.0.0.1:", proxy.port()), "push", /*train_steps=*/3);
  options.train.sparse_optimizer = "sgd";
  options.train.sparse_learning_rate = 0.5f;
  auto created = WorkerSession::Create(options, {{"w", &w, &w_grad, nullptr}}, {spec});
  ASSERT_TRUE(created.ok()) << created.status();
  WorkerSession& session = **created;
  ASSERT_TRUE(session.Open().ok());
  const std::vector<float> grads = {0.0f, 0.25f};
  std::vector<std::shared_ptr<std::atomic<bool>>> released;
  std::vector<float> row;  // element 1 of id 3's row, as each Lookup got it
  auto lend = [&] {        // the step's gradient of id 3, lent; its owner says when it is let go of
    EXPECT_TRUE(session.Lookup({std::vector<int64_t>{3}}).ok());
    auto flag = std::make_shared<std::atomic<bool>>(false);
    released.push_back(flag);
    TableBatch& b = session.table_batch(0);
    row.push_back(b.rows.data()[1]);
    b.grads_values = absl::MakeConstSpan(grads);
    b.grads_owner = std::shared_ptr<const void>(grads.data(), [flag](const void*) { *flag = true; });
  };
  lend();
  proxy.HoldAnswers(true);
  ASSERT_TRUE(session.Step(1.0).ok());  // returned with the push in flight
  ASSERT_TRUE(WaitForPsStep(*cluster, 1));
  EXPECT_FALSE(*released[0]);
  proxy.HoldAnswers(false);
  session.WaitForValues();  // the answer arrived, not yet taken
  EXPECT_FALSE(*released[0]);
  lend();  // the Lookup takes it
  EXPECT_TRUE(*released[0]);
  ASSERT_TRUE(session.Step(1.0).ok());  // deferred again (claims 2 of 3)
  EXPECT_FALSE(*released[1]);
  lend();
  EXPECT_TRUE(*released[1]);
  ASSERT_TRUE(session.Step(1.0).ok());  // claims 3 = train_steps: waited for
  EXPECT_TRUE(*released[2]);
  EXPECT_TRUE(session.ShouldStop());
  ASSERT_TRUE(session.Close().ok());
  ASSERT_EQ(row.size(), 3u);
  EXPECT_FLOAT_EQ(row[1], row[0] - 0.5f * 0.25f);
  EXPECT_FLOAT_EQ(row[2], row[0] - 2 * 0.5f * 0.25f);
}

// The gradient of each step is a function of the values the step read (waited for), so a value
// read too early would change the bits.
struct Trained {
  std::vector<float> w;
  std::vector<int64_t> data_steps;
  int64_t stale_pushes = -1;  // dense pushes the ps counted as computed from older values
};

Trained Train(const std::string& overlap, bool waits_for_values) {
  std::unique_ptr<TestCluster> cluster = TestCluster::Start(1, 1);
  // Three parameters of 240 KB: three groups of the pull in forward order (more than its window,
  // so push_pull pulls them in order after the push's answer); a small one rides on it.
  constexpr int64_t kBig = 60000;
  Tensor a{Shape{kBig}, 0.5f}, a_grad{Shape{kBig}};
  Tensor b{Shape{kBig}, -1.0f}, b_grad{Shape{kBig}};
  Tensor c{Shape{kBig}, 2.0f}, c_grad{Shape{kBig}};
  Tensor d{Shape{2}, std::vector<float>{0.25f, 4.0f}}, d_grad{Shape{2}};
  WorkerSession::Options options = Async(cluster->cluster.ps()[0], overlap, 7);
  options.train.optimizer = "adam";
  options.train.learning_rate = 0.1f;
  options.waits_for_values = waits_for_values;
  auto created = WorkerSession::Create(options, {{"a", &a, &a_grad, nullptr},
                                                 {"b", &b, &b_grad, nullptr},
                                                 {"c", &c, &c_grad, nullptr},
                                                 {"d", &d, &d_grad, nullptr}});
  EXPECT_TRUE(created.ok()) << created.status();
  Trained t;
  if (!created.ok()) return t;
  std::unique_ptr<WorkerSession> session = *std::move(created);
  EXPECT_TRUE(session->Open().ok());
  while (!session->ShouldStop()) {
    t.data_steps.push_back(session->data_step());
    session->WaitForValues();
    for (int64_t i = 0; i < kBig; ++i) {
      a_grad[i] = a[i] * d[0] - 1.0f + 1e-6f * static_cast<float>(i);
      b_grad[i] = b[i] - a[i];
      c_grad[i] = c[i] * b[i] - d[1];
    }
    for (int i = 0; i < 2; ++i) d_grad[i] = d[i] - c[i];
    for (int i = 3; i >= 0; --i) EXPECT_TRUE(session->GradientReady(i).ok());  // as backward hands them over
    EXPECT_TRUE(session->Step(1.0).ok());
  }
  EXPECT_TRUE(session->Close().ok());
  for (const Tensor* v : {&a, &b, &c, &d}) t.w.insert(t.w.end(), v->data(), v->data() + v->size());
  const std::vector<int64_t> staleness = cluster->servers[0]->Stats().staleness_counts;
  t.stale_pushes = 0;
  for (size_t tau = 1; tau < staleness.size(); ++tau) t.stale_pushes += staleness[tau];
  return t;
}

TEST(SessionDeferTest, OneWorkerTrainsToTheSameBitsDeferredOrNot) {
  const Trained plain = Train("none", false);
  ASSERT_EQ(plain.data_steps, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  for (const char* overlap : {"push", "push_pull"}) {
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE(absl::StrCat("--overlap=", overlap, " run ", run));
      const Trained deferred = Train(overlap, true);
      EXPECT_EQ(deferred.data_steps, plain.data_steps);
      // Each part tagged with the step of the values it was computed from (--staleness_aware_lr).
      EXPECT_EQ(deferred.stale_pushes, 0);
      ASSERT_EQ(deferred.w.size(), plain.w.size());
      EXPECT_TRUE(deferred.w == plain.w) << "not the same bits";
    }
  }
}

// N workers, each with at most one push in flight, pushing in a random interleaving (each push
// claims the next global step when the ps applies it): no batch is taken twice.
TEST(SessionDeferTest, TheDeferredDataOrderKeepsTheWorkersBatchesDisjoint) {
  for (const int n : {1, 2, 3, 5}) {
    std::mt19937 random(n);
    std::vector<DeferredDataOrder> order(n);
    std::vector<bool> in_flight(n, false);
    int64_t global_step = 7;  // the step every worker opened at
    for (auto& o : order) o.Reset(global_step);
    std::set<int64_t> taken;
    std::vector<int64_t> one_worker;
    for (int event = 0; event < 400; ++event) {
      const int w = static_cast<int>(random() % n);
      if (in_flight[w] && random() % 2 == 0) {  // its push is answered
        order[w].Claimed(++global_step);
        in_flight[w] = false;
        continue;
      }
      if (in_flight[w]) {  // the next Step waits for the answer first
        order[w].Claimed(++global_step);
        in_flight[w] = false;
      }
      const int64_t batch = order[w].NextBatch(n, w);  // read before the step
      EXPECT_TRUE(taken.insert(batch).second) << "n=" << n << " worker " << w << " batch " << batch;
      if (n == 1) one_worker.push_back(batch);
      order[w].Sent();
      in_flight[w] = true;
    }
    if (n == 1) {
      for (size_t k = 0; k < one_worker.size(); ++k) EXPECT_EQ(one_worker[k], 7 + int64_t(k));
    }
  }
}

}  // namespace
}  // namespace psflow::train
