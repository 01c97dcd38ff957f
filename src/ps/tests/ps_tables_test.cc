// Embedding tables through the ps, end to end over real gRPC (docs/tables.md): declaration in the
// plan, div/mod and Mix64 routing with initial values equal on 1 and 3 ps tasks (and to the row
// initializer run here), each sparse rule through the wire (gradient rows as a Tensor or lent as
// values) against the same block applied locally, bad input refused with nothing applied anywhere,
// a dynamic table's max_rows bound and its stats, prefetch, calls in parts, the shared-memory
// transport, and the blocks' wire encoding.
#include "ps/server/ps_tables.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/client/table_calls.h"
#include "ps/common/wire_config.h"
#include "ps/server/table/row_init.h"
#include "ps/server/table/table_shard.h"
#include "ps/tests/ps_tables_test_util.h"
#include "rpc/tensor_coding.h"

namespace psflow::ps {
namespace {

using namespace table_testing;  // NOLINT: the table tests' helpers
using testing::Sgd;
using testing::TestCluster;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

absl::StatusOr<rpc::IncomingMessage> RoundTrip(rpc::OutgoingMessage message) {
  const std::string bytes = Flatten(rpc::EncodeMessage(std::move(message)));
  grpc::Slice slice(bytes.data(), bytes.size());
  return rpc::DecodeMessage(grpc::ByteBuffer(&slice, 1));
}

TEST(PsTablesTest, PlacementListsTablesAndRefusesTwoOfOneName) {
  const dist::PlacementPlan plan =
      TablePlan({Fixed("emb", 10, 4, dist::TableStrategy::kMod), Dynamic("hashed", 8)}, 2, 3);
  const std::string listing = plan.Format();
  EXPECT_THAT(listing, ::testing::HasSubstr("emb/part_0"));
  EXPECT_THAT(listing, ::testing::HasSubstr("(table fixed mod, 4 rows)"));  // 10 rows over 3: 4, 3, 3
  EXPECT_THAT(listing, ::testing::HasSubstr("(table dynamic mix64(id)%2)"));
  ASSERT_EQ(plan.Table("emb")->shards.size(), 3u);
  EXPECT_EQ(plan.Table("hashed")->shards.size(), 2u);

  dist::PlacementPlan twice = testing::Plan({{"w", {2}}}, 1);
  const absl::Status s =
      dist::PlanTables({Dynamic("t", 4), Dynamic("t", 8)}, {}, dist::PlacementStrategy::kRoundRobin, &twice);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("table 't': declared twice"));
  EXPECT_FALSE(dist::PlanTables({Dynamic("w", 4)}, {}, dist::PlacementStrategy::kRoundRobin, &twice).ok());
}

TEST(PsTablesTest, DivAndModRoutingOnOneAndThreePsGiveTheInitializersValues) {
  for (dist::TableStrategy strategy : {dist::TableStrategy::kDiv, dist::TableStrategy::kMod}) {
    const dist::TableSpec spec = Fixed("emb", 10, 3, strategy);
    table::RowInitializer init(spec.initializer, spec.initializer.seed);
    const std::vector<int64_t> ids = {9, 0, 4, 3, 7, 1, 2, 8, 6, 5};  // every id, in a shuffled order
    for (int num_ps : {1, 3}) {
      Job job = StartJob(TablePlan({spec}, num_ps, num_ps), 1, Sgd(0.1f));
      const Tensor rows = PullRows(*job.workers[0], "emb", ids, 3);
      for (size_t q = 0; q < ids.size(); ++q) {
        float want[3];
        init.Fill(ids[q], want, 3);
        for (int d = 0; d < 3; ++d) {
          ASSERT_EQ(rows.data()[q * 3 + d], want[d]) << "id " << ids[q] << " on " << num_ps << " ps";
        }
      }
    }
  }
}

TEST(PsTablesTest, EachSparseRuleThroughTheWireEqualsTheBlockAppliedLocally) {
  for (const char* rule : {"sgd", "momentum", "adagrad", "ftrl", "adam", "rmsprop"}) {
    SCOPED_TRACE(rule);
    TrainingConfig config = Sgd(0.05f);
    config.sparse_optimizer = rule;
    config.ftrl_l1 = 0.01f;
    config.ftrl_l2 = 0.02f;
    const dist::TableSpec fixed = Fixed("emb", 12, 4, dist::TableStrategy::kDiv);
    const dist::TableSpec dynamic = Dynamic("hashed", 4);
    Job job = StartJob(TablePlan({fixed, dynamic}, 2, 2), 1, config);

    table::SparseRuleConfig rule_config;
    rule_config.optimizer = config.optimizer;
    rule_config.optimizer.name = rule;
    rule_config.ftrl_l1 = config.ftrl_l1;
    rule_config.ftrl_l2 = config.ftrl_l2;
    auto local_config = [](const dist::TableSpec& s) { return table::TableConfig{s, 1}; };
    auto local_fixed = table::MakeTableShard(local_config(fixed), rule_config, 0, 1);
    auto local_dynamic = table::MakeTableShard(local_config(dynamic), rule_config, 0, 1);
    ASSERT_TRUE(local_fixed.ok() && local_dynamic.ok());

    const std::vector<std::vector<int64_t>> fixed_ids = {{0, 5, 11, 6}, {5, 2, 11}, {7, 0}};
    const std::vector<std::vector<int64_t>> dynamic_ids = {{-3, 1LL << 40, 17}, {17, 99, -3}, {123456789}};
    for (size_t step = 0; step < fixed_ids.size(); ++step) {
      Tensor gf = testing::Filled({static_cast<int64_t>(fixed_ids[step].size()), 4}, 0.3f - 0.1f * step, -0.07f);
      Tensor gd = testing::Filled({static_cast<int64_t>(dynamic_ids[step].size()), 4}, -0.2f, 0.09f + 0.01f * step);
      TableStep tables;
      tables.pushes.push_back({"emb", &fixed_ids[step], nullptr, &gf});
      if (step % 2 == 1) {  // the gradient rows lent as values instead of a Tensor: the same update
        tables.pushes.push_back(
            {"hashed", &dynamic_ids[step], nullptr, nullptr, absl::MakeConstSpan(gd.data(), gd.size())});
      } else {
        tables.pushes.push_back({"hashed", &dynamic_ids[step], nullptr, &gd});
      }
      auto r = job.workers[0]->PushAndPull({}, static_cast<int64_t>(step), {}, tables);
      ASSERT_TRUE(r.ok()) << r.status();
      PSFLOW_ASSERT_OK(
          (*local_fixed)->Apply(fixed_ids[step], absl::MakeSpan(gf.data(), gf.size()), static_cast<int64_t>(step)));
      PSFLOW_ASSERT_OK(
          (*local_dynamic)->Apply(dynamic_ids[step], absl::MakeSpan(gd.data(), gd.size()), static_cast<int64_t>(step)));
    }
    auto expect_same = [&](const std::string& name, table::TableShard& local, const std::vector<int64_t>& ids) {
      const Tensor got = PullRows(*job.workers[0], name, ids, 4);
      std::vector<float> want(ids.size() * 4);
      PSFLOW_ASSERT_OK(local.Gather(ids, absl::MakeSpan(want)));
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got.data()[i], want[i]) << name << " element " << i;
    };
    expect_same("emb", **local_fixed, Range(12));
    expect_same("hashed", **local_dynamic, {-3, 1LL << 40, 17, 99, 123456789, 5});
  }
}

