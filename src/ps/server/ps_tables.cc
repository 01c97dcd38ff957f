// PsServer's embedding tables (ps/server/ps_tables.h).
#include "ps/server/ps_tables.h"

#include <cstring>
#include <iostream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "ps/common/wire_config.h"
#include "ps/server/table/shard_checks.h"

namespace psflow::ps {
namespace {

absl::Status Bad(absl::string_view table, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("table '", table, "': ", why));
}

// A table's storage failing (a disk table's read or write, its cache smaller than a batch): the
// task cannot go on. Memory tables never fail so.
bool IsStorageFailure(const absl::Status& s) { return absl::IsResourceExhausted(s) || absl::IsInternal(s); }

// `s`, told to the table's on_failure first when it is a storage failure.
absl::Status Report(const TableState& t, absl::Status s) {
  if (!s.ok() && IsStorageFailure(s) && t.on_failure) t.on_failure(s);
  return s;
}

// The one check of a table's ids on the ps (docs/tables.md "Wire format"): every id that enters
// (a pull, a push, a prefetch, a checkpoint's rows) is routed to `t`'s shard (fixed: in [0, N) and
// routed here; dynamic: Mix64(id) % P is this task). The shards behind it trust their ids.
absl::Status CheckOwned(const TableState& t, absl::Span<const int64_t> ids) {
  const table::TableConfig& config = t.shard->config();
  const bool dynamic = config.spec.kind == table::TableKind::kDynamic;
  const dist::FixedShardRouter router(dynamic ? dist::FixedTableLayout{} : config.layout());
  for (int64_t id : ids) {
    const int owner = dynamic ? dist::RouteDynamicId(id, t.num_shards) : router.ShardOf(id);
    if (owner == t.shard_index) continue;
    if (owner < 0) return dist::RouteFixedId(config.spec.name, config.layout(), id).status();  // says why
    return Bad(t.name, absl::StrCat("id ", id, " belongs to shard ", owner, ", not ", t.shard_index,
                                    " (client and ps disagree on the layout?)"));
  }
  return absl::OkStatus();
}

}  // namespace

table::SparseRuleConfig SparseRuleOf(const TrainingConfig& config) {
  table::SparseRuleConfig rule;
  rule.optimizer = config.optimizer;
  if (!config.sparse_optimizer.empty()) rule.optimizer.name = config.sparse_optimizer;
  if (config.sparse_learning_rate > 0.0f) rule.optimizer.learning_rate = config.sparse_learning_rate;
  rule.ftrl_l1 = config.ftrl_l1;
  rule.ftrl_l2 = config.ftrl_l2;
  return rule;
}

absl::StatusOr<std::unique_ptr<PsTables>> PsTables::Create(const wire::InitializeRequest& init, int ps_task,
                                                           table::DiskTier* disk,
                                                           std::function<void(const absl::Status&)> on_failure) {
  auto tables = std::make_unique<PsTables>();
  tables->ps_task_ = ps_task;
  if (init.table_shards_size() == 0) return tables;
  absl::StatusOr<TrainingConfig> read = FromWire(init.config());
  if (!read.ok()) return read.status();
  const TrainingConfig& config = *read;
  if (!config.sparse_sync_mean.empty()) {
    absl::StatusOr<table::SparseSyncMean> mean = table::ParseSparseSyncMean(config.sparse_sync_mean);
    if (!mean.ok()) return mean.status();
    tables->mean_ = *mean;
  }
  absl::flat_hash_map<std::string, TableDeclaration> declared;
  for (const TableDeclaration& d : config.tables) {
    if (!declared.emplace(d.spec.name, d).second) return Bad(d.spec.name, "declared twice");
  }
  const table::SparseRuleConfig rule = SparseRuleOf(config);
  for (const wire::TableShardInfo& info : init.table_shards()) {
    auto it = declared.find(info.table());
    if (it == declared.end()) return Bad(info.table(), "a shard of a table the config does not declare");
    const table::TableConfig* c = &it->second;
    const bool dynamic = c->spec.dynamic();
    const int num_shards = dynamic ? info.num_ps() : it->second.num_shards;
    if (info.shard() < 0 || info.shard() >= num_shards) {
      return Bad(info.table(), absl::StrCat("shard ", info.shard(), " of ", num_shards));
    }
    if (c->spec.storage == dist::TableStorage::kDisk && disk == nullptr) {
      return Bad(info.table(), absl::StrCat("storage=disk, but ps task ", ps_task,
                                            " has no disk tier: start every task with --table_dir=DIR"));
    }
    absl::StatusOr<std::unique_ptr<table::TableShard>> shard =
        table::MakeTableShard(*c, table::RuleForTable(rule, c->spec), info.shard(), dynamic ? info.num_ps() : 1,
                              c->spec.storage == dist::TableStorage::kDisk ? disk : nullptr);
    if (!shard.ok()) return shard.status();
    const std::string name =
        !dynamic && num_shards > 1 ? absl::StrCat(info.table(), "/part_", info.shard()) : info.table();
    auto state = std::make_shared<TableState>(name, *std::move(shard), c->spec.dim);
    state->shard_index = info.shard();
    state->num_shards = num_shards;
    state->on_failure = on_failure;
    if (!tables->by_name_.emplace(name, state).second) return Bad(name, "listed twice in Initialize");
    tables->list_.push_back(std::move(state));
  }
  return tables;
}

