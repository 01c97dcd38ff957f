// The pull in forward order (train/forward_pulls.h) with --transfer_slice_bytes, through a
// WorkerSession against a real ps over gRPC on loopback, one async worker: a big first layer's
// gradient, handed over during backward, goes in slices whose values come back before the step,
// the layer's forward waits for them alone, and the worker holds the same bits after every step as
// without slices (SGD's update checked by hand too).
#include <vector>

#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"
#include "psflow/train/session.h"

namespace psflow::train {
namespace {

using ps::testing::TestCluster;

// a [256, 512] (512 KiB: sliced at 64 KiB), b [4] and c [75, 1024] (300 KiB): three pull groups
// (with two or fewer a deferring session takes its values from the push's answer instead); each
// step's gradients differ.
struct Values {
  std::vector<Tensor> a, b, c;
  int64_t push_calls_bytes = 0;  // what the ps tasks received (payload with headers: more calls, more bytes)
};

Values TrainThreeSteps(int64_t slice_bytes) {
  Values seen;
  auto cluster = TestCluster::Start(2, 1);
  EXPECT_NE(cluster, nullptr);
  if (cluster == nullptr) return seen;
  WorkerSession::Options options;
  options.train.job_name = "worker";
  options.train.ps_hosts = absl::StrCat(cluster->cluster.ps()[0], ",", cluster->cluster.ps()[1]);
  options.train.worker_hosts = cluster->cluster.workers()[0];
  options.train.optimizer = "sgd";
  options.train.train_steps = 3;
  options.train.learning_rate = 0.5f;
  options.train.lr_decay_steps = 0;
  options.train.partitioner = "fixed:2";
  options.train.overlap = "push_pull";
  options.train.transfer_slice_bytes = slice_bytes;
  options.waits_for_values = true;
  options.log = [](const std::string&) {};
  Tensor a(Shape{256, 512}, 1.0f), a_grad(Shape{256, 512});
  Tensor b(Shape{4}, 2.0f), b_grad(Shape{4});
  Tensor c(Shape{75, 1024}, -1.0f), c_grad(Shape{75, 1024});
  auto session_or = WorkerSession::Create(
      options, {{"a", &a, &a_grad, nullptr}, {"b", &b, &b_grad, nullptr}, {"c", &c, &c_grad, nullptr}});
  EXPECT_TRUE(session_or.ok()) << session_or.status();
  if (!session_or.ok()) return seen;
  WorkerSession& session = **session_or;
  EXPECT_TRUE(session.Open().ok());
  for (int step = 1; step <= 3; ++step) {
    session.WaitForValues(0);  // the forward's first layer
    session.WaitForValues(1);
    session.WaitForValues(2);
    seen.a.push_back(a);
    seen.b.push_back(b);
    seen.c.push_back(c);
    for (int64_t i = 0; i < c_grad.size(); ++i) c_grad[i] = 0.002f * static_cast<float>((i + step) % 13);
    for (int64_t i = 0; i < a_grad.size(); ++i) a_grad[i] = 0.001f * static_cast<float>((i * step) % 97) - 0.03f;
    for (int64_t i = 0; i < b_grad.size(); ++i) b_grad[i] = 0.25f * static_cast<float>(i + step);
    EXPECT_TRUE(session.GradientReady(2).ok());  // backward: the last layer first
    EXPECT_TRUE(session.GradientReady(1).ok());
    EXPECT_TRUE(session.GradientReady(0).ok());  // a's gradient: an early part (in slices)
    EXPECT_TRUE(session.Step(1.0).ok());
    EXPECT_EQ(session.global_step(), step);
  }
  session.WaitForValues();
  seen.a.push_back(a);
  seen.b.push_back(b);
  seen.c.push_back(c);
  EXPECT_TRUE(session.Close().ok());
  for (const auto& server : cluster->servers) seen.push_calls_bytes += server->Stats().bytes_in;
  return seen;
}

TEST(ForwardPullsTest, SlicesPulledBackGiveTheSameBitsAsWholePulls) {
  const Values whole = TrainThreeSteps(0);
  const Values sliced = TrainThreeSteps(64 << 10);
  ASSERT_EQ(whole.a.size(), 4u);
  ASSERT_EQ(sliced.a.size(), 4u);
  for (size_t k = 0; k < whole.a.size(); ++k) {
    for (int64_t i = 0; i < whole.a[k].size(); ++i)
      ASSERT_EQ(sliced.a[k][i], whole.a[k][i]) << "a, step " << k << ", " << i;
    for (int64_t i = 0; i < whole.b[k].size(); ++i)
      ASSERT_EQ(sliced.b[k][i], whole.b[k][i]) << "b, step " << k << ", " << i;
    for (int64_t i = 0; i < whole.c[k].size(); ++i)
      ASSERT_EQ(sliced.c[k][i], whole.c[k][i]) << "c, step " << k << ", " << i;
  }
  // The slices went as calls of their own (each with its header), the same floats in all.
  EXPECT_GT(sliced.push_calls_bytes, whole.push_calls_bytes);
  EXPECT_LT(sliced.push_calls_bytes, whole.push_calls_bytes + 4096);
  // SGD by hand: a[i] after three steps.
  for (int64_t i : {int64_t{0}, int64_t{1000}, int64_t{131071}}) {
    float want = 1.0f;
    for (int step = 1; step <= 3; ++step) want -= 0.5f * (0.001f * static_cast<float>((i * step) % 97) - 0.03f);
    EXPECT_FLOAT_EQ(sliced.a.back()[i], want) << i;
  }
}

}  // namespace
}  // namespace psflow::train