TEST(PsTablesTest, BadInputIsRefusedWithNothingApplied) {
  const dist::TableSpec spec = Fixed("emb", 6, 2, dist::TableStrategy::kDiv);
  Job job = StartJob(TablePlan({spec, Dynamic("hashed", 3)}, 2, 2), 1, Sgd(0.5f));
  PsClient& c = *job.workers[0];
  const Tensor before = PullRows(c, "emb", Range(6), 2);
  const std::vector<int64_t> good = {0, 5}, out_of_range = {1, 6}, twice = {2, 2};
  const Tensor g({2, 2}, 1.0f), wrong_dim({2, 3}, 1.0f);
  Tensor nan({2, 2}, 1.0f);
  nan.data()[3] = std::nanf("");
  struct Case {
    std::vector<TableRowsRef> pushes;
    std::string says;
  };
  const std::vector<int64_t> dyn = {3, 4};
  const Tensor gd({2, 3}, 1.0f);
  const std::vector<Case> cases = {
      {{{"emb", &good, nullptr, &g}, {"emb", &out_of_range, nullptr, &g}}, "id 6"},
      {{{"emb", &good, nullptr, &nan}}, "table 'emb': gradient row of id 5 has a NaN"},
      {{{"hashed", &dyn, nullptr, &gd}, {"emb", &good, nullptr, &wrong_dim}}, "table 'emb': gradient rows [2,3]"},
      {{{"emb", &twice, nullptr, &g}}, "table 'emb': id 2 listed twice"},
      {{{"nope", &good, nullptr, &g}}, "table 'nope': not a table of the plan"},
      {{{"emb", &good, nullptr, nullptr, absl::MakeConstSpan(wrong_dim.data(), 6)}},
       "table 'emb': gradient rows of 6 values for 2 ids"},
      {{{"emb", &good, nullptr, nullptr, absl::MakeConstSpan(nan.data(), 4)}},
       "table 'emb': gradient row of id 5 has a NaN"},
      {{{"emb", &good, nullptr, nullptr}}, "table 'emb': no gradient rows given"},
  };
  for (const Case& k : cases) {
    TableStep step;
    step.pushes = k.pushes;
    auto r = c.PushAndPull({}, 0, {}, step);
    ASSERT_FALSE(r.ok()) << k.says;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr(k.says));
    EXPECT_EQ(std::string(r.status().message()).find('\n'), std::string::npos);
  }
  const Tensor after = PullRows(c, "emb", Range(6), 2);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(after.data()[i], before.data()[i]);
  auto stats = c.Stats();
  ASSERT_TRUE(stats.ok());
  for (const PsTaskStats& s : *stats) {
    for (const TableTaskStats& t : s.tables) EXPECT_EQ(t.rows_pushed, 0) << t.table;
  }
}