TableState* PsTables::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second.get();
}

absl::StatusOr<std::vector<TableBlock>> PsTables::Decode(
    const google::protobuf::RepeatedPtrField<wire::TableRows>& blocks, const rpc::IncomingMessage* rows_from,
    int first_tensor) const {
  std::vector<TableBlock> out;
  out.reserve(static_cast<size_t>(blocks.size()));
  absl::flat_hash_map<std::string, int> seen;
  for (int b = 0; b < blocks.size(); ++b) {
    const wire::TableRows& block = blocks[b];
    TableState* t = Find(block.table());
    if (t == nullptr) return Bad(block.table(), absl::StrCat("no such table shard on ps task ", ps_task_));
    if (!seen.emplace(block.table(), b).second) return Bad(block.table(), "two blocks in one call");
    if (block.ids().size() % sizeof(int64_t) != 0) {
      return Bad(block.table(), absl::StrCat("ids of ", block.ids().size(), " bytes, not whole int64s"));
    }
    TableBlock& d = out.emplace_back();
    d.table = t;
    d.ids.resize(block.ids().size() / sizeof(int64_t));
    if (!d.ids.empty()) std::memcpy(d.ids.data(), block.ids().data(), block.ids().size());
    const table::TableConfig& config = t->shard->config();
    if (absl::Status s = table::CheckUnique(config, d.ids); !s.ok()) return s;
    if (absl::Status s = CheckOwned(*t, d.ids); !s.ok()) return s;
    if (rows_from == nullptr) continue;
    const int i = first_tensor + b;
    if (i >= rows_from->num_tensors() || rows_from->meta(i).name() != block.table()) {
      return Bad(block.table(), "its rows are missing from the message's tensors");
    }
    if (absl::Status s =
            table::CheckRowsSize(config, "gradient rows", d.ids.size(), static_cast<size_t>(rows_from->num_floats(i)));
        !s.ok()) {
      return s;
    }
    d.rows.resize(static_cast<size_t>(rows_from->num_floats(i)));
    if (!d.rows.empty()) rows_from->CopyTo(i, d.rows.data());
    if (absl::Status s = table::CheckFinite(config, d.ids, d.rows); !s.ok()) return s;
  }
  return out;
}

absl::Status PsTables::AppendGathered(const std::vector<TableBlock>& blocks, rpc::OutgoingMessage* out) {
  for (const TableBlock& b : blocks) {
    auto rows = std::make_shared<FloatBuffer>(b.ids.size() * static_cast<size_t>(b.table->dim));
    absl::Status s = b.table->shard->Gather(b.ids, absl::MakeSpan(rows->data(), rows->size()));
    if (IsStorageFailure(s)) return Report(*b.table, s);
    CHECK(s.ok()) << "gather of validated ids: " << s;
    rpc::OutgoingTensor t;
    t.meta.set_name(b.table->name);
    t.meta.add_shape(static_cast<int64_t>(b.ids.size()));
    t.meta.add_shape(b.table->dim);
    t.data = rows->data();
    t.num_floats = static_cast<int64_t>(rows->size());
    t.owner = std::move(rows);
    out->tensors.push_back(std::move(t));
  }
  return absl::OkStatus();
}

