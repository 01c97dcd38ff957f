// Embedding tables through the ps, end to end over real gRPC (docs/tables.md): declaration in the
// plan, div/mod and Mix64 routing, initial values equal on 1 and 3 ps tasks (and equal to the row
// initializer run here), each sparse rule through the wire against the same block applied locally,
// sync equivalences (`workers`: N workers equal one worker with the summed batch; `row_count`: TF's
// per-row mean computed here), bad input refused with nothing applied anywhere, a dynamic table's
// max_rows bound, prefetch, and per-table stats.
#include <cmath>
#include <map>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/table/row_init.h"
#include "ps/server/table/table_shard.h"
#include "ps/tests/ps_test_util.h"

namespace psflow::ps {
namespace {

using testing::Sgd;
using testing::TestCluster;

dist::PlacementPlan TablePlan(const std::vector<dist::TableSpec>& tables, int num_ps, int shards) {
  dist::PartitionerSpec partitioner;
  if (shards > 1) {
    partitioner.kind = dist::PartitionerKind::kFixedSize;
    partitioner.num_shards = shards;
  }
  dist::PlacementPlan plan = dist::PlanPlacement({{"w", {2}}}, partitioner, dist::PlacementStrategy::kRoundRobin, num_ps);
  absl::Status s = dist::PlanTables(tables, partitioner, dist::PlacementStrategy::kRoundRobin, &plan);
  EXPECT_TRUE(s.ok()) << s;
  return plan;
}

dist::TableSpec Fixed(const std::string& name, int64_t n, int64_t dim, dist::TableStrategy strategy) {
  dist::TableSpec t;
  t.name = name;
  t.dim = dim;
  t.num_embeddings = n;
  t.strategy = strategy;
  t.initializer = "uniform:-1:1";
  t.seed = 7;
  return t;
}

dist::TableSpec Dynamic(const std::string& name, int64_t dim) {
  dist::TableSpec t;
  t.name = name;
  t.dim = dim;
  t.dynamic = true;
  t.initializer = "normal:0:0.5";
  t.seed = 11;
  return t;
}

// A started cluster with the chief connected and the model initialized.
struct Job {
  std::unique_ptr<TestCluster> cluster;
  std::vector<std::unique_ptr<PsClient>> workers;
  dist::PlacementPlan plan;
};

Job StartJob(const dist::PlacementPlan& plan, int num_workers, const TrainingConfig& config) {
  Job job;
  job.plan = plan;
  job.cluster = TestCluster::Start(plan.num_ps, num_workers);
  for (int w = 0; w < num_workers; ++w) {
    job.workers.push_back(job.cluster->Client(plan, w));
    EXPECT_TRUE(job.workers.back()->Connect().ok());
  }
  const Tensor w({2}, 0.0f);
  absl::Status s = job.workers[0]->Initialize({{"w", &w}}, config);
  EXPECT_TRUE(s.ok()) << s;
  for (int w = 1; w < num_workers; ++w) EXPECT_TRUE(job.workers[w]->WaitForInitialization(10).ok());
  return job;
}

Tensor PullRows(PsClient& client, const std::string& table, const std::vector<int64_t>& ids, int64_t dim) {
  Tensor rows({static_cast<int64_t>(ids.size()), dim});
  TableStep step;
  step.pulls.push_back({table, &ids, &rows, nullptr});
  absl::StatusOr<int64_t> r = client.Pull({}, step);
  EXPECT_TRUE(r.ok()) << r.status();
  return rows;
}

std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
  return ids;
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

// Initial values come from (seed, id) on whichever ps holds the row: 1 ps and 3 ps (3 shards,
// div and mod, N = 10 not divisible by 3) give the row initializer's values, bit for bit.
TEST(PsTablesTest, DivAndModRoutingOnOneAndThreePsGiveTheInitializersValues) {
  for (dist::TableStrategy strategy : {dist::TableStrategy::kDiv, dist::TableStrategy::kMod}) {
    const dist::TableSpec spec = Fixed("emb", 10, 3, strategy);
    table::RowInitializer init(*table::ParseInitializer(spec.initializer), spec.seed);
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

// Each rule through the wire (2 ps, fixed table in 2 shards and a dynamic table) equals the same
// rule applied by one local shard holding the whole table, bit for bit.
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
    auto local_config = [](const dist::TableSpec& s) {
      table::TableConfig c;
      c.name = s.name;
      c.dim = s.dim;
      c.kind = s.dynamic ? table::TableKind::kDynamic : table::TableKind::kFixed;
      if (!s.dynamic) c.layout = {s.num_embeddings, 1, s.strategy};
      c.initializer = *table::ParseInitializer(s.initializer);
      c.seed = s.seed;
      return c;
    };
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
      tables.pushes.push_back({"hashed", &dynamic_ids[step], nullptr, &gd});
      auto r = job.workers[0]->PushAndPull({}, static_cast<int64_t>(step), {}, tables);
      ASSERT_TRUE(r.ok()) << r.status();
      PSFLOW_ASSERT_OK((*local_fixed)->Apply(fixed_ids[step], absl::MakeSpan(gf.data(), gf.size()),
                                             static_cast<int64_t>(step)));
      PSFLOW_ASSERT_OK((*local_dynamic)->Apply(dynamic_ids[step], absl::MakeSpan(gd.data(), gd.size()),
                                               static_cast<int64_t>(step)));
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

// Sync, 2 workers: `workers` equals one worker pushing the summed batch's gradient (sum / 2), and
// `row_count` divides each row by the workers that held it (computed here).
TEST(PsTablesTest, SyncMeansWorkersAndRowCount) {
  const std::vector<int64_t> ids0 = {1, 4, 7}, ids1 = {4, 9};
  const Tensor g0 = testing::Filled({3, 2}, 0.5f, 0.25f), g1 = testing::Filled({2, 2}, -1.0f, 0.5f);
  auto sync_config = [](const std::string& mean, int workers) {
    TrainingConfig c = Sgd(0.1f);
    c.sync = true;
    c.replicas_to_aggregate = c.total_num_replicas = workers;
    c.sparse_sync_mean = mean;
    return c;
  };
  const dist::TableSpec spec = Fixed("emb", 10, 2, dist::TableStrategy::kMod);
  table::RowInitializer init(*table::ParseInitializer(spec.initializer), spec.seed);
  // Per id: the two workers' gradient rows (absent: none).
  std::map<int64_t, std::vector<std::vector<float>>> held;
  for (size_t q = 0; q < ids0.size(); ++q) held[ids0[q]].push_back({g0.data()[q * 2], g0.data()[q * 2 + 1]});
  for (size_t q = 0; q < ids1.size(); ++q) held[ids1[q]].push_back({g1.data()[q * 2], g1.data()[q * 2 + 1]});

  for (const std::string mean : {"workers", "row_count"}) {
    SCOPED_TRACE(mean);
    Job job = StartJob(TablePlan({spec}, 2, 2), 2, sync_config(mean, 2));
    std::thread other([&] {
      TableStep t;
      t.pushes.push_back({"emb", &ids1, nullptr, &g1});
      EXPECT_TRUE(job.workers[1]->PushAndPull({}, 0, {}, t).ok());
    });
    TableStep t;
    t.pushes.push_back({"emb", &ids0, nullptr, &g0});
    auto r = job.workers[0]->PushAndPull({}, 0, {}, t);
    other.join();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_step, 1);
    const Tensor got = PullRows(*job.workers[0], "emb", Range(10), 2);
    for (int64_t id = 0; id < 10; ++id) {
      float w[2];
      init.Fill(id, w, 2);
      auto it = held.find(id);
      for (int d = 0; d < 2; ++d) {
        float want = w[d];
        if (it != held.end()) {
          float sum = 0;
          for (const auto& g : it->second) sum += g[d];
          const float divisor = mean == "workers" ? 2.0f : static_cast<float>(it->second.size());
          want = w[d] - 0.1f * (sum / divisor);
        }
        EXPECT_FLOAT_EQ(got.data()[id * 2 + d], want) << "id " << id;
      }
    }
    if (mean != "workers") continue;
    // One worker with the summed batch: its gradient rows are the per-id sums over 2 examples'
    // worth, divided by the batch's 2 halves.
    Job one = StartJob(TablePlan({spec}, 1, 1), 1, sync_config("workers", 1));
    std::vector<int64_t> ids;
    std::vector<float> rows;
    for (const auto& [id, gs] : held) {
      ids.push_back(id);
      for (int d = 0; d < 2; ++d) {
        float sum = 0;
        for (const auto& g : gs) sum += g[d];
        rows.push_back(sum / 2.0f);
      }
    }
    Tensor summed({static_cast<int64_t>(ids.size()), 2});
    std::copy(rows.begin(), rows.end(), summed.data());
    TableStep batch;
    batch.pushes.push_back({"emb", &ids, nullptr, &summed});
    ASSERT_TRUE(one.workers[0]->PushAndPull({}, 0, {}, batch).ok());
    const Tensor single = PullRows(*one.workers[0], "emb", Range(10), 2);
    for (int64_t i = 0; i < 20; ++i) EXPECT_FLOAT_EQ(single.data()[i], got.data()[i]) << i;
  }
}

// Bad input: one line naming the table, and nothing applied on any ps task.
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

// A dynamic table with max_rows = 100 over 2 ps fed 2000 distinct ids keeps at most
// ceil(100 / 2) rows per ps after each removal pass; the stats show the evictions.
TEST(PsTablesTest, DynamicTableStaysWithinMaxRowsAndStatsCountIt) {
  dist::TableSpec spec = Dynamic("hashed", 4);
  spec.max_rows = 100;
  spec.evict_every = 1;
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

// Prefetch: the next ids ride on the push and their rows, after the push, come back with it.
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

}  // namespace
}  // namespace psflow::ps
