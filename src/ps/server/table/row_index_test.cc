// RowIndex against absl::flat_hash_map under random inserts, erases and lookups (small tables, so
// runs wrap around the end and removals shift entries back); ModOf against the % operator;
// SparseRule::ApplyRows against one Apply call per row, bit for bit.
#include "ps/server/table/row_index.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ps/server/table/sparse_rule.h"
#include "ps/server/table/table_test_util.h"

namespace psflow::ps::table {
namespace {

TEST(ModOfTest, EqualsTheRemainderOperator) {
  std::mt19937_64 rng(3);
  for (uint64_t d : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{7}, uint64_t{1000003}, uint64_t{2147483647},
                     rng() >> 1, rng()}) {
    const ModOf mod(d);
    for (uint64_t x : {uint64_t{0}, uint64_t{1}, d - 1, d, d + 1, ~uint64_t{0}, ~uint64_t{0} - d}) {
      ASSERT_EQ(mod(x), x % d) << x << " % " << d;
    }
    for (int i = 0; i < 20000; ++i) {
      const uint64_t x = rng();
      ASSERT_EQ(mod(x), x % d) << x << " % " << d;
    }
  }
}

TEST(RowIndexTest, MatchesAHashMapUnderRandomInsertsAndErases) {
  // Ids from a small pool, so inserts, erases and lookups hit present and absent ids alike; the
  // index grows from 16 entries, and later erases shrink runs that wrap around its end.
  std::mt19937_64 rng(11);
  std::vector<int64_t> pool;
  for (int i = 0; i < 3000; ++i) pool.push_back(i % 3 == 0 ? i : static_cast<int64_t>(rng()));
  std::vector<float> rows(pool.size());  // distinct addresses to store
  RowIndex index;
  absl::flat_hash_map<int64_t, float*> expected;
  for (int op = 0; op < 200000; ++op) {
    const size_t k = rng() % (op < 100000 ? pool.size() : pool.size() / 10);
    const int64_t id = pool[k];
    const int what = static_cast<int>(rng() % 3);
    if (what == 0 && !expected.contains(id)) {
      index.Insert(id, &rows[k]);
      expected[id] = &rows[k];
    } else if (what == 1) {
      index.Erase(id);
      expected.erase(id);
    } else {
      const auto it = expected.find(id);
      ASSERT_EQ(index.Find(id), it == expected.end() ? nullptr : it->second) << "op " << op;
    }
    ASSERT_EQ(index.size(), static_cast<int64_t>(expected.size()));
    if (op % 5000 == 0) {
      std::vector<float*> found(pool.size());
      index.FindMany(pool.data(), pool.size(), found.data());
      for (size_t i = 0; i < pool.size(); ++i) {
        const auto it = expected.find(pool[i]);
        ASSERT_EQ(found[i], it == expected.end() ? nullptr : it->second) << "op " << op;
      }
      int64_t listed = 0;
      index.ForEach([&](int64_t id, float* record) {
        ++listed;
        ASSERT_EQ(expected.at(id), record);
      });
      ASSERT_EQ(listed, index.size());
    }
  }
  const int64_t bytes = index.bytes();
  index.Reserve(100000);  // grows to hold 100000 ids at most 3/4 full, keeping every entry
  EXPECT_GE(index.bytes(), 100000 * 16 * 4 / 3);
  EXPECT_GT(index.bytes(), bytes);
  for (const auto& [id, record] : expected) ASSERT_EQ(index.Find(id), record);
}

TEST(ApplyRowsTest, EqualsOneApplyPerRowBitForBit) {
  // Rows of odd and vector-sized dims, some skipped (null), lazy adam with different counts.
  for (const char* name : {"sgd", "momentum", "adagrad", "ftrl", "adam", "rmsprop"}) {
    SparseRuleConfig config = testing::Rule(name, 0.05f);
    config.ftrl_l1 = 0.01f;
    config.ftrl_l2 = 0.02f;
    const SparseRule rule = *SparseRule::Make(config);
    for (int64_t dim : {1, 3, 16, 17, 64}) {
      const int64_t n = 37, stride = (1 + rule.num_slots()) * dim;
      std::mt19937 rng(static_cast<unsigned>(dim));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> a(n * stride), g(n * dim);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t k = 0; k < dim; ++k) a[r * stride + k] = normal(rng);
        rule.InitSlots(&a[r * stride + dim], dim);
      }
      for (float& x : g) x = normal(rng);
      std::vector<float> b = a;
      std::vector<int64_t> t(n);
      std::vector<float*> records(n);
      for (int64_t step = 0; step < 3; ++step) {
        for (int64_t r = 0; r < n; ++r) {
          t[r] = 1 + (r + step) % 4;
          records[r] = (r + step) % 5 == 0 ? nullptr : &b[r * stride];
          if (records[r] != nullptr) rule.Apply(&a[r * stride], &a[r * stride + dim], &g[r * dim], dim, 0.05f, t[r]);
        }
        rule.ApplyRows(records.data(), g.data(), t.data(), n, dim, 0.05f);
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << name << " dim " << dim;
      }
    }
  }
}

}  // namespace
}  // namespace psflow::ps::table