TEST(PsTablesTest, DynamicTableStaysWithinMaxRowsAndStatsCountIt) {
  dist::TableSpec spec = Dynamic("hashed", 4);
  spec.lifecycle.max_rows = 100;
  spec.lifecycle.evict_every = 1;
  Job job = StartJob(TablePlan({spec}, 2, 1), 1, Sgd(0.1f));
  int64_t next = 1000;
  for (int step = 0; step < 40; ++step) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 50; ++i) ids.push_back(next++ * 7919);
    const Tensor g({50, 4}, 0.5f);
    TableStep t;
    t.pushes.push_back({"hashed", &ids, nullptr, &g});
    auto r = job.workers[0]->PushAndPull({}, step, {}, t);
    ASSERT_TRUE(r.ok()) << r.status();
    auto stats = job.workers[0]->Stats();
    ASSERT_TRUE(stats.ok());
    for (const PsTaskStats& s : *stats) {
      ASSERT_EQ(s.tables.size(), 1u);
      EXPECT_LE(s.tables[0].rows, 50 + 50) << "ps " << s.task << " step " << step;  // a pass, then one push
    }
  }
  auto stats = job.workers[0]->Stats();
  ASSERT_TRUE(stats.ok());
  int64_t pushed = 0, admissions = 0, evictions = 0;
  for (const PsTaskStats& s : *stats) {
    pushed += s.tables[0].rows_pushed;
    admissions += s.tables[0].admissions;
    evictions += s.tables[0].evictions;
    EXPECT_EQ(s.tables[0].table, "hashed");
    EXPECT_GT(s.tables[0].bytes, 0);
  }
  EXPECT_EQ(pushed, 2000);
  EXPECT_EQ(admissions, 2000);
  EXPECT_GT(evictions, 1800);
}

