// Embedding tables in sync training and in checkpoints, end to end over real gRPC: the two sync
// means (`workers`: N workers equal one worker with the summed batch; `row_count`: TF's per-row mean
// computed here), sums in worker order whatever the arrival order (dense and tables), stale pushes
// dropped with their rows, and a checkpoint taken on 1 ps task restored on 3.
#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/table/row_init.h"
#include "ps/tests/ps_tables_test_util.h"

namespace psflow::ps {
namespace {

using namespace table_testing;  // NOLINT: the table tests' helpers
using testing::Sgd;
using testing::TestCluster;

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
  table::RowInitializer init(spec.initializer, spec.initializer.seed);
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

// Hybrid sync (--table_sync=async): a push's table rows are applied when it arrives, each at the
// full rate (no mean over the step), and its prefetch is gathered then, while its dense gradients
// wait for the step's quorum.
TEST(PsTablesTest, HybridAppliesTableRowsOnArrivalAndDenseGradientsPerStep) {
  const std::vector<int64_t> ids0 = {1, 4}, ids1 = {4, 9};
  const Tensor g0 = testing::Filled({2, 2}, 0.5f, 0.25f), g1 = testing::Filled({2, 2}, -1.0f, 0.5f);
  TrainingConfig config = Sgd(0.1f);
  config.sync = true;
  config.replicas_to_aggregate = config.total_num_replicas = 2;
  config.table_sync = "async";
  const dist::TableSpec spec = Fixed("emb", 10, 2, dist::TableStrategy::kMod);
  table::RowInitializer init(spec.initializer, spec.initializer.seed);
  Job job = StartJob(TablePlan({spec}, 2, 2), 2, config);
  // Each push also carries a dense gradient and a prefetch: the answer (with the step) brings the
  // dense values after the step's mean and the prefetched rows as they stood after the push's own rows.
  const Tensor gw0({2}, 1.0f), gw1({2}, 3.0f);
  const std::vector<int64_t> next0 = {1}, next1 = {9, 4};
  Tensor fetched0({1, 2}), fetched1({2, 2}), dense0({2}), dense1({2});
  std::thread first([&] {
    TableStep t;
    t.pushes.push_back({"emb", &ids0, nullptr, &g0});
    t.pulls.push_back({"emb", &next0, &fetched0, nullptr});
    auto r = job.workers[0]->PushAndPull({{"w", &gw0, nullptr}}, 0, {{"w", &dense0}}, t);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_step, 1);
  });
  // Worker 0's rows show before the step completes (it waits for worker 1's push).
  const std::vector<int64_t> probe = {1};
  float w1[2];
  init.Fill(1, w1, 2);
  const float applied = w1[0] - 0.1f * g0.data()[0];
  for (int tries = 0; tries < 3000 && PullRows(*job.workers[1], "emb", probe, 2).data()[0] != applied; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(PullRows(*job.workers[1], "emb", probe, 2).data()[0], applied);
  TableStep t;
  t.pushes.push_back({"emb", &ids1, nullptr, &g1});
  t.pulls.push_back({"emb", &next1, &fetched1, nullptr});
  auto r = job.workers[1]->PushAndPull({{"w", &gw1, nullptr}}, 0, {{"w", &dense1}}, t);
  first.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 1);
  for (int i = 0; i < 2; ++i) {  // w = 0 - 0.1 * mean(1, 3)
    EXPECT_FLOAT_EQ(dense0[i], -0.2f);
    EXPECT_FLOAT_EQ(dense1[i], -0.2f);
  }
  // Row 1 (worker 0's alone) with worker 0's update; rows 9 and 4 with every push applied before
  // worker 1's arrival (worker 0's, seen above) and worker 1's own.
  for (int d = 0; d < 2; ++d) {
    float r1[2], r9[2], r4[2];
    init.Fill(1, r1, 2);
    init.Fill(9, r9, 2);
    init.Fill(4, r4, 2);
    EXPECT_FLOAT_EQ(fetched0.data()[d], r1[d] - 0.1f * g0.data()[d]);
    EXPECT_FLOAT_EQ(fetched1.data()[d], r9[d] - 0.1f * g1.data()[2 + d]);
    EXPECT_FLOAT_EQ(fetched1.data()[2 + d], r4[d] - 0.1f * g0.data()[2 + d] - 0.1f * g1.data()[d]);
  }
  const Tensor got = PullRows(*job.workers[0], "emb", Range(10), 2);
  for (int64_t id = 0; id < 10; ++id) {
    float want[2];
    init.Fill(id, want, 2);
    for (int d = 0; d < 2; ++d) {
      for (size_t q = 0; q < 2; ++q) {
        if (ids0[q] == id) want[d] -= 0.1f * g0.data()[q * 2 + d];
        if (ids1[q] == id) want[d] -= 0.1f * g1.data()[q * 2 + d];
      }
      EXPECT_FLOAT_EQ(got.data()[id * 2 + d], want[d]) << "id " << id;
    }
  }
}

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
  ASSERT_EQ(saved_fixed.size(), 4u);    // 10 rows in parts of 3
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
  PSFLOW_ASSERT_OK(
      three.workers[0]->Initialize(*state, config, {{"emb", From(saved_fixed)}, {"hashed", From(saved_dynamic)}}));
  ExpectSameParts(Scan(*three.workers[0], "emb", 3), saved_fixed);
  ExpectSameParts(Scan(*three.workers[0], "hashed", 3), saved_dynamic);

  for (int64_t s = 3; s < 5; ++s) step(*one.workers[0], s), step(*three.workers[0], s);
  const std::vector<int64_t> probe = {-7, 5, 8, 13, 21, 42, 1LL << 50, 99};
  const Tensor a = PullRows(*one.workers[0], "hashed", probe, 3), b = PullRows(*three.workers[0], "hashed", probe, 3);
  for (int64_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;
  const Tensor fa = PullRows(*one.workers[0], "emb", Range(10), 2),
               fb = PullRows(*three.workers[0], "emb", Range(10), 2);
  for (int64_t i = 0; i < fa.size(); ++i) EXPECT_EQ(fa[i], fb[i]) << i;
}

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
