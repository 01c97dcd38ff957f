// The in-process ps task of a session that runs alone (train/in_process_ps.h): a port taken by
// another process between Create (which picks the ports) and Open (where the task binds) moves the
// task to fresh ports, and two sessions started at once in one process both train.
#include "train/in_process_ps.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "psflow/train/session.h"

namespace psflow::train {
namespace {

// Options of a session alone training `steps` steps of SGD at learning rate 0.25 without decay.
WorkerSession::Options Alone(int64_t steps, std::vector<std::string>* log) {
  WorkerSession::Options options;
  options.train.optimizer = "sgd";
  options.train.learning_rate = 0.25f;
  options.train.lr_decay_steps = 0;
  options.train.train_steps = steps;
  options.model_name = "alone";
  options.log = [log](const std::string& line) { log->push_back(line); };
  return options;
}

// Opens `session` and trains it to its end; the global step it ended at.
absl::StatusOr<int64_t> TrainToTheEnd(WorkerSession& session, const Tensor& w) {
  if (auto s = session.Open(); !s.ok()) return s;
  while (!session.ShouldStop()) {
    if (auto s = session.Step(0.5); !s.ok()) return s;
  }
  EXPECT_FLOAT_EQ(w[0], 1 - 0.25f * session.global_step());  // the ps task's updates, pulled
  auto summary = session.Close();
  if (!summary.ok()) return summary.status();
  return summary->global_step;
}

TEST(InProcessPsTest, MovesToFreshPortsWhenItsPortWasTakenBeforeOpen) {
  ASSERT_EQ(std::getenv("TF_CONFIG"), nullptr);
  std::vector<std::string> log;
  Tensor w(Shape{3}, 1.0f), grad(Shape{3}, 1.0f);
  auto session = WorkerSession::Create(Alone(3, &log), {{"w", &w, &grad}});
  ASSERT_TRUE(session.ok()) << session.status();
  // Another process listens on the ps task's port, picked at Create, before the task binds it.
  const std::string ps_host = (*session)->options().ps_hosts;
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(ps_host.substr(ps_host.rfind(':') + 1), &port)) << ps_host;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << "port " << port;
  ASSERT_EQ(listen(fd, 1), 0);

  auto steps = TrainToTheEnd(**session, w);
  close(fd);
  ASSERT_TRUE(steps.ok()) << steps.status() << "\n" << ::testing::PrintToString(log);
  EXPECT_EQ(*steps, 3);
  EXPECT_NE((*session)->options().ps_hosts, ps_host);
  const std::string joined = ::testing::PrintToString(log);
  EXPECT_NE(joined.find(absl::StrCat("cannot listen on 127.0.0.1:", port)), std::string::npos) << joined;
  EXPECT_NE(joined.find("trying fresh ports"), std::string::npos) << joined;
}

TEST(InProcessPsTest, TwoSessionsStartedAtOnceBothTrain) {
  ASSERT_EQ(std::getenv("TF_CONFIG"), nullptr);
  std::vector<std::string> logs[2];
  absl::StatusOr<int64_t> steps[2];
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([i, &logs, &steps] {
      Tensor w(Shape{3}, 1.0f), grad(Shape{3}, 1.0f);
      auto session = WorkerSession::Create(Alone(4, &logs[i]), {{"w", &w, &grad}});
      steps[i] = session.ok() ? TrainToTheEnd(**session, w) : session.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(steps[i].ok()) << steps[i].status() << "\n" << ::testing::PrintToString(logs[i]);
    EXPECT_EQ(*steps[i], 4);
  }
}

}  // namespace
}  // namespace psflow::train
