// The worker session (psflow/train/session.h) over buffers its caller owns, against a real ps
// server over gRPC on loopback: misuse is refused (step before open, after the end), the chief
// initializes the ps from the values its buffers hold at Open, each step pulls straight into the
// value buffers (SGD's update checked by hand), a row-sparse gradient updates only its rows, and
// Close ends the job (the ps task's Wait returns OK); the final checkpoint is saved once when the
// schedule falls on the last step; the caller's own metrics reach the summary line and its JSON.
#include "psflow/train/session.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "gtest/gtest.h"
#include "httplib.h"
#include "ps/tests/ps_test_util.h"

namespace psflow::train {
namespace {

using ps::testing::TestCluster;

TEST(WorkerSessionTest, DrivesOneWorkerOverCallerOwnedBuffers) {
  auto cluster = TestCluster::Start(1, 1);
  ASSERT_NE(cluster, nullptr);
  WorkerSession::Options options;
  options.train.job_name = "worker";
  options.train.ps_hosts = cluster->cluster.ps()[0];
  options.train.worker_hosts = cluster->cluster.workers()[0];
  options.train.optimizer = "sgd";
  options.train.learning_rate = 0.5f;
  options.train.lr_decay_steps = 0;
  options.train.train_steps = 3;
  options.model_name = "external";
  std::vector<std::string> log;
  options.log = [&log](const std::string& line) { log.push_back(line); };

  Tensor w(Shape{2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor w_grad(Shape{2, 3}, 1.0f);
  Tensor e(Shape{4, 2}, 10.0f);
  std::optional<RowSparse> e_grad;
  auto session_or = WorkerSession::Create(options, {{"w", &w, &w_grad, nullptr}, {"e", &e, nullptr, &e_grad}});
  ASSERT_TRUE(session_or.ok()) << session_or.status();
  WorkerSession& session = **session_or;
  EXPECT_TRUE(absl::IsFailedPrecondition(session.Step(1.0)));

  // What the chief's buffers hold at Open is what the job starts from.
  w[0] = -1;
  PSFLOW_ASSERT_OK(session.Open());
  EXPECT_TRUE(session.is_chief());
  EXPECT_EQ(session.global_step(), 0);
  EXPECT_EQ(w[0], -1);
  for (int step = 1; step <= 3; ++step) {
    ASSERT_FALSE(session.ShouldStop());
    e_grad = RowSparse{{1, 3}, Tensor(Shape{2, 2}, 2.0f)};
    PSFLOW_ASSERT_OK(session.Step(0.5, 1.0));
    EXPECT_EQ(session.global_step(), step);
    EXPECT_FLOAT_EQ(w[0], -1 - 0.5f * step);
    EXPECT_FLOAT_EQ(w[5], 6 - 0.5f * step);
    EXPECT_FLOAT_EQ(e[0], 10);                // row 0 untouched
    EXPECT_FLOAT_EQ(e[2], 10 - 1.0f * step);  // row 1
    EXPECT_FLOAT_EQ(e[4], 10);                // row 2 untouched
    EXPECT_FLOAT_EQ(e[7], 10 - 1.0f * step);  // row 3
  }
  EXPECT_TRUE(session.ShouldStop());
  EXPECT_TRUE(absl::IsFailedPrecondition(session.Step(1.0)));
  auto summary = session.Close([] {
    SessionEval eval;
    eval.validation_accuracy = 0.5;
    eval.scalars = {{"test_accuracy", 0.25}, {"perplexity", 3.5}};  // a field by name, and a scalar of its own
    return eval;
  });
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->global_step, 3);
  EXPECT_EQ(summary->model, "external");
  EXPECT_EQ(summary->validation_accuracy, 0.5);
  EXPECT_EQ(summary->test_accuracy, 0.25);
  ASSERT_EQ(summary->metrics.size(), 1u);
  EXPECT_EQ(summary->metrics[0], (std::pair<std::string, double>("perplexity", 3.5)));
  EXPECT_NE(SummaryToJson(*summary).find("\"perplexity\":3.5"), std::string::npos) << SummaryToJson(*summary);
  EXPECT_NE(FormatSummary(*summary).find("stale_gradients_dropped=0 perplexity=3.5\n"), std::string::npos);
  ASSERT_EQ(summary->ps_traffic.size(), 1u);
  EXPECT_EQ(summary->ps_traffic[0].num_params, 14);
  PSFLOW_EXPECT_OK(cluster->servers[0]->Wait());
  EXPECT_NE(log.back().find("summary_json: "), std::string::npos) << log.back();
}

// --train_steps=4 with --save_checkpoint_steps=2: checkpoints at steps 2 and 4, each saved and
// logged once (the final save at Close does not write step 4 again). A regression's metrics,
// without accuracies, are printed as name=value and written as top-level JSON keys.
TEST(WorkerSessionTest, SavesTheLastStepOnceAndReportsTheCallersMetrics) {
  auto cluster = TestCluster::Start(1, 1);
  ASSERT_NE(cluster, nullptr);
  const std::string dir = ::testing::TempDir() + "/session_final_checkpoint";
  std::filesystem::remove_all(dir);
  WorkerSession::Options options;
  options.train.job_name = "worker";
  options.train.ps_hosts = cluster->cluster.ps()[0];
  options.train.worker_hosts = cluster->cluster.workers()[0];
  options.train.optimizer = "sgd";
  options.train.train_steps = 4;
  options.train.checkpoint_dir = dir;
  options.train.save_checkpoint_steps = 2;
  options.train.metrics_json = dir + "/metrics.json";
  options.train.log_every = 1;
  options.model_name = "regression";
  std::vector<std::string> log;
  options.log = [&log](const std::string& line) { log.push_back(line); };
  Tensor w(Shape{3}, 1.0f), w_grad(Shape{3}, 0.5f);
  auto session_or = WorkerSession::Create(options, {{"w", &w, &w_grad}});
  ASSERT_TRUE(session_or.ok()) << session_or.status();
  WorkerSession& session = **session_or;
  PSFLOW_ASSERT_OK(session.Open());
  while (!session.ShouldStop()) PSFLOW_ASSERT_OK(session.Step(0.25));
  auto summary = session.Close([] {
    SessionEval eval;
    eval.scalars = {{"test_mse", 0.125}, {"test_mae", 0.5}};
    return eval;
  });
  ASSERT_TRUE(summary.ok()) << summary.status();
  PSFLOW_EXPECT_OK(cluster->servers[0]->Wait());

  std::vector<std::string> saved;
  for (const std::string& line : log) {
    if (line.rfind("saved checkpoint ", 0) == 0) saved.push_back(line);
  }
  ASSERT_EQ(saved.size(), 2u) << ::testing::PrintToString(log);
  EXPECT_NE(saved[0].find("model.ckpt-2."), std::string::npos) << saved[0];
  EXPECT_NE(saved[1].find("model.ckpt-4."), std::string::npos) << saved[1];

  ASSERT_EQ(summary->metrics.size(), 2u);
  const std::string text = FormatSummary(*summary);
  EXPECT_NE(text.find("stale_gradients_dropped=0 test_mse=0.125 test_mae=0.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\"test_mae\":0.5"), std::string::npos) << text;
  EXPECT_NE(text.find("\"test_mse\":0.125"), std::string::npos) << text;
  // No accuracy was given: the progress lines leave it out rather than print nan.
  const auto progress = std::find_if(log.begin(), log.end(),
                                     [](const std::string& l) { return l.rfind("step 4/4 loss 0.2500 ", 0) == 0; });
  ASSERT_NE(progress, log.end()) << ::testing::PrintToString(log);
  EXPECT_EQ(progress->find("accuracy"), std::string::npos) << *progress;
  std::filesystem::remove_all(dir);
}

// --overlap=push_pull over one ps: gradients handed over early (GradientReady), the pull in forward
// order behind Step (WaitForValues), SGD's update checked by hand; misuse of GradientReady refused.
TEST(WorkerSessionTest, OverlapHandsGradientsOverEarlyAndPullsBehindTheStep) {
  auto cluster = TestCluster::Start(1, 1);
  ASSERT_NE(cluster, nullptr);
  WorkerSession::Options options;
  options.train.job_name = "worker";
  options.train.ps_hosts = cluster->cluster.ps()[0];
  options.train.worker_hosts = cluster->cluster.workers()[0];
  options.train.optimizer = "sgd";
  options.train.learning_rate = 0.5f;
  options.train.lr_decay_steps = 0;
  options.train.train_steps = 3;
  options.train.overlap = "push_pull";
  options.waits_for_values = true;
  options.log = [](const std::string&) {};
  // A first layer of 512 KiB: an early part of its own, and pull groups of their own.
  Tensor a(Shape{256, 512}, 1.0f), a_grad(Shape{256, 512}, 1.0f);
  Tensor b(Shape{4}, 2.0f), b_grad(Shape{4}, 4.0f);
  auto session_or = WorkerSession::Create(options, {{"a", &a, &a_grad, nullptr}, {"b", &b, &b_grad, nullptr}});
  ASSERT_TRUE(session_or.ok()) << session_or.status();
  WorkerSession& session = **session_or;
  EXPECT_TRUE(absl::IsFailedPrecondition(session.GradientReady(0)));  // not open yet
  PSFLOW_ASSERT_OK(session.Open());
  EXPECT_EQ(session.ParameterIndex("b"), 1);
  EXPECT_EQ(session.ParameterIndex("c"), -1);
  for (int step = 1; step <= 3; ++step) {
    session.WaitForValues(0);  // the forward's first layer
    EXPECT_FLOAT_EQ(a[7], 1 - 0.5f * (step - 1));
    session.WaitForValues(1);
    EXPECT_FLOAT_EQ(b[3], 2 - 2.0f * (step - 1));
    PSFLOW_ASSERT_OK(session.GradientReady(1));  // backward: the last layer first
    PSFLOW_ASSERT_OK(session.GradientReady(0));
    absl::Status twice = session.GradientReady(0);
    EXPECT_TRUE(absl::IsInvalidArgument(twice)) << twice;
    EXPECT_NE(twice.message().find("'a' got a second gradient"), std::string::npos) << twice;
    EXPECT_TRUE(absl::IsInvalidArgument(session.GradientReady(2)));
    PSFLOW_ASSERT_OK(session.Step(1.0));
    EXPECT_EQ(session.global_step(), step);
  }
  session.WaitForValues();
  EXPECT_FLOAT_EQ(a[0], 1 - 0.5f * 3);
  EXPECT_FLOAT_EQ(b[0], 2 - 2.0f * 3);
  auto summary = session.Close();
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->global_step, 3);
}

TEST(WorkerSessionTest, RefusesBadParameters) {
  WorkerSession::Options options;
  options.train.job_name = "worker";
  options.train.ps_hosts = "127.0.0.1:1";
  options.train.worker_hosts = "127.0.0.1:2";
  Tensor a(Shape{2}), wrong_grad(Shape{3});
  auto twice = WorkerSession::Create(options, {{"a", &a}, {"a", &a}});
  EXPECT_TRUE(absl::IsInvalidArgument(twice.status()));
  EXPECT_NE(twice.status().message().find("'a' is given twice"), std::string::npos) << twice.status();
  auto shape = WorkerSession::Create(options, {{"a", &a, &wrong_grad}});
  EXPECT_NE(shape.status().message().find("gradient of parameter 'a' has shape [3]"), std::string::npos)
      << shape.status();
  options.train.job_name = "ps";
  auto ps = WorkerSession::Create(options, {{"a", &a}});
  EXPECT_NE(ps.status().message().find("needs a worker task"), std::string::npos) << ps.status();
}

// No cluster in the options: the session is worker 0 of a loopback cluster whose ps task runs in
// this process (train/in_process_ps.h): it trains, checkpoints, and a second session resumes from
// the checkpoint; an exception-like abort ends the task as well.
TEST(WorkerSessionTest, RunsAloneWithAnInProcessPsTask) {
  ASSERT_EQ(std::getenv("TF_CONFIG"), nullptr);
  const std::string dir = ::testing::TempDir() + "/session_alone";
  std::filesystem::remove_all(dir);
  auto run = [&](int64_t steps, std::vector<std::string>* log) -> absl::StatusOr<RunSummary> {
    WorkerSession::Options options;
    options.train.optimizer = "sgd";
    options.train.learning_rate = 0.25f;
    options.train.lr_decay_steps = 0;
    options.train.train_steps = steps;
    options.train.checkpoint_dir = dir;
    options.train.log_every = 2;
    options.model_name = "alone";
    options.log = [log](const std::string& line) { log->push_back(line); };
    Tensor w(Shape{3}, std::vector<float>{1, 2, 3});
    Tensor grad(Shape{3}, 1.0f);
    auto session = WorkerSession::Create(options, {{"w", &w, &grad}});
    if (!session.ok()) return session.status();
    if (auto s = (*session)->Open(); !s.ok()) return s;
    EXPECT_TRUE((*session)->is_chief());
    EXPECT_EQ((*session)->num_workers(), 1);
    EXPECT_EQ((*session)->num_ps(), 1);
    const float labels[] = {0, 1, 1, 0}, probabilities[] = {0.2f, 0.8f, 0.6f, 0.4f};
    EXPECT_TRUE(absl::IsInvalidArgument((*session)->AddClicks(labels, absl::MakeConstSpan(probabilities, 3))));
    while (!(*session)->ShouldStop()) {
      if (auto s = (*session)->AddClicks(labels, probabilities); !s.ok()) return s;
      if (auto s = (*session)->Step(0.5); !s.ok()) return s;
    }
    EXPECT_FLOAT_EQ(w[0], 1 - 0.25f * (*session)->global_step());  // the ps task's updates, pulled
    return (*session)->Close();
  };
  std::vector<std::string> log;
  auto first = run(4, &log);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->global_step, 4);
  EXPECT_EQ(first->workers, 1);
  const std::string joined = ::testing::PrintToString(log);
  EXPECT_NE(joined.find("standalone: no cluster flags and no TF_CONFIG: training in this process, with an "
                        "in-process ps task on 127.0.0.1:"),
            std::string::npos)
      << joined;
  EXPECT_NE(joined.find("ps task 0 serving on 127.0.0.1:"), std::string::npos) << joined;
  // The clicks added since the last line: a running AUC (every positive above every negative) and
  // log-loss (-ln 0.8, -ln 0.6 averaged over the four: 0.3670).
  EXPECT_NE(joined.find("step 4/4 loss 0.5000 auc 1.0000 log_loss 0.3670 worker examples/s"), std::string::npos)
      << joined;
  // Resumed from the checkpoint the first run saved, to a later step.
  log.clear();
  auto second = run(6, &log);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->global_step, 6);
  EXPECT_NE(::testing::PrintToString(log).find("at global step 4"), std::string::npos) << ::testing::PrintToString(log);

