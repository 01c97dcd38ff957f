// SyncAccumulator (SyncReplicasOptimizer semantics) as a unit: real Shards and a real SGD
// optimizer, gradients in real decoded messages, time from a ManualClock — no sockets, no
// sleeping. Interleavings that need a push "still accumulating" are made deterministic by acting
// from inside that push's accumulate step. Also the clocks themselves (ps/common/clock.h).
#include "ps/server/sync_accumulator.h"

#include <map>
#include <optional>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/common/wire_config.h"
#include "ps/server/shard.h"
#include "psflow/optim/optimizer.h"

namespace psflow::ps {
namespace {

using ::testing::HasSubstr;
using Outcome = SyncAccumulator::Outcome;

constexpr float kLr = 0.5f;
const std::vector<float> kInitial = {1.0f, 2.0f, 3.0f, 4.0f};

class SyncAccumulatorTest : public ::testing::Test {
 protected:
  SyncAccumulatorTest() {
    auto clock = std::make_unique<ManualClock>();
    clock_ = clock.get();
    acc_ = std::make_unique<SyncAccumulator>(
        &step_, [this](const std::string& line) { log_.push_back(line); }, std::move(clock));
    optim::OptimizerConfig sgd;
    sgd.name = "sgd";
    optimizer_ = *optim::MakeOptimizer(sgd);
    shard_ =
        std::make_unique<Shard>("w", Shape{4}, FloatBuffer(kInitial.begin(), kInitial.end()), optimizer_->NewState(4));
  }

  // R of T, timing out after `timeout`; expected workers 0..T-1.
  void Configure(int r, int t, absl::Duration timeout = absl::Seconds(30)) {
    SyncAccumulator::Config c;
    c.replicas_to_aggregate = r;
    c.total_num_replicas = t;
    c.timeout = timeout;
    for (int w = 0; w < t; ++w) c.expected_workers.push_back(w);
    c.apply = [this](int count, int64_t step) {
      applied_counts_.push_back(count);
      shard_->ApplyAccumulated(count, *optimizer_, kLr);
    };
    epoch_ = acc_->Reconfigure(std::move(c), absl::FailedPreconditionError(kNotInitializedMessage));
  }

  // Worker `worker` pushes `grad` computed at `tag`; its answer lands in outcome_[worker].
  // `during` runs while this push accumulates (counted, not yet finished).
  void Push(int worker, int64_t tag, const std::vector<float>& grad, std::function<void()> during = nullptr,
            std::optional<uint64_t> epoch = std::nullopt) {
    wire::TensorList list;
    wire::TensorMeta* meta = list.add_tensors();
    meta->set_name("w");
    meta->add_shape(4);
    auto bytes = std::make_shared<std::vector<float>>(grad);
    auto message = rpc::IncomingMessage::Make(
        "", list, {{reinterpret_cast<const char*>(bytes->data()), bytes->size() * sizeof(float)}}, bytes,
        static_cast<int64_t>(bytes->size() * sizeof(float)));
    ASSERT_TRUE(message.ok()) << message.status();
    ShardGradient g;
    ASSERT_TRUE(shard_->DecodeGradient(*message, 0, &g).ok());
    outcome_.erase(worker);
    acc_->Push(
        epoch.value_or(epoch_), worker, tag,
        [&] {
          shard_->Accumulate(g);
          if (during) during();
        },
        [this, worker](absl::StatusOr<Outcome> o) {
          ASSERT_FALSE(outcome_.contains(worker)) << "worker " << worker << " answered twice";
          outcome_.emplace(worker, std::move(o));
        });
  }

  std::vector<float> Values() {
    std::shared_ptr<const FloatBuffer> v = shard_->Snapshot();
    return std::vector<float>(v->begin(), v->end());
  }
  bool Answered(int worker) const { return outcome_.contains(worker); }
  Outcome Ok(int worker) {
    auto it = outcome_.find(worker);
    EXPECT_NE(it, outcome_.end()) << "worker " << worker << " not answered";
    if (it == outcome_.end() || !it->second.ok()) {
      ADD_FAILURE() << "worker " << worker << ": " << (it == outcome_.end() ? "-" : it->second.status().ToString());
      return {-1, false};
    }
    return *it->second;
  }

