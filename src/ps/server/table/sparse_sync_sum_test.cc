// A sync step's table gradients: the same bits whatever the order of arrival, the float sums taken
// in worker order, divided by R (workers) or by each row's holders (row_count), against an
// independent per-id computation.
#include "ps/server/table/sparse_sync_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

namespace psflow::ps::table {
namespace {

struct Grad {
  int worker;
  std::vector<int64_t> ids;
  std::vector<float> rows;
};

constexpr int64_t kDim = 3;

// Three workers with overlapping ids, values chosen so that float addition order matters.
std::vector<Grad> StepGradients() {
  std::vector<Grad> g = {
      {0, {5, 9, 100}, {}},
      {1, {9, 5}, {}},
      {2, {100, 9, -4}, {}},
  };
  for (Grad& x : g) {
    for (size_t i = 0; i < x.ids.size() * kDim; ++i) {
      x.rows.push_back(static_cast<float>(
          std::pow(10.0, static_cast<int>((i + x.worker) % 8) - 3) * (i % 2 ? -1.37 : 1.11) + 1e-3 * x.worker));
    }
  }
  return g;
}

SummedRows Sum(std::vector<Grad> grads, const std::vector<int>& order, SparseSyncMean mean) {
  SparseStepSum sum("emb", kDim);
  for (int i : order) {
    const absl::Status s = sum.Add(grads[i].worker, grads[i].ids, grads[i].rows);
    EXPECT_TRUE(s.ok()) << s;
  }
  return sum.Finish(mean);
}

TEST(SparseSyncSumTest, SameBitsForEveryArrivalOrder) {
  const std::vector<Grad> grads = StepGradients();
  for (SparseSyncMean mean : {SparseSyncMean::kWorkers, SparseSyncMean::kRowCount}) {
    std::vector<int> order = {0, 1, 2};
    const SummedRows first = Sum(grads, order, mean);
    while (std::next_permutation(order.begin(), order.end())) {
      const SummedRows other = Sum(grads, order, mean);
      EXPECT_EQ(other.ids, first.ids);
      ASSERT_EQ(other.rows.size(), first.rows.size());
      EXPECT_EQ(std::memcmp(other.rows.data(), first.rows.data(), first.rows.size() * sizeof(float)), 0);
    }
  }
}

TEST(SparseSyncSumTest, SumsInWorkerOrderAndDividesByWorkersOrRowCount) {
  const std::vector<Grad> grads = StepGradients();
  // Independent: per id, the float sum in worker order, and the double sum, and the holders.
  std::map<int64_t, std::vector<float>> in_order;
  std::map<int64_t, std::vector<double>> exact;
  std::map<int64_t, int> holders;
  for (const Grad& g : grads) {  // already in worker order
    for (size_t r = 0; r < g.ids.size(); ++r) {
      auto& f = in_order[g.ids[r]];
      auto& d = exact[g.ids[r]];
      f.resize(kDim, 0.0f);
      d.resize(kDim, 0.0);
      for (int64_t k = 0; k < kDim; ++k) {
        f[k] += g.rows[r * kDim + k];
        d[k] += g.rows[r * kDim + k];
      }
      ++holders[g.ids[r]];
    }
  }
  for (SparseSyncMean mean : {SparseSyncMean::kWorkers, SparseSyncMean::kRowCount}) {
    const SummedRows out = Sum(grads, {2, 0, 1}, mean);
    EXPECT_EQ(out.ids, (std::vector<int64_t>{-4, 5, 9, 100}));
    for (size_t p = 0; p < out.ids.size(); ++p) {
      const int64_t id = out.ids[p];
      const float divisor = mean == SparseSyncMean::kWorkers ? 3.0f : static_cast<float>(holders[id]);
      for (int64_t k = 0; k < kDim; ++k) {
        EXPECT_EQ(out.rows[p * kDim + k], in_order[id][k] / divisor) << "id " << id;
        EXPECT_NEAR(out.rows[p * kDim + k], exact[id][k] / divisor, 1e-6 * std::max(1.0, std::abs(exact[id][k])));
      }
    }
  }
  EXPECT_EQ(holders[9], 3);
  EXPECT_EQ(holders[-4], 1);
}

TEST(SparseSyncSumTest, BadGradientsAreRefusedAndKeepNothing) {
  SparseStepSum sum("emb", 2);
  const int64_t ids[] = {1, 2};
  const float ok[] = {1, 2, 3, 4};
  // Repeated ids and NaN rows never get here: refused where they entered the ps (ps_tables_test.cc).
  EXPECT_NE(sum.Add(0, ids, absl::MakeConstSpan(ok, 3)).message().find("emb"), std::string_view::npos);
  EXPECT_EQ(sum.num_gradients(), 0);
  ASSERT_TRUE(sum.Add(0, ids, ok).ok());
  EXPECT_NE(sum.Add(0, ids, ok).message().find("worker 0"), std::string_view::npos);
  EXPECT_EQ(sum.num_gradients(), 1);
  const SummedRows out = sum.Finish(SparseSyncMean::kWorkers);
  EXPECT_EQ(out.rows, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(sum.num_gradients(), 0);
  EXPECT_TRUE(sum.Finish(SparseSyncMean::kWorkers).ids.empty());
  EXPECT_EQ(*ParseSparseSyncMean("row_count"), SparseSyncMean::kRowCount);
  EXPECT_FALSE(ParseSparseSyncMean("mean").ok());
}

}  // namespace
}  // namespace psflow::ps::table
