// Tests of the partitioners and placement against hand-computed values and TF's formulas.
#include "psflow/dist/partition.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

namespace psflow::dist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

PartitionerSpec Fixed(int n) { return {.kind = PartitionerKind::kFixedSize, .num_shards = n}; }
PartitionerSpec MinMax(int p, int64_t min_slice = 256 << 10) {
  return {.kind = PartitionerKind::kMinMax, .max_partitions = p, .min_slice_bytes = min_slice};
}
PartitionerSpec AxisSize(int64_t max_shard_bytes) {
  return {.kind = PartitionerKind::kVariableAxisSize, .max_shard_bytes = max_shard_bytes};
}

TEST(ShardRowsTest, TensorFlowExample) {
  // 793,470 rows over 8 shards: six of 99,184 and two of 99,183 (TF's fixed_size_partitioner docs).
  EXPECT_THAT(ShardRows(793470, 8), ElementsAre(99184, 99184, 99184, 99184, 99184, 99184, 99183, 99183));
  EXPECT_THAT(ShardRows(10, 3), ElementsAre(4, 3, 3));
  EXPECT_THAT(ShardRows(9, 3), ElementsAre(3, 3, 3));
  EXPECT_THAT(ShardRows(5, 1), ElementsAre(5));
}

TEST(NumShardsTest, FixedSize) {
  EXPECT_EQ(NumShards(Fixed(8), {793470, 64}), 8);
  EXPECT_EQ(NumShards(Fixed(3), {10}), 3);      // 1-D biases are split too
  EXPECT_EQ(NumShards(Fixed(8), {3, 500}), 3);  // capped at the dimension
  EXPECT_EQ(NumShards(Fixed(4), {}), 1);        // scalars never split
  EXPECT_EQ(NumShards(Fixed(4), {1, 100}), 1);
  EXPECT_EQ(NumShards(Fixed(4), {0, 100}), 1);
  EXPECT_EQ(NumShards(PartitionerSpec{}, {1000, 1000}), 1);
}

TEST(NumShardsTest, MinMax) {
  // [1000, 100] floats = 400,000 bytes; 400,000 / 262,144 = 1.53 -> 2 shards.
  EXPECT_EQ(NumShards(MinMax(8), {1000, 100}), 2);
  // min slice 100,000 bytes -> exactly 4.
  EXPECT_EQ(NumShards(MinMax(8, 100000), {1000, 100}), 4);
  // min slice 99,999 bytes -> 4.00004 -> 5.
  EXPECT_EQ(NumShards(MinMax(8, 99999), {1000, 100}), 5);
  // Capped by max_partitions.
  EXPECT_EQ(NumShards(MinMax(3, 1000), {1000, 100}), 3);
  // Capped by the dimension: [2, 100000] = 800,000 bytes, 1 KiB slices would want 782.
  EXPECT_EQ(NumShards(MinMax(8, 1024), {2, 100000}), 2);
  // Small variables stay whole: [10] = 40 bytes.
  EXPECT_EQ(NumShards(MinMax(8), {10}), 1);
  EXPECT_EQ(NumShards(MinMax(8, 1), {}), 1);
}

TEST(NumShardsTest, VariableAxisSize) {
  // [1000, 100]: one row (slice) is 400 bytes; 40,000 bytes hold 100 rows -> 10 shards.
  EXPECT_EQ(NumShards(AxisSize(40000), {1000, 100}), 10);
  EXPECT_EQ(NumShards(AxisSize(40001), {1000, 100}), 10);
  // 39,999 bytes hold 99 rows -> ceil(1000 / 99) = 11.
  EXPECT_EQ(NumShards(AxisSize(39999), {1000, 100}), 11);
  // max_shard_bytes smaller than one slice: still one row per shard.
  EXPECT_EQ(NumShards(AxisSize(100), {1000, 100}), 1000);
  // Larger than the whole variable: one shard.
  EXPECT_EQ(NumShards(AxisSize(1 << 30), {1000, 100}), 1);
  EXPECT_EQ(NumShards(AxisSize(8), {10}), 5);
  EXPECT_EQ(NumShards(AxisSize(8), {}), 1);
  EXPECT_EQ(NumShards(AxisSize(8), {10, 0}), 1);
}

