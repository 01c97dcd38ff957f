// CtrTrainer's checkpoints (programs/ctr/ctr_single.h): the dense layers and their optimizer state as
// TrainingState (train/checkpointing.h), the tables streamed from / to the process's own shards in
// the cluster's layout (train/table_checkpoint.h), so a file of either mode restores in the other.
#include <memory>

#include "absl/strings/str_cat.h"
#include "programs/ctr/ctr_single.h"
#include "psflow/ckpt/checkpoint_chain.h"
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

absl::StatusOr<std::string> CtrTrainer::SaveCheckpoint(int64_t step) {
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
  if (chain_ == nullptr) chain_ = std::make_unique<SaveChain>(options_.full_checkpoint_every, options_.seed);
  const bool chains = options_.full_checkpoint_every > 1;
  // The chief's chain of saves: the same files, numbers and chain ids as on a cluster.
  const SaveChain::Save save = chain_->Begin(step, chains ? ChainFingerprint(state) : 0);
  // A shard's scan in parts, as the ps tasks' scans arrive on a cluster (an increment's removed ids
  // in its first part).
  auto scan = [&](const std::string& table, int64_t max_rows,
                  const std::function<absl::Status(ps::TableRowsPart part)>& sink) -> absl::Status {
    size_t f = 0;
    while (f < specs.size() && specs[f].name != table) ++f;
    if (f == specs.size()) return absl::InternalError(absl::StrCat("no table '", table, "' in this process"));
    const int64_t dim = specs[f].dim;
    std::unique_ptr<ps::table::RowScan> rows;
    if (chains) {
      ps::table::ScanOptions options;
      options.save_id = save.scan.save_id;
      options.increment = save.scan.increment;
      options.changed_since = save.scan.changed_since;
      options.track_changes = save.scan.track_changes;
      auto started = tables_[f]->Scan(options);
      if (!started.ok()) return started.status();
      rows = *std::move(started);
    } else {
      rows = tables_[f]->Scan();  // today's files: the shard's generations left alone
    }
    std::vector<int64_t> removed = rows->removed();
    ps::table::RowsPart part;
    bool more = true;
    while (more) {
      more = rows->Next(max_rows, &part);
      if (!more && part.ids.empty() && removed.empty()) break;
      const int64_t n = static_cast<int64_t>(part.ids.size());
      ps::TableRowsPart out;
      out.table = table;
      out.ids = std::move(part.ids);
      out.values = Tensor({n, dim}, std::move(part.values));
      for (auto& slot : part.slots) out.slots.emplace_back(Shape{n, dim}, std::move(slot));
      // A part without rows still has the rule's slots (empty).
      for (size_t k = out.slots.size(); n == 0 && k < static_cast<size_t>(tables_[f]->rule().num_slots()); ++k) {
        out.slots.emplace_back(Shape{0, dim}, std::vector<float>());
      }
      out.last_step = std::move(part.last_step);
      out.count = std::move(part.count);
      out.removed_ids = std::move(removed);
      removed.clear();
      if (auto s = sink(std::move(out)); !s.ok()) return s;
      part = ps::table::RowsPart();
    }
    return rows->status();
  };
  std::map<std::string, std::string> metadata = save.metadata;
  if (chains) {
    std::string names;
    for (const dist::TableSpec& t : specs) absl::StrAppend(&names, t.name, "\n");
    metadata[ckpt::kTablesKey] = names;
  }
  auto path = SaveTrainingState(
      options_.checkpoint_dir, state, optimizer_->slot_names(), ckpt::SaveOptions{5, save.increment}, metadata,
      options_.env,
      [&](ckpt::SafetensorsWriter& writer) { return WriteTables(scan, specs, *layout, writer, save.increment); });
  if (path.ok()) {
    chain_->Committed(save, step);
  } else {
    chain_->Failed(save);
    if (save.increment && absl::IsFailedPrecondition(path.status())) chain_->Restart(save.save_id);
  }
  return path;
}

absl::StatusOr<int64_t> CtrTrainer::RestoreCheckpoint(const LogSink& log) {
  auto layout = TableLayoutOf(SparseRuleConfigFrom(options_));
  if (!layout.ok()) return layout.status();
  const std::vector<dist::TableSpec> specs = TableSpecsOf(options_);
  auto check_tables = [&](const ckpt::OpenedCheckpoint& file) { return TableSources(file, specs, *layout).status(); };
  auto restored = OpenTrainingState(options_.checkpoint_dir, options_.model, VariableSpecsOf(model_->parameters()),
                                    *optimizer_, log, options_.env, check_tables);
  if (!restored.ok()) return restored.status();
  if (!restored->has_value()) return 0;
  OpenedTrainingState& opened = **restored;
  // Saves go on numbering after the restored one; the next is full (the rows loaded carry no
  // change marks).
  if (chain_ == nullptr) chain_ = std::make_unique<SaveChain>(options_.full_checkpoint_every, options_.seed);
  chain_->Restart(opened.save_id);
  const auto& params = model_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    VariableState& v = opened.state.variables.at(params[i]->name);
    params[i]->value = std::move(v.value);
    for (size_t s = 0; s < v.slots.size() && s < states_[i].slots.size(); ++s) {
      states_[i].slots[s].assign(v.slots[s].data(), v.slots[s].data() + v.slots[s].size());
    }
    states_[i].updates = v.updates;
  }
  auto sources = TableSources(opened.checkpoint, specs, *layout);
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