TEST(PsTablesTest, PrefetchReturnsTheRowsAfterThePush) {
  const dist::TableSpec spec = Fixed("emb", 8, 2, dist::TableStrategy::kMod);
  Job job = StartJob(TablePlan({spec}, 2, 2), 1, Sgd(1.0f));
  PsClient& c = *job.workers[0];
  const std::vector<int64_t> ids = {1, 2}, next = {2, 3, 6};
  const Tensor before = PullRows(c, "emb", next, 2);
  const Tensor g({2, 2}, 0.25f);
  Tensor fetched({3, 2});
  Tensor dense_out({2});
  TableStep t;
  t.pushes.push_back({"emb", &ids, nullptr, &g});
  t.pulls.push_back({"emb", &next, &fetched, nullptr});
  const Tensor gw({2}, 1.0f);
  auto r = c.PushAndPull({{"w", &gw, nullptr}}, 0, {{"w", &dense_out}}, t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(dense_out[0], -1.0f);
  EXPECT_EQ(fetched.data()[0], before.data()[0] - 0.25f);  // id 2 was pushed
  EXPECT_EQ(fetched.data()[1], before.data()[1] - 0.25f);
  for (int i = 2; i < 6; ++i) EXPECT_EQ(fetched.data()[i], before.data()[i]);  // 3 and 6 were not
}

TEST(PsTablesTest, TablesRideAlongPullsAndPushesInParts) {
  const dist::TableSpec spec = Fixed("emb", 9, 2, dist::TableStrategy::kDiv);
  dist::PlacementPlan plan = dist::PlanPlacement({{"w", {1000}}}, {}, dist::PlacementStrategy::kRoundRobin, 2);
  PSFLOW_ASSERT_OK(dist::PlanTables({spec}, {}, dist::PlacementStrategy::kRoundRobin, &plan));
  auto cluster = TestCluster::Start(2, 1);
  auto client = cluster->Client(plan, 0, {}, nullptr, /*max_part_bytes=*/256);  // 64 floats a part
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w({1000}, 1.0f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, Sgd(1.0f)));
  const std::vector<int64_t> ids = {8, 0, 3};
  Tensor before({3, 2});
  TableStep pull;
  pull.pulls.push_back({"emb", &ids, &before, nullptr});
  Tensor dense({1000});
  ASSERT_TRUE(client->Pull({{"w", &dense}}, pull).ok());
  EXPECT_EQ(dense[999], 1.0f);
  const Tensor g({3, 2}, 0.5f), gw({1000}, 0.25f);
  Tensor after({3, 2});
  TableStep step;
  step.pushes.push_back({"emb", &ids, nullptr, &g});
  step.pulls.push_back({"emb", &ids, &after, nullptr});
  auto r = client->PushAndPull({{"w", &gw, nullptr}}, 0, {{"w", &dense}}, step);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(dense[0], 0.75f);
  EXPECT_EQ(dense[999], 0.75f);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(after.data()[i], before.data()[i] - 0.5f) << i;
}

// storage=disk crosses the wire and the spec; a ps started without --table_dir (no disk tier)
// refuses it at Initialize with one line naming the table.
TEST(PsTablesTest, ADiskTableIsRefusedByThePsNamingTheTable) {
  dist::TableSpec spec = Dynamic("cold", 2);
  spec.storage = dist::TableStorage::kDisk;
  const dist::PlacementPlan plan = TablePlan({spec}, 1, 1);
  auto cluster = TestCluster::Start(1, 1);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w({2}, 0.0f);
  const absl::Status s = client->Initialize({{"w", &w}}, Sgd(0.1f));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("table 'cold'"));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("has no disk tier: start every task with --table_dir"));
  EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos);
}