  std::atomic<int64_t> step_{0};
  std::vector<std::string> log_;
  ManualClock* clock_;  // owned by acc_
  std::unique_ptr<SyncAccumulator> acc_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<Shard> shard_;
  uint64_t epoch_ = 0;
  std::vector<int> applied_counts_;
  std::map<int, absl::StatusOr<Outcome>> outcome_;
};

// The barrier's accounting by the clock: each counted push's wait from its arrival to the quorum,
// the step's first arrival to its quorum; a stale push is not counted.
TEST_F(SyncAccumulatorTest, TimingCountsEachPushsWaitForTheQuorum) {
  Configure(3, 3);
  Push(0, 0, {1, 1, 1, 1});
  clock_->Advance(absl::Milliseconds(4));
  Push(2, 0, {1, 1, 1, 1});
  clock_->Advance(absl::Milliseconds(6));
  Push(1, 0, {1, 1, 1, 1});  // the quorum: worker 0 waited 10 ms, worker 2 6 ms, worker 1 none
  EXPECT_EQ(Ok(0).step, 1);
  Push(1, 0, {1, 1, 1, 1});  // stale: dropped, not counted
  EXPECT_TRUE(Ok(1).stale);
  const SyncAccumulator::Timing t = acc_->timing();
  EXPECT_EQ(t.steps, 1);
  EXPECT_EQ(t.pushes, 3);
  EXPECT_DOUBLE_EQ(t.wait_secs, 0.016);
  EXPECT_DOUBLE_EQ(t.spread_secs, 0.010);
  EXPECT_EQ(t.apply_secs, 0);  // the manual clock stands still while the step applies and answers
  EXPECT_EQ(t.answer_secs, 0);
}

TEST_F(SyncAccumulatorTest, MeanOfRGradientsIsAppliedOnceAndTheStepAdvances) {
  Configure(2, 2);
  Push(0, 0, {1, 1, 1, 1});
  EXPECT_FALSE(Answered(0));  // waits for the second push: R = 2
  EXPECT_EQ(Values(), kInitial);
  EXPECT_EQ(step_.load(), 0);
  Push(1, 0, {3, -1, 5, 0});
  EXPECT_EQ(Ok(0).step, 1);
  EXPECT_EQ(Ok(1).step, 1);
  EXPECT_FALSE(Ok(0).stale || Ok(1).stale);
  EXPECT_EQ(step_.load(), 1);
  EXPECT_EQ(applied_counts_, std::vector<int>{2});
  // w -= lr * (g0 + g1) / 2
  EXPECT_EQ(Values(), (std::vector<float>{1 - 0.5f * 2, 2 - 0.5f * 0, 3 - 0.5f * 3, 4 - 0.5f * 0.5f}));
  // The next step starts empty.
  Push(1, 1, {2, 2, 2, 2});
  EXPECT_FALSE(Answered(1));
  Push(0, 1, {0, 0, 0, 0});
  EXPECT_EQ(Ok(0).step, 2);
  EXPECT_EQ(Values()[0], 0.0f - 0.5f * 1);
  EXPECT_EQ(acc_->stale_dropped(), 0);
}

TEST_F(SyncAccumulatorTest, StaleTaggedGradientIsDroppedCountedAndAnsweredAtOnce) {
  Configure(1, 2);  // R = 1: every push completes a step
  Push(0, 0, {1, 1, 1, 1});
  EXPECT_EQ(Ok(0).step, 1);
  const std::vector<float> before = Values();
  Push(1, 0, {100, 100, 100, 100});  // computed at step 0, now 1
  ASSERT_TRUE(Answered(1));
  EXPECT_TRUE(Ok(1).stale);
  EXPECT_EQ(Ok(1).step, 1);
  EXPECT_EQ(Values(), before);
  EXPECT_EQ(step_.load(), 1);
  EXPECT_EQ(acc_->stale_dropped(), 1);
  // A tag newer than the step joins the current step (TF's ConditionalAccumulator).
  Push(1, 7, {2, 2, 2, 2});
  EXPECT_FALSE(Ok(1).stale);
  EXPECT_EQ(Ok(1).step, 2);
}

TEST_F(SyncAccumulatorTest, BackupWorkersLateGradientIsDropped) {
  Configure(2, 3);  // one backup
  // Worker 2 arrives once the quorum is complete but before the step is applied (worker 1 still
  // accumulating): dropped although its tag is current.
  Push(0, 0, {1, 0, 0, 0});
  Push(1, 0, {0, 1, 0, 0}, [&] { Push(2, 0, {100, 100, 100, 100}); });
  EXPECT_TRUE(Ok(2).stale);
  EXPECT_EQ(Ok(2).step, 0);
  EXPECT_EQ(Ok(0).step, 1);
  EXPECT_EQ(Ok(1).step, 1);
  EXPECT_EQ(applied_counts_, std::vector<int>{2});
  EXPECT_EQ(Values(), (std::vector<float>{1 - 0.25f, 2 - 0.25f, 3, 4}));
  // ...and after the step is applied, its old tag makes it stale too.
  Push(2, 0, {100, 100, 100, 100});
  EXPECT_TRUE(Ok(2).stale);
  EXPECT_EQ(acc_->stale_dropped(), 2);
  EXPECT_EQ(acc_->Quorum(), 2);  // a backup never counts as missing
}

TEST_F(SyncAccumulatorTest, TimeoutAppliesWhatArrivedDropsTheMissingWorkerWhoRejoinsByPushing) {
  Configure(2, 2, absl::Seconds(30));
  Push(0, 0, {2, 2, 2, 2});
  clock_->Advance(absl::Seconds(29));
  EXPECT_FALSE(Answered(0));
  clock_->Advance(absl::Seconds(1));
  EXPECT_EQ(Ok(0).step, 1);
  EXPECT_EQ(applied_counts_, std::vector<int>{1});  // the mean of what arrived
  EXPECT_EQ(Values(), (std::vector<float>{0, 1, 2, 3}));
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_THAT(log_[0], HasSubstr("sync step 0: applying 1 gradient(s) after waiting 30 s for 2"));
  EXPECT_THAT(log_[0], HasSubstr("missing worker(s) 1"));
  // Worker 1 is out of the quorum: worker 0 alone completes the next step at once.
  EXPECT_EQ(acc_->Quorum(), 1);
  Push(0, 1, {0, 0, 0, 0});
  EXPECT_EQ(Ok(0).step, 2);
  // Worker 1 pushes again (at the current step): back in the quorum, so its push waits for 0's.
  Push(1, 2, {4, 4, 4, 4});
  EXPECT_EQ(acc_->Quorum(), 2);
  EXPECT_FALSE(Answered(1));
  Push(0, 2, {0, 0, 0, 0});
  EXPECT_EQ(Ok(1).step, 3);
  EXPECT_EQ(Ok(0).step, 3);
  EXPECT_EQ(applied_counts_, (std::vector<int>{1, 1, 2}));
  EXPECT_EQ(Values(), (std::vector<float>{-1, 0, 1, 2}));
  EXPECT_EQ(log_.size(), 1u);       // no timeout for the steps that completed
  EXPECT_EQ(clock_->pending(), 0);  // and their timers are gone
}

TEST_F(SyncAccumulatorTest, StalePushAlsoBringsADroppedWorkerBack) {
  Configure(2, 2, absl::Seconds(5));
  Push(0, 0, {0, 0, 0, 0});
  clock_->Advance(absl::Seconds(5));
  EXPECT_EQ(acc_->Quorum(), 1);
  Push(1, 0, {0, 0, 0, 0});  // tagged before the timed-out step: stale
  EXPECT_TRUE(Ok(1).stale);
  EXPECT_EQ(acc_->Quorum(), 2);
}

TEST_F(SyncAccumulatorTest, TimeoutWhileAPushAccumulatesLetsThatPushFinishTheStep) {
  Configure(3, 3, absl::Seconds(10));
  Push(0, 0, {1, 1, 1, 1});
  Push(1, 0, {3, 3, 3, 3}, [&] { clock_->Advance(absl::Seconds(10)); });
  EXPECT_EQ(Ok(0).step, 1);
  EXPECT_EQ(Ok(1).step, 1);
  EXPECT_EQ(applied_counts_, std::vector<int>{2});
  EXPECT_EQ(Values(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_THAT(log_.at(0), HasSubstr("missing worker(s) 2"));
}

TEST_F(SyncAccumulatorTest, TimeoutFiringLateAfterAFreezeWaitsAgainInsteadOfDroppingWorkers) {
  Configure(2, 2, absl::Seconds(30));
  Push(0, 0, {2, 2, 2, 2});
  clock_->Jump(absl::Seconds(40));        // this task did not run (SIGSTOP): worker 1's push may be unread
  clock_->Advance(absl::ZeroDuration());  // the overdue timeout runs now, 10 s late
  EXPECT_FALSE(Answered(0));
  EXPECT_EQ(acc_->Quorum(), 2);
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_THAT(log_[0], HasSubstr("did not run for 10 s or more (frozen?); the step waits 30 s again"));
  Push(1, 0, {0, 0, 0, 0});  // the push that waited in the socket completes the step
  EXPECT_EQ(Ok(0).step, 1);
  EXPECT_EQ(applied_counts_, std::vector<int>{2});
  // Had it not come, the next (punctual) timeout would have applied what arrived.
  Push(0, 1, {0, 0, 0, 0});
  clock_->Advance(absl::Seconds(30));
  EXPECT_EQ(Ok(0).step, 2);
  EXPECT_THAT(log_.back(), HasSubstr("missing worker(s) 1"));
}

// A worker held up by another ps task (it waits for that task's answer before it can push here)
// sends heartbeats: the step waits for it instead of dropping it, so both ps tasks count the same
// gradients. Once it falls silent for the whole timeout it is dropped as before.
TEST_F(SyncAccumulatorTest, HeartbeatingWorkerIsWaitedForUntilSilentForTheTimeout) {
  Configure(2, 2, absl::Seconds(4));
  Push(0, 0, {2, 2, 2, 2});
  for (int beat = 0; beat < 5; ++beat) {  // 5 s of heartbeats, one a second
    clock_->Advance(absl::Seconds(1));
    acc_->Heard(1);
  }
  EXPECT_FALSE(Answered(0));
  EXPECT_EQ(acc_->Quorum(), 2);
  ASSERT_EQ(log_.size(), 1u);  // logged once, not per re-armed timeout
  EXPECT_THAT(log_[0], HasSubstr("sync step 0: worker(s) 1 did not push within 4 s but are alive"));
  Push(1, 0, {0, 0, 0, 0});  // its push arrives: the step has both gradients
  EXPECT_EQ(Ok(0).step, 1);
  EXPECT_EQ(applied_counts_, std::vector<int>{2});
  EXPECT_EQ(Values(), (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));

  // Heartbeats stop: 4 s after the last one the step applies what arrived and drops worker 1.
  Push(0, 1, {0, 0, 0, 0});
  clock_->Advance(absl::Seconds(3));
  acc_->Heard(1);
  clock_->Advance(absl::Seconds(1));  // the step's own timeout: worker 1 was heard 1 s ago
  EXPECT_FALSE(Answered(0));
  clock_->Advance(absl::Seconds(2.9));
  EXPECT_FALSE(Answered(0));
  clock_->Advance(absl::Seconds(0.1));  // silent for 4 s
  EXPECT_EQ(Ok(0).step, 2);
  EXPECT_EQ(acc_->Quorum(), 1);
  EXPECT_THAT(log_.back(), HasSubstr("missing worker(s) 1"));
  // A dropped worker's heartbeats do not hold later steps (only a push brings it back).
  acc_->Heard(1);
  Push(0, 2, {0, 0, 0, 0});
  EXPECT_EQ(Ok(0).step, 3);
}

TEST_F(SyncAccumulatorTest, HeartbeatsDoNotHoldAStepForAnotherSilentWorkerBeyondTheTimeout) {
  Configure(3, 3, absl::Seconds(4));
  Push(0, 0, {3, 3, 3, 3});
  clock_->Advance(absl::Seconds(1));
  acc_->Heard(1);  // worker 1 alive once; worker 2 never heard
  clock_->Advance(absl::Seconds(3));
  EXPECT_FALSE(Answered(0));  // worker 1 was heard within the timeout: wait
  clock_->Advance(absl::Seconds(0.9));
  EXPECT_FALSE(Answered(0));
  clock_->Advance(absl::Seconds(0.1));  // 4 s after its heartbeat: both are dropped
  EXPECT_EQ(Ok(0).step, 1);
  EXPECT_THAT(log_.back(), HasSubstr("missing worker(s) 1, 2"));
  EXPECT_EQ(acc_->Quorum(), 1);
}

TEST_F(SyncAccumulatorTest, ReinitializationReleasesHeldPushesAsNotInitialized) {
  Configure(2, 2);
  const uint64_t old_epoch = epoch_;
  Push(0, 0, {1, 1, 1, 1});
  ASSERT_FALSE(Answered(0));
  Configure(2, 2);  // the chief's Initialize (a restore)
  ASSERT_TRUE(Answered(0));
  EXPECT_EQ(outcome_.at(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(outcome_.at(0).status().message(), HasSubstr(kNotInitializedMessage));
  // A push validated against the old model (a race with Initialize) is told the same.
  Push(1, 0, {1, 1, 1, 1}, nullptr, old_epoch);
  EXPECT_THAT(outcome_.at(1).status().message(), HasSubstr(kNotInitializedMessage));
  EXPECT_TRUE(applied_counts_.empty());
  EXPECT_EQ(step_.load(), 0);
  EXPECT_EQ(clock_->pending(), 0);  // the released step's timeout is gone with it
  // The new configuration's step starts empty: two fresh pushes complete it.
  Push(0, 0, {2, 2, 2, 2});
  EXPECT_FALSE(Answered(0));
  Push(1, 0, {2, 2, 2, 2});
  EXPECT_EQ(Ok(0).step, 1);
  EXPECT_EQ(applied_counts_, std::vector<int>{2});
}

TEST_F(SyncAccumulatorTest, ReleaseAnswersHeldPushesWithTheGivenStatus) {
  Configure(2, 2);
  Push(0, 0, {1, 1, 1, 1});
  acc_->Release(absl::OutOfRangeError("training finished at step 0"));
  EXPECT_EQ(outcome_.at(0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Values(), kInitial);
}

TEST_F(SyncAccumulatorTest, DepartedWorkerLeavesTheQuorumAndRejoinsAfterHello) {
  Configure(2, 2);
  Push(0, 0, {2, 2, 2, 2});
  acc_->Depart(1);  // Goodbye: the held step completes without a timeout
  EXPECT_EQ(Ok(0).step, 1);
  EXPECT_TRUE(log_.empty());
  acc_->Rejoin(1);
  EXPECT_EQ(acc_->Quorum(), 2);
}

TEST_F(SyncAccumulatorTest, BackupsAbsorbMissingWorkersBeforeTheQuorumShrinks) {
  Configure(2, 4);  // two backups
  acc_->Depart(3);
  acc_->Depart(2);
  EXPECT_EQ(acc_->Quorum(), 2);
  acc_->Depart(1);
  EXPECT_EQ(acc_->Quorum(), 1);
  acc_->Depart(0);
  EXPECT_EQ(acc_->Quorum(), 1);  // never below 1
}

// --- Clocks ---------------------------------------------------------------------------------

TEST(ClockTest, ManualClockRunsDueCallbacksInOrderOnAdvance) {
  ManualClock clock;
  const absl::Time t0 = clock.Now();
  std::vector<std::string> ran;
  clock.Schedule(t0 + absl::Seconds(2), [&] { ran.push_back("b@" + absl::FormatDuration(clock.Now() - t0)); });
  clock.Schedule(t0 + absl::Seconds(1), [&] { ran.push_back("a@" + absl::FormatDuration(clock.Now() - t0)); });
  const Clock::TimerId c = clock.Schedule(t0 + absl::Seconds(1), [&] { ran.push_back("cancelled"); });
  clock.Cancel(c);
  clock.Advance(absl::Milliseconds(999));
  EXPECT_TRUE(ran.empty());
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(ran, (std::vector<std::string>{"a@1s", "b@2s"}));
  EXPECT_EQ(clock.Now() - t0, absl::Milliseconds(5999));
  EXPECT_EQ(clock.pending(), 0);
}

TEST(ClockTest, SystemClockRunsACallbackOnItsThreadAndCancelDropsOne) {
  absl::Notification ran;
  std::atomic<bool> cancelled_ran{false};
  {
    SystemClock clock;
    const Clock::TimerId id = clock.Schedule(clock.Now() + absl::Milliseconds(1), [&] { cancelled_ran = true; });
    clock.Cancel(id);
    clock.Schedule(clock.Now() + absl::Milliseconds(2), [&] { ran.Notify(); });
    EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
    // Destroyed with a callback pending far in the future: dropped, not waited for.
    clock.Schedule(clock.Now() + absl::Hours(1), [&] { cancelled_ran = true; });
  }
  EXPECT_FALSE(cancelled_ran.load());
}

}  // namespace
}  // namespace psflow::ps
