// The chief's evaluation beside training (train/eval_beside.h): checkpoints handed over from another
// thread are evaluated in order on the evaluation thread, each result taken once with its step and
// file; a checkpoint still waiting when a newer one comes is replaced (and counted); Finish waits for
// the last one; a failed evaluation is a result too. No timing: the evaluation is held on a gate.
#include "train/eval_beside.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace psflow::train {
namespace {

SessionEval Scalar(double value) {
  SessionEval eval;
  eval.scalars = {{"test_auc", value}};
  return eval;
}

TEST(EvalBesideTest, EvaluatesEachCheckpointInOrderAndFinishWaitsForTheLast) {
  std::vector<std::string> seen;  // on the evaluation thread only
  EvalBeside beside([&seen](const std::string& path) -> absl::StatusOr<SessionEval> {
    seen.push_back(path);
    return Scalar(static_cast<double>(seen.size()));
  });
  std::thread saver([&] { beside.Submit(10, "ckpt-10"); });  // as the chief's save thread does
  saver.join();
  beside.Finish();
  beside.Submit(20, "ckpt-20");
  beside.Finish();
  std::vector<EvalBeside::Result> results = beside.TakeResults();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].global_step, 10);
  EXPECT_EQ(results[0].path, "ckpt-10");
  ASSERT_TRUE(results[0].eval.ok());
  EXPECT_EQ(results[0].eval->scalars[0].second, 1);
  EXPECT_EQ(results[1].global_step, 20);
  EXPECT_EQ(results[1].eval->scalars[0].second, 2);
  EXPECT_EQ(results[1].replaced, 0);
  EXPECT_TRUE(beside.TakeResults().empty());  // each result once
  EXPECT_EQ(seen, (std::vector<std::string>{"ckpt-10", "ckpt-20"}));
}

TEST(EvalBesideTest, AWaitingCheckpointIsReplacedByANewerOneAndFailuresAreResults) {
  absl::Notification started, gate;
  EvalBeside beside([&](const std::string& path) -> absl::StatusOr<SessionEval> {
    if (path == "ckpt-10") {
      started.Notify();
      gate.WaitForNotification();  // held until 20 and 30 have come
    }
    if (path == "ckpt-30") return absl::DataLossError("ckpt-30: truncated");
    return Scalar(0.5);
  });
  beside.Submit(10, "ckpt-10");
  started.WaitForNotification();
  beside.Submit(20, "ckpt-20");  // waits behind 10 ...
  beside.Submit(30, "ckpt-30");  // ... and is replaced by 30
  gate.Notify();
  beside.Finish();
  std::vector<EvalBeside::Result> results = beside.TakeResults();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].global_step, 10);
  EXPECT_TRUE(results[0].eval.ok());
  EXPECT_EQ(results[1].global_step, 30);
  EXPECT_EQ(results[1].replaced, 1);
  EXPECT_EQ(results[1].eval.status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace psflow::train