// A table's own sparse_optimizer replaces the job's rule for its rows only.
TEST(PsTablesTest, ATablesOwnRuleReplacesTheJobsForItsRows) {
  dist::TableSpec own = Fixed("own", 4, 2, dist::TableStrategy::kDiv);
  own.sparse_optimizer = "adagrad";
  const dist::TableSpec job_rule = Fixed("job", 4, 2, dist::TableStrategy::kDiv);
  Job job = StartJob(TablePlan({own, job_rule}, 1, 1), 1, Sgd(0.5f));
  const std::vector<int64_t> ids = {1};
  const Tensor g({1, 2}, 2.0f);
  const Tensor before_own = PullRows(*job.workers[0], "own", ids, 2);
  const Tensor before_job = PullRows(*job.workers[0], "job", ids, 2);
  TableStep step;
  step.pushes.push_back({"own", &ids, nullptr, &g});
  step.pushes.push_back({"job", &ids, nullptr, &g});
  auto pushed = job.workers[0]->PushAndPull({}, 0, {}, step);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  const Tensor after_own = PullRows(*job.workers[0], "own", ids, 2);
  const Tensor after_job = PullRows(*job.workers[0], "job", ids, 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_FLOAT_EQ(after_job.data()[i], before_job.data()[i] - 0.5f * 2.0f);  // sgd
    // adagrad from the accumulator 0.1: acc = 0.1 + 4; w -= 0.5 * 2 / sqrt(4.1)
    EXPECT_NEAR(after_own.data()[i], before_own.data()[i] - 0.5f * 2.0f / std::sqrt(4.1f), 1e-5) << i;
  }
}

TEST(PsTablesTest, SharedMemoryTransportGivesTheSameRowsAsGrpc) {
  const dist::TableSpec fixed = Fixed("emb", 50, 8, dist::TableStrategy::kMod);
  const dist::TableSpec dynamic = Dynamic("hashed", 8);
  std::vector<std::vector<float>> results;
  for (const char* transport : {"grpc", "shm"}) {
    TrainingConfig config = Sgd(0.1f);
    config.sparse_optimizer = "adagrad";
    Job job = StartJob(TablePlan({fixed, dynamic}, 2, 2), 1, config, transport);
    std::vector<float> seen;
    for (int64_t step = 0; step < 4; ++step) {
      std::vector<int64_t> ids, next;
      for (int64_t i = 0; i < 20; ++i) ids.push_back((i * 7 + step * 3) % 50), next.push_back((i * 11 + step) % 50);
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      std::sort(next.begin(), next.end());
      next.erase(std::unique(next.begin(), next.end()), next.end());
      const Tensor g = testing::Filled({static_cast<int64_t>(ids.size()), 8}, 0.01f * step, 0.003f);
      Tensor fetched({static_cast<int64_t>(next.size()), 8}), hashed({static_cast<int64_t>(next.size()), 8});
      TableStep t;
      t.pushes.push_back({"emb", &ids, nullptr, &g});
      t.pushes.push_back({"hashed", &ids, nullptr, &g});
      t.pulls.push_back({"emb", &next, &fetched, nullptr});
      t.pulls.push_back({"hashed", &next, &hashed, nullptr});
      auto r = job.workers[0]->PushAndPull({}, step, {}, t);
      ASSERT_TRUE(r.ok()) << transport << ": " << r.status();
      seen.insert(seen.end(), fetched.data(), fetched.data() + fetched.size());
      seen.insert(seen.end(), hashed.data(), hashed.data() + hashed.size());
    }
    results.push_back(std::move(seen));
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i) ASSERT_EQ(results[0][i], results[1][i]) << i;
}

