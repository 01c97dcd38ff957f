// Delta pulls (rpc/delta_pull.h): the encoder and decoder through the message coding, exactly
// (the worker's copy equals the ps's bit for bit), with lost answers, claimed keys, a restarted
// ps, non-finite values and runs of a pull in parts; then end to end through MakeChannel /
// StartServer over gRPC and shared memory.
#include "rpc/delta_pull.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/tensor_coding.h"

namespace psflow::rpc {
namespace {

using ::testing::HasSubstr;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

OutgoingMessage PullOf(const std::vector<std::string>& shards) {
  wire::PullRequest pull;
  for (const std::string& s : shards) pull.add_shards(s);
  return OutgoingMessage::Of(pull);
}

// The ps's answer: `values` of shard `name` in `dtype`.
OutgoingMessage Answer(const std::string& name, const std::vector<float>& values, WireDtype dtype) {
  OutgoingMessage m;
  OutgoingTensor t;
  t.meta.set_name(name);
  t.meta.add_shape(static_cast<int64_t>(values.size()));
  t.meta.set_dtype(WireDtypeName(dtype));
  auto owned = std::make_shared<std::vector<float>>(values);
  t.data = owned->data();
  t.num_floats = static_cast<int64_t>(owned->size());
  t.owner = owned;
  m.tensors.push_back(std::move(t));
  return m;
}

// Through the wire format, as a transport delivers it.
IncomingMessage Travel(OutgoingMessage m) {
  absl::StatusOr<IncomingMessage> got = DecodeMessage(EncodeMessage(std::move(m)));
  CHECK(got.ok()) << got.status();
  return *std::move(got);
}

std::vector<float> Values(const IncomingMessage& m, int i = 0) {
  std::vector<float> v(static_cast<size_t>(m.num_floats(i)));
  m.CopyTo(i, v.data());
  return v;
}

// A worker and a ps exchanging pulls of one shard.
struct Pair {
  DeltaEncoder encoder;
  DeltaDecoder decoder;
  // One pull of `name` answered with `w`; the answer as the worker reads it.
  IncomingMessage Pull(const std::string& name, const std::vector<float>& w, WireDtype dtype = WireDtype::kBFloat16) {
    OutgoingMessage request = PullOf({name});
    const std::vector<std::string> claimed = decoder.Announce(Method::kPull, &request);
    const IncomingMessage at_ps = Travel(std::move(request));
    OutgoingMessage answer = Answer(name, w, dtype);
    encoder.Encode(at_ps.delta_announcement(), &answer);
    absl::StatusOr<IncomingMessage> got = decoder.Decode(Travel(std::move(answer)), claimed);
    decoder.Release(claimed);
    CHECK(got.ok()) << got.status();
    return *std::move(got);
  }
};

std::vector<float> RandomWalk(std::mt19937& rng, std::vector<float> w, float step) {
  std::normal_distribution<float> d(0.0f, step);
  for (float& x : w) x += d(rng);
  return w;
}

TEST(DeltaPullTest, WorkerCopyTracksThePsValuesUpToTheRoundingOfAStep) {
  for (WireDtype dtype : {WireDtype::kBFloat16, WireDtype::kFloat16}) {
    Pair p;
    std::mt19937 rng(7);
    std::vector<float> w(5000);
    std::normal_distribution<float> init(0.0f, 0.1f);
    for (float& x : w) x = init(rng);

    // First pull: plainly rounded (the worker has not announced itself yet).
    IncomingMessage first = p.Pull("w", w, dtype);
    EXPECT_EQ(first.dtype(0), dtype);
    EXPECT_EQ(first.meta(0).delta_seq(), 0u);
    // Second: the values themselves, exactly.
    w = RandomWalk(rng, w, 1e-3f);
    IncomingMessage second = p.Pull("w", w, dtype);
    EXPECT_EQ(second.dtype(0), WireDtype::kFloat32);
    EXPECT_NE(second.meta(0).delta_seq(), 0u);
    EXPECT_EQ(second.meta(0).delta_base(), 0u);
    EXPECT_EQ(Values(second), w);
    // Then deltas: 16-bit on the wire, read as float32, within one rounding of the step's change.
    std::vector<float> reference = w;  // the ps's copy, replayed with the public step
    for (int step = 0; step < 20; ++step) {
      const std::vector<float> before = w;
      w = RandomWalk(rng, w, 1e-3f);
      IncomingMessage got = p.Pull("w", w, dtype);
      ASSERT_EQ(got.dtype(0), WireDtype::kFloat32) << "read as float32 after decoding";
      EXPECT_NE(got.meta(0).delta_base(), 0u) << "a delta";
      const std::vector<float> held_before = reference;
      std::vector<float> q(w.size());
      ASSERT_TRUE(DeltaStep(dtype, w.data(), reference.data(), q.data(), static_cast<int64_t>(w.size())));
      const std::vector<float> v = Values(got);
      // Half an ulp of what the copy had to move (the step's change plus the last rounding), a
      // float16 subnormal's half ulp, and float32's rounding of the sum.
      const double half_ulp =
          dtype == WireDtype::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);  // unit roundoff
      const double tiny = dtype == WireDtype::kBFloat16 ? 0 : std::ldexp(1.0, -25);
      int64_t not_exact = 0, too_far = 0;
      double moved = 0, worst = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        not_exact += Bits(v[i]) != Bits(reference[i]);
        const double err = std::abs(static_cast<double>(v[i]) - w[i]);
        too_far +=
            err > std::abs(static_cast<double>(w[i]) - held_before[i]) * half_ulp + tiny + 1.2e-7 * std::abs(w[i]);
        moved = std::max(moved, std::abs(static_cast<double>(w[i]) - before[i]));
        worst = std::max(worst, err);
      }
      EXPECT_LT(worst, moved * 4 * half_ulp) << "far closer than plain rounding of the values";
      EXPECT_EQ(not_exact, 0) << WireDtypeName(dtype) << " step " << step;
      EXPECT_EQ(too_far, 0) << WireDtypeName(dtype) << " step " << step;
    }
    EXPECT_EQ(p.encoder.clients(), 1u);
  }
}