absl::Status PsTables::ApplyAsync(const std::vector<TableBlock>& blocks, int64_t global_step) {
  for (const TableBlock& b : blocks) {
    if (absl::Status s = b.table->shard->Apply(b.ids, b.rows, global_step); !s.ok()) return Report(*b.table, s);
  }
  for (const std::shared_ptr<TableState>& t : list_) t->shard->MaybeRemove(global_step);
  return absl::OkStatus();
}

void PsTables::Accumulate(int worker, const std::vector<TableBlock>& blocks) {
  absl::flat_hash_map<TableState*, const TableBlock*> given;
  for (const TableBlock& b : blocks) given[b.table] = &b;
  for (const std::shared_ptr<TableState>& t : list_) {
    auto it = given.find(t.get());
    absl::MutexLock lock(&t->mu);
    absl::Status s =
        it == given.end() ? t->sum.Add(worker, {}, {}) : t->sum.Add(worker, it->second->ids, it->second->rows);
    // Validated on arrival; a second gradient of one worker in a step cannot be counted twice by
    // the sync accumulator either.
    if (!s.ok()) std::cerr << "ps task " << ps_task_ << ": sync table gradient dropped: " << s.message() << std::endl;
  }
}

void PsTables::ApplyStep(int64_t global_step) {
  for (const std::shared_ptr<TableState>& t : list_) {
    table::SummedRows rows;
    {
      absl::MutexLock lock(&t->mu);
      rows = t->sum.Finish(mean_);
    }
    if (!rows.ids.empty()) {
      absl::Status s = Report(*t, t->shard->Apply(rows.ids, rows.rows, global_step));
      if (!s.ok()) std::cerr << "ps task " << ps_task_ << ": sync table step not applied: " << s.message() << std::endl;
    }
    t->shard->MaybeRemove(global_step);
  }
}

std::vector<TableTaskStats> PsTables::Stats() const {
  std::vector<TableTaskStats> out;
  for (const std::shared_ptr<TableState>& t : list_) {
    const table::TableStats s = t->shard->stats();
    out.push_back({.table = t->name,
                   .rows = s.rows,
                   .pending_ids = s.pending_ids,
                   .bytes = s.bytes,
                   .admissions = s.admissions,
                   .evictions = s.evictions,
                   .rows_pulled = s.rows_gathered,
                   .rows_pushed = s.rows_pushed,
                   .rows_dropped = s.rows_dropped,
                   .storage = s.storage,
                   .cache_hits = s.cache_hits,
                   .cache_misses = s.cache_misses,
                   .disk_bytes = s.disk_bytes,
                   .disk_rows_read = s.disk_rows_read,
                   .disk_rows_written = s.disk_rows_written});
  }
  return out;
}

