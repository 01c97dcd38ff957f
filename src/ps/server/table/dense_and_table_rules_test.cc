// The dense optimizer and the tables' sparse rules run one set of kernels (optim/update_kernels.h):
// every rule applied to a [n, dim] dense variable and to the same rows of a table (fixed and dynamic)
// gives the same bits, weights and slots, where the semantics coincide: every rule when every row
// is pushed at every step; every rule but adam when a push holds some rows (lazy adam counts each
// row's own updates, the dense ApplySparse one shared count). FTRL has no dense form: every rule,
// ftrl included, is also checked bit for bit against SparseRule::Apply row by row with each row's
// own count, which is what the batched table path must equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ps/server/table/sparse_rule.h"
#include "ps/server/table/table_test_util.h"
#include "psflow/optim/optimizer.h"

namespace psflow::ps::table {
namespace {

constexpr int64_t kRows = 9;
constexpr int64_t kDim = 7;  // not a multiple of a vector width: the loops' tails run too
constexpr int kSteps = 6;

std::vector<uint32_t> Bits(const float* x, int64_t n) {
  std::vector<uint32_t> bits(static_cast<size_t>(n));
  std::memcpy(bits.data(), x, static_cast<size_t>(n) * sizeof(float));
  return bits;
}

float Grad(int64_t id, int64_t k, int64_t step) {
  return static_cast<float>(std::sin(0.7 * id + 1.3 * k + 2.1 * step) * (1.0 + 0.5 * (k % 3)));
}

// The rows pushed at `step`: all of them, or (some_rows) a varying subset.
std::vector<int64_t> PushedIds(bool some_rows, int step) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < kRows; ++id) {
    if (!some_rows || (id + step) % 3 != 0) ids.push_back(id);
  }
  return ids;
}

SparseRuleConfig RuleConfig(const std::string& name) {
  SparseRuleConfig rule = testing::Rule(name, 0.05f);
  rule.ftrl_l1 = 0.01f;
  rule.ftrl_l2 = 0.02f;
  rule.optimizer.rms_momentum = 0.5f;
  rule.optimizer.decay_steps = 2;  // the learning rate decays with the step on both sides
  rule.optimizer.decay_rate = 0.5f;
  return rule;
}

// The table's rows 0..kRows-1: weights [kRows, kDim] and each slot [kRows, kDim], read by a scan.
struct Rows {
  std::vector<float> w;
  std::vector<std::vector<float>> slots;
};

Rows ReadTable(const TableShard& shard, int num_slots) {
  Rows rows;
  rows.w.assign(kRows * kDim, 0.0f);
  rows.slots.assign(num_slots, std::vector<float>(kRows * kDim, 0.0f));
  auto scan = shard.Scan();
  RowsPart part;
  int64_t seen = 0;
  while (scan->Next(4, &part)) {
    for (size_t i = 0; i < part.ids.size(); ++i) {
      const int64_t id = part.ids[i];
      EXPECT_LT(id, kRows);
      if (id >= kRows) continue;
      ++seen;
      std::memcpy(&rows.w[id * kDim], &part.values[i * kDim], kDim * sizeof(float));
      for (int s = 0; s < num_slots; ++s) {
        std::memcpy(&rows.slots[s][id * kDim], &part.slots[s][i * kDim], kDim * sizeof(float));
      }
    }
  }
  EXPECT_EQ(seen, kRows);
  return rows;
}