TEST(DeltaPullTest, FloatThirtyTwoAnswersAndRequestsStayAsTheyWere) {
  Pair p;
  std::vector<float> w = {1.5f, -2.25f, 3e-3f};
  for (int i = 0; i < 3; ++i) {
    OutgoingMessage request = PullOf({"w"});
    const std::string before = request.header;
    EXPECT_TRUE(p.decoder.Announce(Method::kPull, &request).empty());
    EXPECT_EQ(request.delta.client(), 0u) << "no announcement: the same bytes as before";
    IncomingMessage got = p.Pull("w", w, WireDtype::kFloat32);
    EXPECT_EQ(got.meta(0).delta_seq(), 0u);
    EXPECT_EQ(Values(got), w);
  }
  EXPECT_EQ(p.encoder.clients(), 0u);
}

TEST(DeltaPullTest, ALostAnswerOrARestartedPsGivesTheValuesAgain) {
  Pair p;
  std::vector<float> w = {0.1f, 0.2f, 0.3f};
  p.Pull("w", w);  // plain
  p.Pull("w", w);  // full
  w[0] += 1e-3f;
  p.Pull("w", w);  // delta
  // A delta the worker never receives: the ps's copy moved on, the worker's did not.
  {
    OutgoingMessage request = PullOf({"w"});
    const std::vector<std::string> claimed = p.decoder.Announce(Method::kPull, &request);
    ASSERT_EQ(claimed.size(), 1u);
    OutgoingMessage answer = Answer("w", w, WireDtype::kBFloat16);
    p.encoder.Encode(Travel(std::move(request)).delta_announcement(), &answer);
    EXPECT_NE(answer.tensors[0].meta.delta_base(), 0u);
    p.decoder.Release(claimed);  // failed: nothing decoded
  }
  w[1] -= 2e-3f;
  IncomingMessage resent = p.Pull("w", w);
  EXPECT_EQ(resent.meta(0).delta_base(), 0u) << "the worker announced a version the ps no longer holds";
  EXPECT_EQ(Values(resent), w);

  // A restarted ps (a new encoder) holds nothing: the values again.
  DeltaEncoder restarted;
  OutgoingMessage request = PullOf({"w"});
  const std::vector<std::string> claimed = p.decoder.Announce(Method::kPull, &request);
  OutgoingMessage answer = Answer("w", w, WireDtype::kBFloat16);
  restarted.Encode(Travel(std::move(request)).delta_announcement(), &answer);
  EXPECT_EQ(answer.tensors[0].meta.delta_base(), 0u);
  absl::StatusOr<IncomingMessage> got = p.decoder.Decode(Travel(std::move(answer)), claimed);
  p.decoder.Release(claimed);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Values(*got), w);
}