// TF's Python formulas transcribed with floating point, as an independent reference for the
// integer arithmetic in NumShards.
int TfReferenceShards(const PartitionerSpec& spec, const Shape& shape) {
  if (shape.empty()) return 1;
  const double dim = static_cast<double>(shape[0]);
  const double total_bytes = 4.0 * static_cast<double>(NumElements(shape));
  switch (spec.kind) {
    case PartitionerKind::kNone:
      return 1;
    case PartitionerKind::kFixedSize:
      return static_cast<int>(std::min<double>(spec.num_shards, dim));
    case PartitionerKind::kMinMax:
      return static_cast<int>(std::max(1.0, std::min({dim, static_cast<double>(spec.max_partitions),
                                                      std::ceil(total_bytes / spec.min_slice_bytes)})));
    case PartitionerKind::kVariableAxisSize: {
      const double bytes_per_slice = total_bytes / dim;
      const double slices_per_shard = std::max(1.0, std::floor(spec.max_shard_bytes / bytes_per_slice));
      return static_cast<int>(std::ceil(dim / slices_per_shard));
    }
  }
  return -1;
}

TEST(NumShardsTest, MatchesTfFormulasOnRandomShapes) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> rank_dist(1, 3), dim_dist(1, 3000), count_dist(1, 16);
  std::uniform_int_distribution<int64_t> bytes_dist(1, 4 << 20);
  for (int trial = 0; trial < 3000; ++trial) {
    Shape shape(rank_dist(rng));
    for (int64_t& d : shape) d = dim_dist(rng) % (trial % 2 ? 40 : 3000) + 1;
    for (const PartitionerSpec& spec :
         {Fixed(count_dist(rng)), MinMax(count_dist(rng), bytes_dist(rng)), AxisSize(bytes_dist(rng))}) {
      ASSERT_EQ(NumShards(spec, shape), TfReferenceShards(spec, shape)) << ShapeToString(shape);
    }
  }
}

TEST(ParsePartitionerTest, AcceptsEveryForm) {
  auto none = ParsePartitioner("none");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->kind, PartitionerKind::kNone);
  EXPECT_EQ(ParsePartitioner("")->kind, PartitionerKind::kNone);

  auto fixed = ParsePartitioner("fixed:4");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->kind, PartitionerKind::kFixedSize);
  EXPECT_EQ(fixed->num_shards, 4);

  auto min_max = ParsePartitioner("min_max:8");
  ASSERT_TRUE(min_max.ok());
  EXPECT_EQ(min_max->kind, PartitionerKind::kMinMax);
  EXPECT_EQ(min_max->max_partitions, 8);
  EXPECT_EQ(min_max->min_slice_bytes, 262144);
  auto min_max_slice = ParsePartitioner("min_max:8:65536");
  ASSERT_TRUE(min_max_slice.ok());
  EXPECT_EQ(min_max_slice->min_slice_bytes, 65536);
  EXPECT_EQ(ParsePartitioner("min_max:2:64K")->min_slice_bytes, 65536);

  auto axis = ParsePartitioner("axis_size:40000");
  ASSERT_TRUE(axis.ok());
  EXPECT_EQ(axis->kind, PartitionerKind::kVariableAxisSize);
  EXPECT_EQ(axis->max_shard_bytes, 40000);
  EXPECT_EQ(ParsePartitioner("axis_size:4M")->max_shard_bytes, 4 << 20);
  EXPECT_EQ(ParsePartitioner("axis_size:1g")->max_shard_bytes, int64_t{1} << 30);
}

TEST(ParsePartitionerTest, RejectsWithAClearMessage) {
  for (const char* bad : {"fixed", "fixed:", "fixed:0", "fixed:-2", "fixed:x", "fixed:2:3", "min_max", "min_max:0",
                          "min_max:4:0", "min_max:4:abc", "min_max:4:1:2", "axis_size", "axis_size:0", "axis_size:12Q",
                          "axis_size:K", "round_robin", "fixed_size:2", "axis_size:99999999999999999999"}) {
    auto spec = ParsePartitioner(bad);
    ASSERT_FALSE(spec.ok()) << bad;
    const std::string message(spec.status().message());
    EXPECT_THAT(message, HasSubstr(std::string("--partitioner=") + bad)) << message;
    EXPECT_THAT(message, HasSubstr("fixed:N")) << message;
  }
}

TEST(ParsePlacementTest, Parses) {
  EXPECT_EQ(*ParsePlacement("round_robin"), PlacementStrategy::kRoundRobin);
  EXPECT_EQ(*ParsePlacement("greedy"), PlacementStrategy::kGreedy);
  auto bad = ParsePlacement("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--placement=random"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("round_robin or greedy"));
}

std::vector<int> PsOf(const PlacementPlan& plan) {
  std::vector<int> ps;
  for (const ShardSpec& s : plan.shards) ps.push_back(s.ps_task);
  return ps;
}