TEST(PsTablesWireTest, PushBlocksAndPullAnswersRoundTripThroughTheEncoding) {
  const dist::TableSpec fixed = Fixed("emb", 11, 3, dist::TableStrategy::kMod);
  const dist::TableSpec dynamic = Dynamic("hashed", 3);
  const dist::PlacementPlan plan = TablePlan({fixed, dynamic}, 3, 3);
  const std::vector<int64_t> ids = {10, 0, 4, 7, 5}, hashed_ids = {-1, 1LL << 62, 3, 77};
  const Tensor g = testing::Filled({5, 3}, 1.0f, 1.0f), gh = testing::Filled({4, 3}, -5.0f, 0.5f);
  Tensor dest({4, 3});
  TableStep step;
  step.pushes.push_back({"emb", &ids, nullptr, &g});
  step.pushes.push_back({"hashed", &hashed_ids, nullptr, &gh});
  step.pulls.push_back({"hashed", &hashed_ids, &dest, nullptr});
  auto work = RouteTables("Push", step, plan);
  ASSERT_TRUE(work.ok()) << work.status();

  TrainingConfig config = Sgd(0.1f);
  for (const dist::TablePlacement& t : plan.tables) config.tables.push_back({t.spec, t.layout.num_shards});
  std::map<std::pair<std::string, int64_t>, std::vector<float>> received;  // (table, id) -> row, every ps
  for (int k = 0; k < 3; ++k) {
    wire::InitializeRequest init;
    *init.mutable_config() = ToWire(config);
    for (const dist::TablePlacement& t : plan.tables) {
      for (const dist::TableShardSpec& s : t.shards) {
        if (s.ps_task != k) continue;
        wire::TableShardInfo* info = init.add_table_shards();
        info->set_table(t.spec.name);
        info->set_shard(s.shard_index);
        info->set_num_ps(3);
      }
    }
    auto tables = PsTables::Create(init, k);
    ASSERT_TRUE(tables.ok()) << tables.status();
    wire::PushRequest header;
    std::vector<rpc::OutgoingTensor> tensors;
    tensors.push_back({});  // a dense gradient first: the blocks' rows come after it
    tensors.back().meta.set_name("w");
    tensors.back().meta.add_shape(0);
    AddTablePushes((*work)->pushes[k], header.mutable_table_pushes(), &tensors);
    AddTableBlocks((*work)->pulls[k], header.mutable_table_prefetch());
    rpc::OutgoingMessage out = rpc::OutgoingMessage::Of(header);
    out.tensors = std::move(tensors);
    auto in = RoundTrip(std::move(out));
    ASSERT_TRUE(in.ok()) << in.status();
    wire::PushRequest parsed;
    PSFLOW_ASSERT_OK(in->ParseHeader(&parsed));
    auto blocks = (*tables)->Decode(parsed.table_pushes(), &*in, 1);
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    for (const TableBlock& b : *blocks) {
      for (size_t q = 0; q < b.ids.size(); ++q) {
        const std::string table = b.table->name.substr(0, b.table->name.find('/'));  // emb/part_K -> emb
        received[{table, b.ids[q]}] = std::vector<float>(b.rows.begin() + q * 3, b.rows.begin() + (q + 1) * 3);
      }
    }
    // The prefetch: gathered, encoded, scattered into dest.
    auto prefetch = (*tables)->Decode(parsed.table_prefetch(), nullptr, 0);
    ASSERT_TRUE(prefetch.ok()) << prefetch.status();
    rpc::OutgoingMessage answer = rpc::OutgoingMessage::Of(wire::PushResponse());
    ASSERT_TRUE(PsTables::AppendGathered(*prefetch, &answer).ok());
    auto back = RoundTrip(std::move(answer));
    ASSERT_TRUE(back.ok()) << back.status();
    PSFLOW_ASSERT_OK(ScatterTableRows(*back, (*work)->pulls[k], "ps"));
  }
  ASSERT_EQ(received.size(), ids.size() + hashed_ids.size());
  for (size_t q = 0; q < ids.size(); ++q) {
    EXPECT_EQ((received[{"emb", ids[q]}]), std::vector<float>(g.data() + q * 3, g.data() + q * 3 + 3)) << ids[q];
  }
  for (size_t q = 0; q < hashed_ids.size(); ++q) {
    EXPECT_EQ((received[{"hashed", hashed_ids[q]}]), std::vector<float>(gh.data() + q * 3, gh.data() + q * 3 + 3));
  }
  // Nothing applied: the scattered rows are the initializer's, in the caller's order.
  table::RowInitializer init(dynamic.initializer, dynamic.initializer.seed);
  for (size_t q = 0; q < hashed_ids.size(); ++q) {
    float want[3];
    init.Fill(hashed_ids[q], want, 3);
    for (int d = 0; d < 3; ++d) EXPECT_EQ(dest.data()[q * 3 + d], want[d]) << hashed_ids[q];
  }
}

}  // namespace
}  // namespace psflow::ps
