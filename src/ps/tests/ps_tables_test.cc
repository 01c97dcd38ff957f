// Embedding tables through the ps, end to end over real gRPC (docs/tables.md): declaration in the
// plan, div/mod and Mix64 routing, initial values equal on 1 and 3 ps tasks (and equal to the row
// initializer run here), each sparse rule through the wire against the same block applied locally,
// sync equivalences (`workers`: N workers equal one worker with the summed batch; `row_count`: TF's
// per-row mean computed here), bad input refused with nothing applied anywhere, a dynamic table's
// max_rows bound, prefetch, and per-table stats.
#include <algorithm>
#include <cmath>
#include <map>
#include <chrono>
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

// `transport`: "grpc", or "shm" (the shared-memory data plane, gRPC for the rest).
Job StartJob(const dist::PlacementPlan& plan, int num_workers, const TrainingConfig& config,
             const std::string& transport = "grpc") {
  Job job;
  job.plan = plan;
  rpc::TransportOptions options;
  options.transport = transport;
  job.cluster = TestCluster::Start(plan.num_ps, num_workers, options);
  for (int w = 0; w < num_workers; ++w) {
    job.workers.push_back(job.cluster->Client(plan, w, options));
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

namespace psflow::ps {
namespace {

// Sync sums run in worker order, dense and tables, whatever order the pushes arrive in: with
// gradients 1, 1e8, -1e8 (float addition does not associate on them) the step's sum is
// (1 + 1e8) + -1e8 = 0, the worker order's, never the arrival order's (1e8 + -1e8) + 1 = 1.
// The arrival order is varied; the expectation does not depend on it.
TEST(PsTablesTest, SyncSumsInWorkerOrderWhateverTheArrivalOrder) {
  const dist::TableSpec spec = Fixed("emb", 4, 1, dist::TableStrategy::kDiv);
  const float values[3] = {1.0f, 1e8f, -1e8f};
  for (const std::vector<int>& order : {std::vector<int>{1, 2, 0}, {2, 0, 1}, {0, 1, 2}}) {
    TrainingConfig c = Sgd(1.0f);
    c.sync = true;
    c.replicas_to_aggregate = c.total_num_replicas = 3;
    Job job = StartJob(TablePlan({spec}, 1, 1), 3, c);
    const Tensor before = PullRows(*job.workers[0], "emb", {2}, 1);
    std::vector<std::thread> threads;
    const std::vector<int64_t> ids = {2};
    std::vector<Tensor> dense, rows;
    for (int w = 0; w < 3; ++w) dense.emplace_back(Shape{2}, values[w]), rows.emplace_back(Shape{1, 1}, values[w]);
    for (int w : order) {
      threads.emplace_back([&, w] {
        TableStep t;
        t.pushes.push_back({"emb", &ids, nullptr, &rows[w]});
        auto r = job.workers[w]->PushAndPull({{"w", &dense[w], nullptr}}, 0, {}, t);
        EXPECT_TRUE(r.ok()) << r.status();
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(30));  // orders arrivals (not asserted on)
    }
    for (std::thread& t : threads) t.join();
    Tensor w({2});
    ASSERT_TRUE(job.workers[0]->Pull({{"w", &w}}).ok());
    EXPECT_EQ(w[0], 0.0f) << "arrival order " << order[0] << order[1] << order[2];
    EXPECT_EQ(w[1], 0.0f);
    const Tensor after = PullRows(*job.workers[0], "emb", {2}, 1);
    EXPECT_EQ(after.data()[0], before.data()[0]) << "arrival order " << order[0] << order[1] << order[2];
  }
}

}  // namespace
}  // namespace psflow::ps

namespace psflow::ps {
namespace {

std::vector<TableRowsPart> Scan(PsClient& c, const std::string& table, int64_t max_rows) {
  std::vector<TableRowsPart> parts;
  absl::Status s = c.ScanTable(table, max_rows, [&](TableRowsPart p) {
    parts.push_back(std::move(p));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return parts;
}

TablePartSource From(const std::vector<TableRowsPart>& parts) {
  auto next = std::make_shared<size_t>(0);
  return [&parts, next](TableRowsPart* out) -> absl::StatusOr<bool> {
    if (*next == parts.size()) return false;
    *out = parts[(*next)++];
    return true;
  };
}

void ExpectSameParts(const std::vector<TableRowsPart>& a, const std::vector<TableRowsPart>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t p = 0; p < a.size(); ++p) {
    EXPECT_EQ(a[p].ids, b[p].ids);
    EXPECT_EQ(a[p].last_step, b[p].last_step);
    EXPECT_EQ(a[p].count, b[p].count);
    ASSERT_EQ(a[p].values.size(), b[p].values.size());
    for (int64_t i = 0; i < a[p].values.size(); ++i) ASSERT_EQ(a[p].values[i], b[p].values[i]);
    ASSERT_EQ(a[p].slots.size(), b[p].slots.size());
    for (size_t k = 0; k < a[p].slots.size(); ++k) {
      for (int64_t i = 0; i < a[p].slots[k].size(); ++i) ASSERT_EQ(a[p].slots[k][i], b[p].slots[k][i]);
    }
  }
}

// A checkpoint of a fixed and a dynamic table taken on 1 ps task, in id-ordered parts, restored on
// 3 (rows re-routed: div over 3 shards, Mix64(id) % 3), reads back the same parts and continues
// with the same values as the 1-ps job (adagrad: its accumulators came along).
TEST(PsTablesTest, CheckpointOnOnePsRestoresOnThreeAndContinuesEqual) {
  TrainingConfig config = Sgd(0.1f);
  config.sparse_optimizer = "adagrad";
  const dist::TableSpec fixed = Fixed("emb", 10, 2, dist::TableStrategy::kDiv);
  const dist::TableSpec dynamic = Dynamic("hashed", 3);
  Job one = StartJob(TablePlan({fixed, dynamic}, 1, 1), 1, config);
  const std::vector<int64_t> fixed_ids = {0, 3, 9, 4}, dynamic_ids = {5, -7, 1LL << 50, 42, 8, 13, 21};
  const Tensor gf = testing::Filled({4, 2}, 0.5f, -0.125f), gd = testing::Filled({7, 3}, -0.3f, 0.05f);
  auto step = [&](PsClient& c, int64_t tag) {
    TableStep t;
    t.pushes.push_back({"emb", &fixed_ids, nullptr, &gf});
    t.pushes.push_back({"hashed", &dynamic_ids, nullptr, &gd});
    auto r = c.PushAndPull({}, tag, {}, t);
    EXPECT_TRUE(r.ok()) << r.status();
  };
  for (int64_t s = 0; s < 3; ++s) step(*one.workers[0], s);

  const std::vector<TableRowsPart> saved_fixed = Scan(*one.workers[0], "emb", 3);
  const std::vector<TableRowsPart> saved_dynamic = Scan(*one.workers[0], "hashed", 3);
  ASSERT_EQ(saved_fixed.size(), 4u);  // 10 rows in parts of 3
  ASSERT_EQ(saved_dynamic.size(), 3u);  // 7 rows
  std::vector<int64_t> all;
  for (const TableRowsPart& p : saved_dynamic) all.insert(all.end(), p.ids.begin(), p.ids.end());
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
  EXPECT_EQ(all.size(), 7u);
  ASSERT_EQ(saved_dynamic[0].slots.size(), 1u);  // adagrad's accumulator
  auto state = one.workers[0]->PullState();
  ASSERT_TRUE(state.ok()) << state.status();

  const dist::PlacementPlan three_plan = TablePlan({fixed, dynamic}, 3, 3);
  Job three;
  three.plan = three_plan;
  three.cluster = TestCluster::Start(3, 1);
  three.workers.push_back(three.cluster->Client(three_plan, 0));
  PSFLOW_ASSERT_OK(three.workers[0]->Connect());
  PSFLOW_ASSERT_OK(three.workers[0]->Initialize(*state, config, {{"emb", From(saved_fixed)}, {"hashed", From(saved_dynamic)}}));
  ExpectSameParts(Scan(*three.workers[0], "emb", 3), saved_fixed);
  ExpectSameParts(Scan(*three.workers[0], "hashed", 3), saved_dynamic);

  for (int64_t s = 3; s < 5; ++s) step(*one.workers[0], s), step(*three.workers[0], s);
  const std::vector<int64_t> probe = {-7, 5, 8, 13, 21, 42, 1LL << 50, 99};
  const Tensor a = PullRows(*one.workers[0], "hashed", probe, 3), b = PullRows(*three.workers[0], "hashed", probe, 3);
  for (int64_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;
  const Tensor fa = PullRows(*one.workers[0], "emb", Range(10), 2), fb = PullRows(*three.workers[0], "emb", Range(10), 2);
  for (int64_t i = 0; i < fa.size(); ++i) EXPECT_EQ(fa[i], fb[i]) << i;
}

// A checkpoint whose table has another dim is refused, naming the table.
TEST(PsTablesTest, RestoringATableOfAnotherDimIsRefused) {
  const dist::TableSpec dynamic = Dynamic("hashed", 3);
  Job one = StartJob(TablePlan({dynamic}, 1, 1), 1, Sgd(0.1f));
  const std::vector<int64_t> ids = {1, 2};
  const Tensor g({2, 3}, 1.0f);
  TableStep t;
  t.pushes.push_back({"hashed", &ids, nullptr, &g});
  ASSERT_TRUE(one.workers[0]->PushAndPull({}, 0, {}, t).ok());
  const std::vector<TableRowsPart> saved = Scan(*one.workers[0], "hashed", 10);
  auto state = one.workers[0]->PullState();
  ASSERT_TRUE(state.ok());
  dist::TableSpec wider = dynamic;
  wider.dim = 4;
  const dist::PlacementPlan plan = TablePlan({wider}, 1, 1);
  auto cluster = TestCluster::Start(1, 1);
  auto chief = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(chief->Connect());
  const absl::Status s = chief->Initialize(*state, Sgd(0.1f), {{"hashed", From(saved)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("table 'hashed'"));
}

}  // namespace
}  // namespace psflow::ps

namespace psflow::ps {
namespace {

// The shared-memory transport moves the same messages: a few steps with pushes, prefetch and a
// dense variable give the same rows, bit for bit, as over gRPC.
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

}  // namespace
}  // namespace psflow::ps

#include "ps/client/table_calls.h"
#include "ps/common/wire_config.h"
#include "ps/server/ps_tables.h"
#include "rpc/tensor_coding.h"

namespace psflow::ps {
namespace {

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

// The table blocks of a push and of its answer, through the wire encoding (rpc/tensor_coding.h):
// the client's blocks per ps (ids as raw int64 bytes, rows in the tensor area after the dense
// tensors) decode on each ps into exactly its ids with their rows, and the ps's gathered answer
// scatters back into the caller's rows in the caller's order.
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
    PsTables::AppendGathered(*prefetch, &answer);
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
  table::RowInitializer init(*table::ParseInitializer(dynamic.initializer), dynamic.seed);
  for (size_t q = 0; q < hashed_ids.size(); ++q) {
    float want[3];
    init.Fill(hashed_ids[q], want, 3);
    for (int d = 0; d < 3; ++d) EXPECT_EQ(dest.data()[q * 3 + d], want[d]) << hashed_ids[q];
  }
}

}  // namespace
}  // namespace psflow::ps

namespace psflow::ps {
namespace {

// Sync: a push tagged older than the step (stale) is dropped with its table rows, and a backup's
// push arriving after the quorum closed is dropped the same way.
TEST(PsTablesTest, SyncDropsStaleAndLateBackupTableRows) {
  const dist::TableSpec spec = Fixed("emb", 4, 1, dist::TableStrategy::kDiv);
  TrainingConfig c = Sgd(1.0f);
  c.sync = true;
  c.replicas_to_aggregate = 1;
  c.total_num_replicas = 2;  // one backup
  Job job = StartJob(TablePlan({spec}, 1, 1), 2, c);
  const std::vector<int64_t> ids = {1};
  const Tensor g({1, 1}, 1.0f);
  const Tensor before = PullRows(*job.workers[0], "emb", {1}, 1);
  TableStep t;
  t.pushes.push_back({"emb", &ids, nullptr, &g});
  auto first = job.workers[0]->PushAndPull({}, 0, {}, t);  // closes step 0 alone (R = 1)
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->stale);
  auto late = job.workers[1]->PushAndPull({}, 0, {}, t);  // tagged 0, the step is 1 now: stale
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->stale);
  const Tensor after = PullRows(*job.workers[0], "emb", {1}, 1);
  EXPECT_EQ(after.data()[0], before.data()[0] - 1.0f);  // one update, the stale one dropped
  auto stats = job.workers[0]->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].stale_gradients_dropped, 1);
}

}  // namespace
}  // namespace psflow::ps

namespace psflow::ps {
namespace {

// A model bigger than the client's part size: the dense pull and push go in parts, the table rows
// ride on the push's last part and on a pull of their own, with the same values as whole calls.
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

}  // namespace
}  // namespace psflow::ps