TEST(PlanPlacementTest, RoundRobinCountsGlobalStepAndShards) {
  const std::vector<VariableSpec> vars = {{"w", {4, 2}}, {"b", {2}}, {"w2", {2, 3}}, {"b2", {3}}};
  // global_step takes counter 0 (ps 0); then the variables alternate starting at ps 1.
  PlacementPlan two = PlanPlacement(vars, {}, PlacementStrategy::kRoundRobin, 2);
  EXPECT_EQ(two.global_step_ps, 0);
  EXPECT_THAT(PsOf(two), ElementsAre(1, 0, 1, 0));
  PlacementPlan three = PlanPlacement(vars, {}, PlacementStrategy::kRoundRobin, 3);
  EXPECT_THAT(PsOf(three), ElementsAre(1, 2, 0, 1));
  // Every shard advances the counter: fixed:2 -> w/part_0, w/part_1, b/part_0, b/part_1, ...
  PlacementPlan sharded = PlanPlacement(vars, Fixed(2), PlacementStrategy::kRoundRobin, 3);
  EXPECT_THAT(PsOf(sharded), ElementsAre(1, 2, 0, 1, 2, 0, 1, 2));
  EXPECT_EQ(sharded.shards[0].name, "w/part_0");
  EXPECT_EQ(sharded.shards[3].name, "b/part_1");
  // One ps: everything on it.
  PlacementPlan one = PlanPlacement(vars, Fixed(2), PlacementStrategy::kRoundRobin, 1);
  EXPECT_THAT(PsOf(one), ElementsAre(0, 0, 0, 0, 0, 0, 0, 0));
  EXPECT_THAT(one.bytes_per_ps, ElementsAre(8 + 4 * (8 + 2 + 6 + 3)));
}

TEST(PlanPlacementTest, GreedyByBytesTiesToLowestIndex) {
  const std::vector<VariableSpec> vars = {{"a", {10}}, {"b", {10}}, {"c", {10}}, {"d", {20}}};
  PlacementPlan plan = PlanPlacement(vars, {}, PlacementStrategy::kGreedy, 3);
  // loads (bytes): start 0,0,0; global_step -> ps0 (8,0,0); a -> ps1 (tie with ps2) (8,40,0);
  // b -> ps2 (8,40,40); c -> ps0 (48,40,40); d -> ps1 (tie with ps2) (48,120,40).
  EXPECT_EQ(plan.global_step_ps, 0);
  EXPECT_THAT(PsOf(plan), ElementsAre(1, 2, 0, 1));
  EXPECT_THAT(plan.bytes_per_ps, ElementsAre(48, 120, 40));
  EXPECT_THAT(plan.params_per_ps, ElementsAre(10, 30, 10));
}

// The seeds' mlp: hidden [784,100] + [100], output [100,10] + [10].
const std::vector<VariableSpec> kMlp = {
    {"hidden/weights", {784, 100}}, {"hidden/biases", {100}}, {"softmax/weights", {100, 10}}, {"softmax/biases", {10}}};

TEST(PlanPlacementTest, MlpOnTwoPs) {
  // Bytes: weights 313,600, biases 400, weights 4,000, biases 40; global_step 8.
  PlacementPlan rr = PlanPlacement(kMlp, {}, PlacementStrategy::kRoundRobin, 2);
  EXPECT_THAT(PsOf(rr), ElementsAre(1, 0, 1, 0));
  EXPECT_THAT(rr.bytes_per_ps, ElementsAre(8 + 400 + 40, 313600 + 4000));
  EXPECT_THAT(rr.params_per_ps, ElementsAre(110, 79400));
  EXPECT_NEAR(rr.MaxOverMeanBytes(), 317600.0 / ((448.0 + 317600.0) / 2), 1e-12);

  // Greedy: hidden/weights -> ps1 (ps0 has global_step); everything else fits on ps0.
  PlacementPlan greedy = PlanPlacement(kMlp, {}, PlacementStrategy::kGreedy, 2);
  EXPECT_THAT(PsOf(greedy), ElementsAre(1, 0, 0, 0));
  EXPECT_THAT(greedy.bytes_per_ps, ElementsAre(8 + 400 + 4000 + 40, 313600));

  // fixed:2 halves every variable: [392,100], [50], [50,10], [5].
  for (PlacementStrategy strategy : {PlacementStrategy::kRoundRobin, PlacementStrategy::kGreedy}) {
    PlacementPlan fixed = PlanPlacement(kMlp, Fixed(2), strategy, 2);
    EXPECT_THAT(PsOf(fixed), ElementsAre(1, 0, 1, 0, 1, 0, 1, 0));
    EXPECT_THAT(fixed.bytes_per_ps, ElementsAre(8 + 156800 + 200 + 2000 + 20, 156800 + 200 + 2000 + 20));
    EXPECT_THAT(fixed.params_per_ps, ElementsAre(39755, 39755));
    EXPECT_NEAR(fixed.MaxOverMeanBytes(), 159028.0 / 159024.0, 1e-12);
  }
}

