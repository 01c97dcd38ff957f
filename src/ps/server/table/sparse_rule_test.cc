// Each sparse update rule against a scalar reference of docs/tables.md's formula (in double, one
// element at a time), over several steps, on fixed and dynamic tables: rows touched at different
// steps (lazy adam's per-row counts), untouched rows unchanged, the learning rate decaying with the
// global step.
#include "ps/server/table/sparse_rule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "ps/server/table/table_test_util.h"

namespace psflow::ps::table {
namespace {

// One element's state under the reference formulas.
struct RefElem {
  double w = 0, s0 = 0, s1 = 0;
  int64_t t = 0;
};

double Lr(const SparseRuleConfig& r, int64_t step) {
  const auto& o = r.optimizer;
  if (o.decay_steps <= 0) return o.learning_rate;
  return o.learning_rate * std::pow(o.decay_rate, static_cast<double>(step) / o.decay_steps);
}

void RefInit(const SparseRuleConfig& r, RefElem& e) {
  const std::string& n = r.optimizer.name;
  if (n == "adagrad" || n == "ftrl") e.s0 = r.optimizer.initial_accumulator;
  if (n == "rmsprop") e.s0 = 1.0;
}

void RefStep(const SparseRuleConfig& r, RefElem& e, double g, double lr) {
  const auto& o = r.optimizer;
  const std::string& n = o.name;
  ++e.t;
  if (n == "sgd") {
    e.w -= lr * g;
  } else if (n == "momentum") {
    e.s0 = o.momentum * e.s0 + g;
    e.w -= lr * e.s0;
  } else if (n == "adagrad") {
    e.s0 += g * g;
    e.w -= lr * g / std::sqrt(e.s0);
  } else if (n == "ftrl") {  // s0 = n (accumulator), s1 = z (linear)
    const double n_new = e.s0 + g * g;
    e.s1 += g - (std::sqrt(n_new) - std::sqrt(e.s0)) / lr * e.w;
    e.s0 = n_new;
    const double z = e.s1;
    e.w =
        std::abs(z) > r.ftrl_l1 ? ((z < 0 ? -1.0 : 1.0) * r.ftrl_l1 - z) / (std::sqrt(e.s0) / lr + 2 * r.ftrl_l2) : 0.0;
  } else if (n == "adam") {  // s0 = m, s1 = v; t is the row's own count
    const double alpha = lr * std::sqrt(1 - std::pow(o.beta2, e.t)) / (1 - std::pow(o.beta1, e.t));
    e.s0 = o.beta1 * e.s0 + (1 - o.beta1) * g;
    e.s1 = o.beta2 * e.s1 + (1 - o.beta2) * g * g;
    e.w -= alpha * e.s0 / (std::sqrt(e.s1) + o.adam_epsilon);
  } else if (n == "rmsprop") {  // s0 = ms, s1 = mom
    e.s0 = o.rms_decay * e.s0 + (1 - o.rms_decay) * g * g;
    e.s1 = o.rms_momentum * e.s1 + lr * g / std::sqrt(e.s0 + o.rms_epsilon);
    e.w -= e.s1;
  }
}

// A deterministic gradient element, of varied sign and size.
float Grad(int64_t id, int64_t k, int64_t step) {
  return static_cast<float>(std::sin(0.7 * id + 1.3 * k + 2.1 * step) * (1.0 + 0.5 * (k % 3)));
}

void CheckRuleOnTable(const SparseRuleConfig& rule, TableConfig config) {
  SCOPED_TRACE(rule.optimizer.name + (config.spec.kind == TableKind::kFixed ? " fixed" : " dynamic"));
  const int kPs = 2;
  const int64_t dim = config.spec.dim;
  auto shards = testing::AllShards(config, rule, kPs);
  auto made = SparseRule::Make(rule);
  ASSERT_TRUE(made.ok()) << made.status();
  // Ids and the steps at which each is pushed: id 3 from step 1, id 10 from step 4 (its adam
  // count starts at 1 there), id 17 every other step, id 5 never.
  const std::map<int64_t, std::vector<int64_t>> pushes = {
      {3, {1, 2, 3, 4, 5, 6}}, {10, {4, 5, 6}}, {17, {1, 3, 5}}, {5, {}}};
  std::map<int64_t, std::vector<RefElem>> ref;
  for (const auto& [id, steps] : pushes) {
    const std::vector<float> w0 = testing::GatherOne(shards, id);
    auto& elems = ref[id];
    elems.resize(dim);
    for (int64_t k = 0; k < dim; ++k) {
      elems[k].w = w0[k];
      RefInit(rule, elems[k]);
    }
  }
  for (int64_t step = 1; step <= 6; ++step) {
    const double lr = Lr(rule, step);
    for (const auto& [id, steps] : pushes) {
      if (std::find(steps.begin(), steps.end(), step) == steps.end()) continue;
      std::vector<float> g(dim);
      for (int64_t k = 0; k < dim; ++k) g[k] = Grad(id, k, step);
      const int64_t ids[] = {id};
      ASSERT_TRUE(shards[testing::Owner(config, kPs, id)]->Apply(ids, g, step).ok());
      for (int64_t k = 0; k < dim; ++k) RefStep(rule, ref[id][k], g[k], static_cast<float>(lr));
    }
  }
  for (const auto& [id, elems] : ref) {
    const std::vector<float> got = testing::GatherOne(shards, id);
    for (int64_t k = 0; k < dim; ++k) {
      const double want = elems[k].w;
      EXPECT_NEAR(got[k], want, 2e-5 * std::max(1.0, std::abs(want))) << "id " << id << " k " << k;
    }
  }
  // The slots, read through a scan of each shard, against the reference's.
  for (auto& shard : shards) {
    auto scan = shard->Scan();
    RowsPart part;
    while (scan->Next(2, &part)) {
      for (size_t i = 0; i < part.ids.size(); ++i) {
        const auto it = ref.find(part.ids[i]);
        if (it == ref.end()) continue;
        for (int slot = 0; slot < made->num_slots(); ++slot) {
          for (int64_t k = 0; k < dim; ++k) {
            const double want = slot == 0 ? it->second[k].s0 : it->second[k].s1;
            EXPECT_NEAR(part.slots[slot][i * dim + k], want, 2e-5 * std::max(1.0, std::abs(want)))
                << "id " << part.ids[i] << " slot " << made->slot_names()[slot];
          }
        }
      }
    }
  }
  if (config.spec.kind == TableKind::kDynamic) {
    TableStats total;
    for (auto& s : shards) total.rows += s->stats().rows;
    EXPECT_EQ(total.rows, 3);  // id 5 was read, never pushed: not stored
  }
}

TEST(SparseRuleTest, EachRuleMatchesItsReferenceOnFixedAndDynamicTables) {
  for (const char* name : {"sgd", "momentum", "adagrad", "ftrl", "adam", "rmsprop"}) {
    for (bool decay : {false, true}) {
      SparseRuleConfig rule = testing::Rule(name, 0.05f);
      rule.ftrl_l1 = 0.01f;
      rule.ftrl_l2 = 0.02f;
      rule.optimizer.rms_momentum = 0.5f;  // exercise rmsprop's momentum term too
      if (decay) {
        rule.optimizer.decay_steps = 2;
        rule.optimizer.decay_rate = 0.5f;
      }
      CheckRuleOnTable(rule, testing::FixedConfig(40, 5, 2, dist::TableStrategy::kDiv));
      CheckRuleOnTable(rule, testing::FixedConfig(40, 5, 2, dist::TableStrategy::kMod));
      CheckRuleOnTable(rule, testing::DynamicConfig(5));
    }
  }
}

TEST(SparseRuleTest, FtrlWithLargeL1GivesZeroWeights) {
  // |z| stays below l1: every weight is exactly 0 after the first update.
  SparseRuleConfig config = testing::Rule("ftrl", 0.1f);
  config.ftrl_l1 = 100.0f;
  auto rule = SparseRule::Make(config);
  ASSERT_TRUE(rule.ok());
  std::vector<float> rec = {0.3f, -0.2f, 0, 0, 0, 0};
  rule->InitSlots(rec.data() + 2, 2);
  EXPECT_FLOAT_EQ(rec[2], 0.1f);
  const float g[] = {0.5f, -0.25f};
  rule->Apply(rec.data(), rec.data() + 2, g, 2, 0.1f, 1);
  EXPECT_EQ(rec[0], 0.0f);
  EXPECT_EQ(rec[1], 0.0f);
}

TEST(SparseRuleTest, SlotNamesAndBadConfigs) {
  EXPECT_EQ(SparseRule::Make(testing::Rule("ftrl"))->slot_names(), (std::vector<std::string>{"accumulator", "linear"}));
  EXPECT_EQ(SparseRule::Make(testing::Rule("rmsprop"))->slot_names(), (std::vector<std::string>{"ms", "mom"}));
  EXPECT_EQ(SparseRule::Make(testing::Rule("sgd"))->num_slots(), 0);
  auto unknown = SparseRule::Make(testing::Rule("lamb"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("ftrl"), std::string::npos);  // lists the choices
  SparseRuleConfig negative_l1 = testing::Rule("ftrl");
  negative_l1.ftrl_l1 = -1;
  EXPECT_FALSE(SparseRule::Make(negative_l1).ok());
  EXPECT_FALSE(SparseRule::Make(testing::Rule("adagrad", -0.1f)).ok());
  auto in_table = MakeTableShard(testing::DynamicConfig(4), testing::Rule("lamb"), 0, 1);
  ASSERT_FALSE(in_table.ok());
  EXPECT_NE(in_table.status().message().find("dyn"), std::string::npos);
}

}  // namespace
}  // namespace psflow::ps::table