  // An abort (the caller's loop failed) ends the in-process task too: Abort returns.
  WorkerSession::Options options;
  options.train.train_steps = 100;
  options.log = [](const std::string&) {};
  Tensor w(Shape{1}, 0.0f);
  auto session = WorkerSession::Create(options, {{"w", &w}});
  ASSERT_TRUE(session.ok()) << session.status();
  PSFLOW_ASSERT_OK((*session)->Open());
  (*session)->Abort(absl::InternalError("the caller's loop failed"));
  std::filesystem::remove_all(dir);
}

// A loopback port free a moment ago (bound to port 0, then closed).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// Hybrid sync (--sync_replicas --table_sync=async) names itself "hybrid" in the summary, on the
// progress line and in Prometheus' psflow_training_mode; plain sync stays "sync".
TEST(WorkerSessionTest, HybridNamesItselfInTheSummaryTheProgressLineAndPrometheus) {
  for (const std::string table_sync : {"async", "sync"}) {
    const std::string mode = table_sync == "async" ? "hybrid" : "sync";
    SCOPED_TRACE(mode);
    WorkerSession::Options options;
    options.train.sync_replicas = true;
    options.train.table_sync = table_sync;
    options.train.optimizer = "sgd";
    options.train.train_steps = 2;
    options.train.log_every = 1;
    options.train.metrics_port = FreePort();
    options.model_name = "modes";
    std::vector<std::string> log;
    options.log = [&log](const std::string& line) { log.push_back(line); };
    Tensor w(Shape{3}, std::vector<float>{1, 2, 3});
    Tensor grad(Shape{3}, 1.0f);
    auto session = WorkerSession::Create(options, {{"w", &w, &grad}});
    ASSERT_TRUE(session.ok()) << session.status();
    PSFLOW_ASSERT_OK((*session)->Open());
    while (!(*session)->ShouldStop()) PSFLOW_ASSERT_OK((*session)->Step(0.5));
    httplib::Client client("127.0.0.1", options.train.metrics_port);
    client.set_connection_timeout(5);
    client.set_read_timeout(5);
    httplib::Result scraped = client.Get("/metrics");
    ASSERT_TRUE(scraped) << httplib::to_string(scraped.error());
    EXPECT_NE(scraped->body.find("psflow_training_mode{mode=\"" + mode + "\"} 1\n"), std::string::npos)
        << scraped->body;
    auto summary = (*session)->Close();
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->mode, mode);
    EXPECT_NE(FormatSummary(*summary).find(" mode=" + mode + " "), std::string::npos) << FormatSummary(*summary);
    const std::string joined = ::testing::PrintToString(log);
    EXPECT_EQ(joined.find("hybrid: step 2/2 loss") != std::string::npos, mode == "hybrid") << joined;
    EXPECT_NE(joined.find("step 2/2 loss"), std::string::npos) << joined;
  }
}

TEST(CheckMetricName, RefusesEmptyOddAndTheSummarysOwnKeys) {
  PSFLOW_EXPECT_OK(CheckMetricName("validation_perplexity"));
  PSFLOW_EXPECT_OK(CheckMetricName("eval/bits-per-char.v2"));
  PSFLOW_EXPECT_OK(CheckMetricName("test_accuracy"));  // a field of the summary, set by name
  EXPECT_TRUE(absl::IsInvalidArgument(CheckMetricName("")));
  EXPECT_TRUE(absl::IsInvalidArgument(CheckMetricName("loss value")));
  const absl::Status s = CheckMetricName("global_step");
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("'global_step' is a key of the summary itself"), std::string::npos) << s;
}

}  // namespace
}  // namespace psflow::train
