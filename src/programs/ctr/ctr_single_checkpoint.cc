// CtrTrainer's checkpoints (programs/ctr/ctr_single.h): the dense layers and their optimizer state as
// TrainingState (train/checkpointing.h), the tables streamed from / to the process's own shards in
// the cluster's layout (train/table_checkpoint.h), so a file of either mode restores in the other.
#include <memory>

#include "absl/strings/str_cat.h"
#include "programs/ctr/ctr_single.h"
#include "train/checkpointing.h"
#include "train/cluster_setup.h"
#include "train/sparse_rule_config.h"
#include "train/table_checkpoint.h"

namespace psflow::train {
namespace {

std::vector<dist::TableSpec> TableSpecsOf(const TrainOptions& options) {
  std::vector<dist::TableSpec> specs;
  for (int f = 0; f < options.ctr_fields; ++f) specs.push_back(CtrTableSpec(options, f));
  return specs;
}

}  // namespace

absl::StatusOr<std::string> CtrTrainer::SaveCheckpoint(int64_t step) const {
  auto layout = TableLayoutOf(SparseRuleConfigFrom(options_));
  if (!layout.ok()) return layout.status();
  TrainingState state{step, options_.model, optimizer_->name(), {}, {}};
  const auto& params = model_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    VariableState v{params[i]->value, {}, states_[i].updates};
    for (const FloatBuffer& slot : states_[i].slots) {
      v.slots.emplace_back(params[i]->value.shape(), std::vector<float>(slot.begin(), slot.end()));
    }
    state.variables.emplace(params[i]->name, std::move(v));
  }
  const std::vector<dist::TableSpec> specs = TableSpecsOf(options_);
  // A shard's scan in parts, as the ps tasks' scans arrive on a cluster.
  auto scan = [&](const std::string& table, int64_t max_rows,
                  const std::function<absl::Status(ps::TableRowsPart part)>& sink) -> absl::Status {
    size_t f = 0;
    while (f < specs.size() && specs[f].name != table) ++f;
    if (f == specs.size()) return absl::InternalError(absl::StrCat("no table '", table, "' in this process"));
    const int64_t dim = specs[f].dim;
    std::unique_ptr<ps::table::RowScan> rows = tables_[f]->Scan();
    ps::table::RowsPart part;
    while (rows->Next(max_rows, &part)) {
      const int64_t n = static_cast<int64_t>(part.ids.size());
      ps::TableRowsPart out;
      out.table = table;
      out.ids = std::move(part.ids);
      out.values = Tensor({n, dim}, std::move(part.values));
      for (auto& slot : part.slots) out.slots.emplace_back(Shape{n, dim}, std::move(slot));
      out.last_step = std::move(part.last_step);
      out.count = std::move(part.count);
      if (auto s = sink(std::move(out)); !s.ok()) return s;
      part = ps::table::RowsPart();
    }
    return absl::OkStatus();
  };
  return SaveTrainingState(options_.checkpoint_dir, state, optimizer_->slot_names(), 5, options_.env,
                           [&](ckpt::SafetensorsWriter& writer) { return WriteTables(scan, specs, *layout, writer); });
}

absl::StatusOr<int64_t> CtrTrainer::RestoreCheckpoint(const LogSink& log) {
  auto layout = TableLayoutOf(SparseRuleConfigFrom(options_));
  if (!layout.ok()) return layout.status();
  const std::vector<dist::TableSpec> specs = TableSpecsOf(options_);
  auto check_tables = [&](const ckpt::SafetensorsReader& file) { return TableSources(file, specs, *layout).status(); };
  auto restored = OpenTrainingState(options_.checkpoint_dir, options_.model, VariableSpecsOf(model_->parameters()),
                                    *optimizer_, log, options_.env, check_tables);
  if (!restored.ok()) return restored.status();
  if (!restored->has_value()) return 0;
  OpenedTrainingState& opened = **restored;
  const auto& params = model_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    VariableState& v = opened.state.variables.at(params[i]->name);
    params[i]->value = std::move(v.value);
    for (size_t s = 0; s < v.slots.size() && s < states_[i].slots.size(); ++s) {
      states_[i].slots[s].assign(v.slots[s].data(), v.slots[s].data() + v.slots[s].size());
    }
    states_[i].updates = v.updates;
  }
  auto sources = TableSources(*opened.file, specs, *layout);
  if (!sources.ok()) return sources.status();
  for (size_t f = 0; f < sources->size(); ++f) {
    ps::TableRowsPart part;
    while (true) {
      absl::StatusOr<bool> more = (*sources)[f].second(&part);
      if (!more.ok()) return more.status();
      if (!*more) break;
      ps::table::RowsPart rows;
      rows.ids = std::move(part.ids);
      rows.values.assign(part.values.data(), part.values.data() + part.values.size());
      for (const Tensor& slot : part.slots) rows.slots.emplace_back(slot.data(), slot.data() + slot.size());
      rows.last_step = std::move(part.last_step);
      rows.count = std::move(part.count);
      if (auto s = tables_[f]->Load(rows); !s.ok()) return s;
    }
  }
  log(absl::StrCat("restored ", specs.size(), " tables at global step ", opened.state.global_step));
  return opened.state.global_step;
}

}  // namespace psflow::train