TEST(DeltaPullTest, AKeyClaimedByACallInFlightIsAnsweredPlainlyToTheOthers) {
  Pair p;
  std::vector<float> w = {0.1f, 0.2f, 0.3f};
  p.Pull("w", w);
  p.Pull("w", w);
  OutgoingMessage first = PullOf({"w"});
  const std::vector<std::string> first_claims = p.decoder.Announce(Method::kPull, &first);
  ASSERT_EQ(first_claims.size(), 1u);
  // A second pull while the first is in flight announces nothing for "w"...
  OutgoingMessage second = PullOf({"w"});
  EXPECT_TRUE(p.decoder.Announce(Method::kPull, &second).empty());
  EXPECT_EQ(second.delta.keys_size(), 0);
  OutgoingMessage answer = Answer("w", w, WireDtype::kBFloat16);
  p.encoder.Encode(Travel(std::move(second)).delta_announcement(), &answer);
  // ...and is answered as before: rounded, nothing kept.
  EXPECT_EQ(answer.tensors[0].meta.delta_seq(), 0u);
  EXPECT_EQ(answer.tensors[0].meta.dtype(), "bfloat16");
  p.decoder.Release(first_claims);
}

TEST(DeltaPullTest, ADeltaAgainstAnotherVersionIsRefusedNotApplied) {
  Pair p;
  std::vector<float> w = {0.1f, 0.2f};
  p.Pull("w", w);
  p.Pull("w", w);
  OutgoingMessage request = PullOf({"w"});
  const std::vector<std::string> claimed = p.decoder.Announce(Method::kPull, &request);
  OutgoingMessage answer = Answer("w", w, WireDtype::kBFloat16);
  p.encoder.Encode(Travel(std::move(request)).delta_announcement(), &answer);
  answer.tensors[0].meta.set_delta_base(answer.tensors[0].meta.delta_base() + 1);
  absl::StatusOr<IncomingMessage> got = p.decoder.Decode(Travel(std::move(answer)), claimed);
  p.decoder.Release(claimed);
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("pull of 'w' answered as a delta from version"));
}

TEST(DeltaPullTest, NonFiniteValuesTravelAsThemselves) {
  Pair p;
  std::vector<float> w = {0.1f, 0.2f, 0.3f};
  p.Pull("w", w);
  p.Pull("w", w);
  w[1] = std::numeric_limits<float>::quiet_NaN();
  w[2] = std::numeric_limits<float>::infinity();
  IncomingMessage got = p.Pull("w", w);
  EXPECT_EQ(got.meta(0).delta_base(), 0u);
  std::vector<float> v = Values(got);
  EXPECT_EQ(v[0], 0.1f);
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_EQ(v[2], std::numeric_limits<float>::infinity());
  w = {0.5f, 0.25f, 0.125f};  // finite again: values once, then deltas
  IncomingMessage again = p.Pull("w", w);
  EXPECT_EQ(again.meta(0).delta_base(), 0u);
  EXPECT_EQ(Values(again), w);
  w[0] = 0.5f + 1e-4f;
  IncomingMessage delta = p.Pull("w", w);
  EXPECT_NE(delta.meta(0).delta_base(), 0u);
  EXPECT_NEAR(Values(delta)[0], w[0], 1e-6f);
}