// Pushes kSteps steps of gradients into `config`'s table and, beside it, into a dense variable
// (rules the dense optimizer has) and into per-row records updated by SparseRule::Apply; checks
// the bits of all three agree.
void CheckRule(const std::string& name, const TableConfig& config, bool some_rows) {
  SCOPED_TRACE(name + (config.spec.kind == TableKind::kFixed ? " fixed" : " dynamic") +
               (some_rows ? ", some rows per push" : ", every row per push"));
  const SparseRuleConfig rule_config = RuleConfig(name);
  auto rule = SparseRule::Make(rule_config);
  ASSERT_TRUE(rule.ok()) << rule.status();
  auto shard = MakeTableShard(config, rule_config, 0, 1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const int slots = rule->num_slots();

  // Initial weights: the table's (a dynamic id not stored gathers its initial value).
  std::vector<int64_t> all(kRows);
  for (int64_t id = 0; id < kRows; ++id) all[id] = id;
  std::vector<float> dense_w(kRows * kDim);
  ASSERT_TRUE((*shard)->Gather(all, absl::MakeSpan(dense_w)).ok());
  const bool has_dense = name != "ftrl" && !(some_rows && rule->needs_row_steps());
  std::unique_ptr<optim::Optimizer> dense;
  optim::SlotState dense_state;
  if (has_dense) {
    auto made = optim::MakeOptimizer(rule_config.optimizer);
    ASSERT_TRUE(made.ok()) << made.status();
    dense = *std::move(made);
    dense_state = dense->NewState(kRows * kDim);
  }
  // Reference records [w | slots] per row, with each row's own update count.
  const int64_t stride = (1 + slots) * kDim;
  std::vector<float> ref(kRows * stride);
  std::vector<int64_t> ref_t(kRows, 0);
  for (int64_t id = 0; id < kRows; ++id) {
    std::memcpy(&ref[id * stride], &dense_w[id * kDim], kDim * sizeof(float));
    rule->InitSlots(&ref[id * stride + kDim], kDim);
  }

  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<int64_t> ids = PushedIds(some_rows, step);
    std::vector<float> grads(ids.size() * kDim);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t k = 0; k < kDim; ++k) grads[i * kDim + k] = Grad(ids[i], k, step);
    }
    ASSERT_TRUE((*shard)->Apply(ids, grads, step).ok());
    const float lr = rule->LearningRate(step);
    ASSERT_EQ(lr, optim::LearningRateAt(rule_config.optimizer, step));
    if (dense != nullptr && some_rows) {
      dense->ApplySparse(dense_w.data(), ids, grads.data(), kDim, dense_state, lr);
    } else if (dense != nullptr) {
      dense->ApplyDense(dense_w.data(), grads.data(), kRows * kDim, dense_state, lr);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      float* rec = &ref[ids[i] * stride];
      rule->Apply(rec, rec + kDim, &grads[i * kDim], kDim, lr, ++ref_t[ids[i]]);
    }
  }

  const Rows table = ReadTable(**shard, slots);
  for (int64_t id = 0; id < kRows; ++id) {
    SCOPED_TRACE("row " + std::to_string(id));
    const float* rec = &ref[id * stride];
    EXPECT_EQ(Bits(&table.w[id * kDim], kDim), Bits(rec, kDim)) << "weights vs SparseRule::Apply";
    for (int s = 0; s < slots; ++s) {
      EXPECT_EQ(Bits(&table.slots[s][id * kDim], kDim), Bits(rec + (1 + s) * kDim, kDim))
          << "slot " << rule->slot_names()[s] << " vs SparseRule::Apply";
    }
    if (dense == nullptr) continue;
    EXPECT_EQ(Bits(&table.w[id * kDim], kDim), Bits(&dense_w[id * kDim], kDim)) << "weights vs dense";
    ASSERT_EQ(dense->slot_names(), rule->slot_names());
    for (int s = 0; s < slots; ++s) {
      EXPECT_EQ(Bits(&table.slots[s][id * kDim], kDim), Bits(&dense_state.slots[s][id * kDim], kDim))
          << "slot " << rule->slot_names()[s] << " vs dense";
    }
  }
  // The pushes moved the weights (a check that cannot pass by comparing two untouched copies).
  std::vector<float> initial(kRows * kDim);
  auto fresh = MakeTableShard(config, rule_config, 0, 1);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE((*fresh)->Gather(all, absl::MakeSpan(initial)).ok());
  EXPECT_NE(Bits(table.w.data(), kRows * kDim), Bits(initial.data(), kRows * kDim));
}

TEST(DenseAndTableRulesTest, SameBitsForEveryRuleOnFixedAndDynamicTables) {
  for (const char* name : {"sgd", "momentum", "adagrad", "ftrl", "adam", "rmsprop"}) {
    for (bool some_rows : {false, true}) {
      CheckRule(name, testing::FixedConfig(kRows, kDim, 1, dist::TableStrategy::kDiv), some_rows);
      CheckRule(name, testing::DynamicConfig(kDim), some_rows);
    }
  }
}

}  // namespace
}  // namespace psflow::ps::table