namespace {

std::string Int64Bytes(const std::vector<int64_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

bool BytesToInt64(const std::string& bytes, size_t n, std::vector<int64_t>* out) {
  if (bytes.size() != n * sizeof(int64_t)) return false;
  out->resize(n);
  if (n > 0) std::memcpy(out->data(), bytes.data(), bytes.size());
  return true;
}

void AddRows(const std::string& name, int64_t n, int64_t dim, std::vector<float> rows, rpc::OutgoingMessage* out,
             int slot) {
  auto owner = std::make_shared<std::vector<float>>(std::move(rows));
  rpc::OutgoingTensor t;
  t.meta.set_name(name);
  t.meta.add_shape(n);
  t.meta.add_shape(dim);
  t.meta.set_slot(slot);
  t.data = owner->data();
  t.num_floats = static_cast<int64_t>(owner->size());
  t.owner = std::move(owner);
  out->tensors.push_back(std::move(t));
}

}  // namespace

PsTables::~PsTables() {
  absl::MutexLock lock(&scans_mu_);
  scans_.clear();  // before the shards they borrow
}

void PsTables::DropLocked(absl::flat_hash_map<uint64_t, OpenScan>::iterator it, const std::string& why) {
  if (dropped_order_.size() >= kDroppedKept) {
    dropped_.erase(dropped_order_.front());
    dropped_order_.erase(dropped_order_.begin());
  }
  dropped_[it->first] = why;
  dropped_order_.push_back(it->first);
  scans_.erase(it);  // its snapshot goes with it
}

std::vector<std::string> PsTables::DropIdleScans(absl::Time now, absl::Duration bound, const std::string& flag) {
  std::vector<std::string> lines;
  absl::MutexLock lock(&scans_mu_);
  for (auto it = scans_.begin(); it != scans_.end();) {
    auto next = std::next(it);
    if (now - it->second.last_call > bound) {
      const std::string why = absl::StrCat("not read for ", absl::ToDoubleSeconds(bound), " s (", flag,
                                           "): its chief stopped reading it (dead, or its save stopped)");
      lines.push_back(absl::StrCat("dropped the scan of table '", it->second.table->name, "' for save ",
                                   it->second.save_id, ", ", why));
      DropLocked(it, why);
    }
    it = next;
  }
  return lines;
}

std::vector<std::string> PsTables::DropScansOf(uint64_t client_id, const std::string& who) {
  std::vector<std::string> lines;
  if (client_id == 0) return lines;
  absl::MutexLock lock(&scans_mu_);
  for (auto it = scans_.begin(); it != scans_.end();) {
    auto next = std::next(it);
    if (it->second.client_id == client_id) {
      const std::string why = absl::StrCat("opened by ", who, "'s previous process, which was replaced (restarted)");
      lines.push_back(absl::StrCat("dropped the scan of table '", it->second.table->name, "' for save ",
                                   it->second.save_id, ", ", why));
      DropLocked(it, why);
    }
    it = next;
  }
  return lines;
}

absl::Status PsTables::ScanPart(const wire::TableScan& scan, int64_t global_step, wire::TableScanPart* part,
                                rpc::OutgoingMessage* out) {
  absl::MutexLock lock(&scans_mu_);
  const absl::Time now = absl::Now();
  // Every call of a client keeps all of its scans here alive (a save reads its tables in turn).
  if (scan.client_id() != 0) {
    for (auto& [id, open] : scans_) {
      if (open.client_id == scan.client_id()) open.last_call = now;
    }
  }
  auto it = scans_.find(scan.scan_id());
  if (scan.max_rows() < 0) {
    // Close (PsClient::CloseTableScans): a save that failed before reading its opened scans.
    if (it != scans_.end()) scans_.erase(it);
    part->mutable_rows()->set_table(scan.table());
    part->set_done(true);
    return absl::OkStatus();
  }
  if (it == scans_.end()) {
    if (auto gone = dropped_.find(scan.scan_id()); gone != dropped_.end()) {
      return absl::AbortedError(absl::StrCat("ps task ", ps_task_, ": the scan of table '", scan.table(), "' for save ",
                                             scan.save_id(), " was dropped, ", gone->second,
                                             "; this save fails (the next one reads the tables afresh)"));
    }
    TableState* t = Find(scan.table());
    if (t == nullptr) return Bad(scan.table(), absl::StrCat("no such table shard on ps task ", ps_task_));
    // One scan of a shard at a time: a new one replaces a scan left open (a save abandoned or failed
    // half-way), whose snapshot would otherwise keep rows and hold back removal passes.
    for (auto open = scans_.begin(); open != scans_.end();) {
      auto next = std::next(open);
      if (open->second.table == t) DropLocked(open, "replaced by a newer scan of the shard");
      open = next;
    }
    t->shard->RemoveNow(global_step);  // evicted rows are not saved
    table::ScanOptions options;
    options.save_id = scan.save_id();
    options.increment = scan.increment();
    options.changed_since = scan.changed_since();
    options.track_changes = scan.track_changes();
    absl::StatusOr<std::unique_ptr<table::RowScan>> started = t->shard->Scan(options);
    if (!started.ok()) return Report(*t, started.status());
    OpenScan open;
    open.table = t;
    open.scan = *std::move(started);
    open.client_id = scan.client_id();
    open.save_id = scan.save_id();
    open.last_call = now;
    it = scans_.emplace(scan.scan_id(), std::move(open)).first;
  } else if (it->second.table->name != scan.table()) {
    return Bad(scan.table(), absl::StrCat("scan ", scan.scan_id(), " reads '", it->second.table->name, "'"));
  } else {
    it->second.last_call = now;
  }
  if (scan.max_rows() == 0) {
    // Open only (PsClient::OpenTableScans): the scan's snapshot is taken now; its parts come later.
    TableState* t = it->second.table;
    part->mutable_rows()->set_table(t->name);
    part->set_done(false);
    const int slots = t->shard->rule().num_slots();
    for (int k = 0; k <= slots; ++k) AddRows(t->name, 0, t->dim, {}, out, k);
    return absl::OkStatus();
  }
  // An increment's removed ids first, in parts of as many ids as a part's row floats.
  if (const std::vector<int64_t>& removed = it->second.scan->removed(); it->second.removed_sent < removed.size()) {
    const size_t n = std::min(
        removed.size() - it->second.removed_sent,
        static_cast<size_t>(std::max<int64_t>(scan.max_rows(), 1) * std::max<int64_t>(it->second.table->dim, 1)));
    part->set_removed_ids(
        std::string(reinterpret_cast<const char*>(removed.data() + it->second.removed_sent), n * sizeof(int64_t)));
    it->second.removed_sent += n;
    TableState* t = it->second.table;
    part->mutable_rows()->set_table(t->name);
    part->set_done(false);
    // No rows: empty values and slots, as a part without rows has.
    const int slots = t->shard->rule().num_slots();
    for (int k = 0; k <= slots; ++k) AddRows(t->name, 0, t->dim, {}, out, k);
    return absl::OkStatus();
  }
  table::RowsPart rows;
  const bool more = it->second.scan->Next(std::max<int64_t>(scan.max_rows(), 1), &rows);
  TableState* t = it->second.table;
  if (absl::Status s = it->second.scan->status(); !s.ok()) {
    scans_.erase(it);
    return Report(*t, s);
  }
  const int64_t n = static_cast<int64_t>(rows.ids.size());
  part->mutable_rows()->set_table(t->name);
  part->mutable_rows()->set_ids(Int64Bytes(rows.ids));
  part->mutable_rows()->set_last_step(Int64Bytes(rows.last_step));
  part->mutable_rows()->set_count(Int64Bytes(rows.count));
  part->set_done(!more);
  AddRows(t->name, n, t->dim, std::move(rows.values), out, 0);
  for (size_t k = 0; k < rows.slots.size(); ++k) {
    AddRows(t->name, n, t->dim, std::move(rows.slots[k]), out, static_cast<int>(k) + 1);
  }
  if (!more) scans_.erase(it);
  return absl::OkStatus();
}

absl::Status PsTables::Load(const google::protobuf::RepeatedPtrField<wire::TableRows>& blocks,
                            const rpc::IncomingMessage& message) {
  int i = 0;
  for (const wire::TableRows& block : blocks) {
    TableState* t = Find(block.table());
    if (t == nullptr) return Bad(block.table(), absl::StrCat("no such table shard on ps task ", ps_task_));
    const int slots = t->shard->rule().num_slots();
    table::RowsPart part;
    const size_t n = block.ids().size() / sizeof(int64_t);
    if (!BytesToInt64(block.ids(), n, &part.ids) || !BytesToInt64(block.last_step(), n, &part.last_step) ||
        !BytesToInt64(block.count(), n, &part.count)) {
      return Bad(block.table(), "checkpoint rows whose ids, last steps and counts differ in number");
    }
    if (i + 1 + slots > message.num_tensors()) {
      return Bad(block.table(), absl::StrCat("checkpoint rows without their values and ", slots,
                                             " slots (saved with another --sparse_optimizer?)"));
    }
    auto read = [&](std::vector<float>* to) -> absl::Status {
      if (message.meta(i).name() != block.table() || message.num_floats(i) != static_cast<int64_t>(n) * t->dim) {
        return Bad(block.table(), absl::StrCat("checkpoint rows of ", message.num_floats(i), " floats for ", n,
                                               " ids of dim ", t->dim, " (saved with another dim?)"));
      }
      to->resize(static_cast<size_t>(message.num_floats(i)));
      if (!to->empty()) message.CopyTo(i, to->data());
      ++i;
      return absl::OkStatus();
    };
    if (absl::Status s = CheckOwned(*t, part.ids); !s.ok()) return s;
    if (absl::Status s = read(&part.values); !s.ok()) return s;
    part.slots.resize(static_cast<size_t>(slots));
    for (int k = 0; k < slots; ++k) {
      if (absl::Status s = read(&part.slots[k]); !s.ok()) return s;
    }
    if (absl::Status s = t->shard->Load(part); !s.ok()) return Report(*t, s);
  }
  if (i != message.num_tensors()) {
    return absl::InvalidArgumentError(absl::StrCat("table load: ", message.num_tensors() - i,
                                                   " tensors beyond the blocks' rows (saved with another "
                                                   "--sparse_optimizer?)"));
  }
  return absl::OkStatus();
}

}  // namespace psflow::ps