TEST(PlanPlacementTest, ShardsCoverTheVariable) {
  PlacementPlan plan =
      PlanPlacement({{"emb", {10, 3}}, {"step_scale", {}}, {"b", {2}}}, Fixed(3), PlacementStrategy::kRoundRobin, 2);
  std::vector<const ShardSpec*> emb = plan.ShardsOf("emb");
  ASSERT_EQ(emb.size(), 3u);
  int64_t next_row = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(emb[i]->name, "emb/part_" + std::to_string(i));
    EXPECT_EQ(emb[i]->variable, "emb");
    EXPECT_EQ(emb[i]->shard_index, i);
    EXPECT_EQ(emb[i]->num_shards, 3);
    EXPECT_EQ(emb[i]->offset, next_row);
    EXPECT_EQ(emb[i]->shape[1], 3);
    next_row += emb[i]->shape[0];
  }
  EXPECT_EQ(next_row, 10);
  EXPECT_EQ(emb[0]->shape, (Shape{4, 3}));
  EXPECT_EQ(emb[0]->bytes(), 48);
  // The scalar keeps its name and is not split; the [2] bias is capped at 2 shards.
  ASSERT_EQ(plan.ShardsOf("step_scale").size(), 1u);
  EXPECT_EQ(plan.ShardsOf("step_scale")[0]->name, "step_scale");
  EXPECT_EQ(plan.ShardsOf("step_scale")[0]->shape, Shape{});
  EXPECT_EQ(plan.ShardsOf("b").size(), 2u);
  EXPECT_TRUE(plan.ShardsOf("missing").empty());

  // ShardsOn partitions the shards and agrees with the byte counts.
  int64_t counted = 0;
  for (int p = 0; p < plan.num_ps; ++p) {
    int64_t bytes = p == plan.global_step_ps ? 8 : 0;
    for (const ShardSpec* s : plan.ShardsOn(p)) {
      EXPECT_EQ(s->ps_task, p);
      bytes += s->bytes();
      ++counted;
    }
    EXPECT_EQ(bytes, plan.bytes_per_ps[p]);
  }
  EXPECT_EQ(counted, static_cast<int64_t>(plan.shards.size()));
}

TEST(PlanPlacementTest, ModelSignatureIgnoresPlacement) {
  PlacementPlan a = PlanPlacement(kMlp, {}, PlacementStrategy::kRoundRobin, 1);
  PlacementPlan b = PlanPlacement(kMlp, Fixed(3), PlacementStrategy::kGreedy, 4);
  EXPECT_EQ(a.ModelSignature(),
            "hidden/weights[784,100]\nhidden/biases[100]\nsoftmax/weights[100,10]\nsoftmax/biases[10]\n");
  EXPECT_EQ(a.ModelSignature(), b.ModelSignature());
  EXPECT_EQ(a.ModelFingerprint(), b.ModelFingerprint());
  std::vector<VariableSpec> wider = kMlp;
  wider[0].shape = {784, 200};
  EXPECT_NE(PlanPlacement(wider, {}, PlacementStrategy::kRoundRobin, 1).ModelFingerprint(), a.ModelFingerprint());
  std::vector<VariableSpec> renamed = kMlp;
  renamed[1].name = "hidden/bias";
  EXPECT_NE(PlanPlacement(renamed, {}, PlacementStrategy::kRoundRobin, 1).ModelFingerprint(), a.ModelFingerprint());
}

TEST(PlanPlacementTest, FormatListsEveryShard) {
  PlacementPlan plan = PlanPlacement(kMlp, Fixed(2), PlacementStrategy::kRoundRobin, 2);
  const std::string text = plan.Format();
  EXPECT_THAT(text, HasSubstr("global_step"));
  EXPECT_THAT(text, HasSubstr("hidden/weights/part_0"));
  EXPECT_THAT(text, HasSubstr("[392,100]"));
  EXPECT_THAT(text, HasSubstr("156800 bytes -> /job:ps/task:1"));
  EXPECT_THAT(text, HasSubstr("softmax/biases/part_1"));
  EXPECT_THAT(text, HasSubstr("/job:ps/task:0 holds 159028 bytes"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1 + 8 + 2 + 1);
}

}  // namespace
}  // namespace psflow::dist