TEST(DeltaPullTest, RunsOfAPullInPartsAndPushAndPullAreKeyedAlike) {
  wire::TensorMeta run;
  run.set_name("w/part_0");
  run.set_slice(true);
  run.set_slice_offset(100);
  run.add_shape(50);
  EXPECT_EQ(DeltaKey(run), "w/part_0@100+50");
  DeltaDecoder decoder;
  // Activate and hold both keys through full answers.
  DeltaEncoder encoder;
  for (int round = 0; round < 2; ++round) {
    wire::PullRequest pull;
    wire::ShardSlice* s = pull.add_slices();
    s->set_shard("w/part_0");
    s->set_offset(100);
    s->set_count(50);
    OutgoingMessage request = OutgoingMessage::Of(pull);
    const std::vector<std::string> claimed = decoder.Announce(Method::kPull, &request);
    OutgoingMessage answer = Answer("w/part_0", std::vector<float>(50, 0.5f), WireDtype::kFloat16);
    answer.tensors[0].meta.set_slice(true);
    answer.tensors[0].meta.set_slice_offset(100);
    encoder.Encode(Travel(std::move(request)).delta_announcement(), &answer);
    ASSERT_TRUE(decoder.Decode(Travel(std::move(answer)), claimed).ok());
    decoder.Release(claimed);
  }
  wire::PullRequest again;
  wire::ShardSlice* s = again.add_slices();
  s->set_shard("w/part_0");
  s->set_offset(100);
  s->set_count(50);
  OutgoingMessage request = OutgoingMessage::Of(again);
  EXPECT_EQ(decoder.Announce(Method::kPull, &request), std::vector<std::string>{"w/part_0@100+50"});
  // A push asking for pull_shards announces them; a checkpoint's pull (float32) and a push
  // without pulls announce nothing.
  wire::PushRequest push;
  push.add_pull_shards("w/part_0@100+50");
  OutgoingMessage push_request = OutgoingMessage::Of(push);
  decoder.Announce(Method::kPush, &push_request);
  EXPECT_EQ(push_request.delta.client(), decoder.id());
  wire::PullRequest checkpoint;
  checkpoint.set_with_slots(true);
  checkpoint.add_shards("w");
  OutgoingMessage checkpoint_request = OutgoingMessage::Of(checkpoint);
  EXPECT_TRUE(decoder.Announce(Method::kPull, &checkpoint_request).empty());
  EXPECT_EQ(checkpoint_request.delta.client(), 0u);
}

// A ps answering Pull with its values of "w" in bfloat16, one random step further each call.
class WalkingPs final : public Handler {
 public:
  void Handle(Method method, IncomingMessage request, Responder responder) override {
    absl::MutexLock lock(&mu_);
    w_ = RandomWalk(rng_, w_, 1e-3f);
    responder.Respond(Answer("w", w_, WireDtype::kBFloat16));
  }
  std::vector<float> values() {
    absl::MutexLock lock(&mu_);
    return w_;
  }

 private:
  absl::Mutex mu_;
  std::mt19937 rng_{3};
  std::vector<float> w_ ABSL_GUARDED_BY(mu_) = std::vector<float>(100000, 0.05f);
};

TEST(DeltaPullTest, EndToEndOverGrpcAndSharedMemory) {
  for (const char* transport : {"grpc", "shm"}) {
    WalkingPs ps;
    TransportOptions options;
    options.transport = transport;
    auto server = StartServer("127.0.0.1:0", options, &ps);
    ASSERT_TRUE(server.ok()) << server.status();
    auto channel =
        MakeChannel(absl::StrCat("127.0.0.1:", (*server)->port()), "ps task 0", options, WireDtype::kBFloat16);
    ASSERT_TRUE(channel.ok()) << channel.status();
    CallOptions call;
    call.timeout_secs = 30;
    call.pull_direction = true;
    for (int i = 0; i < 6; ++i) {
      auto got = (*channel)->CallBlocking(Method::kPull, PullOf({"w"}), call);
      ASSERT_TRUE(got.ok()) << got.status();
      const std::vector<float> w = ps.values();
      const std::vector<float> v = Values(*got);
      double worst = 0;
      for (size_t j = 0; j < w.size(); ++j) worst = std::max(worst, std::abs(static_cast<double>(v[j]) - w[j]));
      if (i == 0) {
        EXPECT_GT(worst, 1e-5) << transport << ": the first pull is plainly rounded";
      } else {
        // Steps of ~1e-3 rounded to 8 bits: ~1e-5 at worst (plain bfloat16 of 0.05 is ~1e-4 off).
        EXPECT_LT(worst, 2e-5) << transport << " pull " << i;
      }
    }
  }
}

}  // namespace
}  // namespace psflow::rpc
