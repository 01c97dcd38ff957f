// PsClient: tables in checkpoints (docs/tables.md#semantics, checkpoints). ScanTable reads every shard of a
// table through its ps task's scan cursor (the ScanTable call), one part per shard at a time,
// and merges them into one stream of parts in ascending id order (div shards hold ranges, mod
// shards and dynamic shares interleave: the merge serves both). LoadTable routes each restored row
// to the shard that owns it under this client's plan — Mix64(id) % P' for a dynamic table, div/mod
// over the new shards for a fixed one — and sends each ps task its rows (the LoadTable call) part
// by part, between the chief's Initialize and MarkInitialized.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "ps/client/ps_client_impl.h"

namespace psflow::ps {
namespace {

std::string Int64Bytes(const int64_t* v, size_t n) { return std::string(reinterpret_cast<const char*>(v), n * 8); }

std::vector<int64_t> Int64s(const std::string& bytes) {
  std::vector<int64_t> out(bytes.size() / sizeof(int64_t));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(int64_t));
  return out;
}

// One shard's scan: its current part and the next row to merge.
struct ShardCursor {
  const dist::TableShardSpec* shard = nullptr;
  uint64_t scan_id = 0;
  TableRowsPart part;
  size_t next = 0;
  bool done = false;
};

// Appends row `q` of `from` to `to` (allocated for `capacity` rows).
void AppendRow(const TableRowsPart& from, size_t q, int64_t dim, TableRowsPart* to) {
  const size_t at = to->ids.size();
  to->ids.push_back(from.ids[q]);
  to->last_step.push_back(from.last_step[q]);
  to->count.push_back(from.count[q]);
  std::memcpy(to->values.data() + at * dim, from.values.data() + q * dim, dim * sizeof(float));
  for (size_t k = 0; k < from.slots.size(); ++k) {
    std::memcpy(to->slots[k].data() + at * dim, from.slots[k].data() + q * dim, dim * sizeof(float));
  }
}

// A part of `capacity` rows, `slots` slots, cut to `n` rows.
TableRowsPart NewPart(const std::string& table, int64_t capacity, int64_t dim, size_t slots) {
  TableRowsPart part;
  part.table = table;
  part.values = Tensor({capacity, dim});
  part.slots.assign(slots, Tensor({capacity, dim}));
  return part;
}

void CutTo(TableRowsPart* part, int64_t dim) {
  const int64_t n = static_cast<int64_t>(part->ids.size());
  if (part->values.dim(0) == n) return;
  auto cut = [&](Tensor& t) {
    Tensor c({n, dim});
    if (n > 0) std::memcpy(c.data(), t.data(), static_cast<size_t>(n * dim) * sizeof(float));
    t = std::move(c);
  };
  cut(part->values);
  for (Tensor& s : part->slots) cut(s);
}

// A scan part's size at most (values and up to two slots, ids, last steps and counts), which sizes the
// call's deadline (call_deadline.h).
int64_t ScanAnswerBytes(int64_t max_rows, int64_t dim) {
  return max_rows * (3 * dim * static_cast<int64_t>(sizeof(float)) + 3 * static_cast<int64_t>(sizeof(int64_t)));
}

// Cursor c's next part from a ScanTable answer of `peer` (a shard of `table`, rows of `dim`); its
// removed ids appended to `removed`.
absl::Status ReadScanPart(const rpc::IncomingMessage& m, const std::string& table, const std::string& shard,
                          int64_t dim, const std::string& peer, ShardCursor* c, std::vector<int64_t>* removed) {
  wire::ScanTableResponse response;
  if (absl::Status s = Parse(m, &response, peer); !s.ok()) return s;
  const std::string& removed_bytes = response.part().removed_ids();
  if (removed_bytes.size() % sizeof(int64_t) != 0) {
    return absl::DataLossError(absl::StrCat(peer, ": a malformed list of removed ids of '", shard, "'"));
  }
  const std::vector<int64_t> gone = Int64s(removed_bytes);
  removed->insert(removed->end(), gone.begin(), gone.end());
  const wire::TableRows& rows = response.part().rows();
  TableRowsPart part;
  part.table = table;
  part.ids = Int64s(rows.ids());
  part.last_step = Int64s(rows.last_step());
  part.count = Int64s(rows.count());
  const int64_t n = static_cast<int64_t>(part.ids.size());
  if (m.num_tensors() < 1 || static_cast<int64_t>(part.last_step.size()) != n ||
      static_cast<int64_t>(part.count.size()) != n) {
    return absl::DataLossError(absl::StrCat(peer, ": a malformed scan part of '", shard, "'"));
  }
  for (int i = 0; i < m.num_tensors(); ++i) {
    if (m.num_floats(i) != n * dim) {
      return absl::DataLossError(absl::StrCat(peer, ": scan part of '", shard, "' has the wrong size"));
    }
    Tensor rows_tensor({n, dim});
    if (n > 0) m.CopyTo(i, rows_tensor.data());
    if (i == 0) {
      part.values = std::move(rows_tensor);
    } else {
      part.slots.push_back(std::move(rows_tensor));
    }
  }
  c->part = std::move(part);
  c->next = 0;
  c->done = response.part().done();
  return absl::OkStatus();
}

// A restored part of `table` (dim `dim`) whose sizes agree, or InvalidArgument saying which do not.
absl::Status CheckRestoredPart(const std::string& table, const TableRowsPart& part, int64_t dim) {
  const size_t n = part.ids.size();
  if (part.values.size() != static_cast<int64_t>(n) * dim || part.last_step.size() != n || part.count.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("restore: table '", table, "': a part of ", n, " ids has values ",
                                                   ShapeToString(part.values.shape()), " (the table's dim is ", dim,
                                                   ")"));
  }
  for (const Tensor& s : part.slots) {
    if (s.size() != part.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat("restore: table '", table, "': a slot of the wrong size"));
    }
  }
  return absl::OkStatus();
}

// The part's rows per owning shard of table `table`, placed as `t` on `num_ps` tasks (in part order:
// ascending ids stay ascending): Mix64(id) % P for a dynamic table, div/mod over the shards for a
// fixed one.
absl::StatusOr<std::vector<std::vector<size_t>>> RowsPerShard(const std::string& table, const dist::TablePlacement& t,
                                                              int num_ps, const TableRowsPart& part) {
  std::vector<std::vector<size_t>> picks(t.shards.size());
  for (size_t q = 0; q < part.ids.size(); ++q) {
    int shard;
    if (t.spec.dynamic()) {
      shard = dist::RouteDynamicId(part.ids[q], num_ps);
    } else {
      absl::StatusOr<dist::RowLocation> loc = dist::RouteFixedId(table, t.layout, part.ids[q]);
      if (!loc.ok()) return absl::InvalidArgumentError(absl::StrCat("restore: ", loc.status().message()));
      shard = loc->shard;
    }
    picks[static_cast<size_t>(shard)].push_back(q);
  }
  return picks;
}

// The rows `picks` of `part` as a block of `shard` in a LoadTable request: ids, last steps and counts
// into `header`, the values then each slot into `tensors`.
void AddLoadBlock(const dist::TableShardSpec& shard, const TableRowsPart& part, const std::vector<size_t>& picks,
                  int64_t dim, wire::LoadTableRequest* header, std::vector<rpc::OutgoingTensor>* tensors) {
  std::vector<int64_t> ids, last, count;
  for (size_t q : picks) ids.push_back(part.ids[q]), last.push_back(part.last_step[q]), count.push_back(part.count[q]);
  wire::TableRows* block = header->add_rows();
  block->set_table(shard.name);
  block->set_ids(Int64Bytes(ids.data(), ids.size()));
  block->set_last_step(Int64Bytes(last.data(), last.size()));
  block->set_count(Int64Bytes(count.data(), count.size()));
  auto add = [&](const Tensor& from, int slot) {
    auto rows = std::make_shared<FloatBuffer>(picks.size() * static_cast<size_t>(dim));
    for (size_t r = 0; r < picks.size(); ++r) {
      std::memcpy(rows->data() + r * dim, from.data() + picks[r] * dim, dim * sizeof(float));
    }
    rpc::OutgoingTensor o;
    o.meta.set_name(shard.name);
    o.meta.add_shape(static_cast<int64_t>(picks.size()));
    o.meta.add_shape(dim);
    o.meta.set_slot(slot);
    o.data = rows->data();
    o.num_floats = static_cast<int64_t>(rows->size());
    o.owner = std::move(rows);
    tensors->push_back(std::move(o));
  };
  add(part.values, 0);
  for (size_t j = 0; j < part.slots.size(); ++j) add(part.slots[j], static_cast<int>(j) + 1);
}

}  // namespace

absl::Status PsClient::Impl::OpenTableScans(const std::vector<std::string>& tables, const TableScanOptions& options) {
  CHECK(!rpc::OnTransportThread()) << "OpenTableScans from an async completion callback would deadlock";
  // Every shard of every table, one request each, all in flight at once.
  std::vector<const dist::TablePlacement*> placements;
  for (const std::string& table : tables) {
    const dist::TablePlacement* t = options_.plan.Table(table);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("OpenTableScans: table '", table, "' is not in the plan"));
    }
    placements.push_back(t);
  }
  std::vector<std::vector<uint64_t>> ids(placements.size());
  std::vector<rpc::ClientChannel*> channels;
  std::vector<rpc::OutgoingMessage> requests;
  for (size_t i = 0; i < placements.size(); ++i) {
    for (const dist::TableShardSpec& shard : placements[i]->shards) {
      ids[i].push_back((client_id_ << 16) ^ next_seq_.fetch_add(1));
      wire::TableScan scan;
      scan.set_table(shard.name);
      scan.set_scan_id(ids[i].back());
      scan.set_max_rows(0);  // open only
      scan.set_save_id(options.save_id);
      scan.set_increment(options.increment);
      scan.set_changed_since(options.changed_since);
      scan.set_track_changes(options.track_changes);
      scan.set_client_id(client_id_);
      channels.push_back(channel(shard.ps_task));
      requests.push_back(rpc::OutgoingMessage::Of(scan));
    }
  }
  absl::Status opened = CallAndWait(
      channels, rpc::Method::kScanTable, std::move(requests), Control(options_.rpc_timeout_secs),
      [&](int k, const rpc::IncomingMessage& m) {
        wire::ScanTableResponse response;
        return Parse(m, &response, channels[k]->peer_name());
      },
      /*retrier=*/nullptr);
  if (!opened.ok()) return opened;
  absl::MutexLock lock(&scans_mu_);
  for (size_t i = 0; i < placements.size(); ++i) opened_scans_[tables[i]] = std::move(ids[i]);
  return absl::OkStatus();
}

absl::Status PsClient::Impl::CloseTableScans() {
  CHECK(!rpc::OnTransportThread()) << "CloseTableScans from an async completion callback would deadlock";
  absl::flat_hash_map<std::string, std::vector<uint64_t>> opened;
  {
    absl::MutexLock lock(&scans_mu_);
    opened.swap(opened_scans_);
  }
  std::vector<rpc::ClientChannel*> channels;
  std::vector<rpc::OutgoingMessage> requests;
  for (const auto& [table, ids] : opened) {
    const dist::TablePlacement* t = options_.plan.Table(table);
    for (size_t s = 0; t != nullptr && s < t->shards.size() && s < ids.size(); ++s) {
      wire::TableScan scan;
      scan.set_table(t->shards[s].name);
      scan.set_scan_id(ids[s]);
      scan.set_max_rows(-1);  // close
      scan.set_client_id(client_id_);
      channels.push_back(channel(t->shards[s].ps_task));
      requests.push_back(rpc::OutgoingMessage::Of(scan));
    }
  }
  if (requests.empty()) return absl::OkStatus();
  return CallAndWait(channels, rpc::Method::kScanTable, std::move(requests), Control(options_.rpc_timeout_secs),
                     [&](int k, const rpc::IncomingMessage& m) {
                       wire::ScanTableResponse response;
                       return Parse(m, &response, channels[k]->peer_name());
                     });
}

absl::Status PsClient::Impl::ScanTable(const std::string& table, int64_t max_rows, const TableScanOptions& options,
                                       const std::function<absl::Status(TableRowsPart part)>& sink) {
  CHECK(!rpc::OnTransportThread()) << "ScanTable from an async completion callback would deadlock";
  const dist::TablePlacement* t = options_.plan.Table(table);
  if (t == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("ScanTable: table '", table, "' is not in the plan"));
  max_rows = std::max<int64_t>(max_rows, 1);
  const int64_t dim = t->spec.dim;
  std::vector<ShardCursor> cursors(t->shards.size());
  std::vector<int64_t> removed;  // an increment's, from every shard
  std::vector<uint64_t> opened;  // by OpenTableScans
  {
    absl::MutexLock lock(&scans_mu_);
    if (auto it = opened_scans_.find(table); it != opened_scans_.end()) {
      opened = std::move(it->second);
      opened_scans_.erase(it);
    }
  }
  for (size_t s = 0; s < t->shards.size(); ++s) {
    cursors[s].shard = &t->shards[s];
    cursors[s].scan_id = s < opened.size() ? opened[s] : (client_id_ << 16) ^ next_seq_.fetch_add(1);
  }
  // Reads cursor c's next part from its ps task (not retried: see ps_client.h).
  auto refill = [&](ShardCursor& c) -> absl::Status {
    wire::TableScan scan;
    scan.set_table(c.shard->name);
    scan.set_scan_id(c.scan_id);
    scan.set_max_rows(max_rows);
    scan.set_save_id(options.save_id);
    scan.set_increment(options.increment);
    scan.set_changed_since(options.changed_since);
    scan.set_track_changes(options.track_changes);
    scan.set_client_id(client_id_);
    std::vector<rpc::OutgoingMessage> requests;
    requests.push_back(rpc::OutgoingMessage::Of(scan));
    const int k = c.shard->ps_task;
    return CallAndWait({channel(k)}, rpc::Method::kScanTable, std::move(requests), Control(options_.rpc_timeout_secs),
                       [&](int, const rpc::IncomingMessage& m) {
                         return ReadScanPart(m, table, c.shard->name, dim, channel(k)->peer_name(), &c, &removed);
                       },
                       /*retrier=*/nullptr, {ScanAnswerBytes(max_rows, dim)});
  };
  // Each shard's first rows (its removed ids come before them).
  for (ShardCursor& c : cursors) {
    if (absl::Status s = refill(c); !s.ok()) return s;
    while (c.part.ids.empty() && !c.done) {
      if (absl::Status s = refill(c); !s.ok()) return s;
    }
  }
  const size_t slots = cursors.empty() ? 0 : cursors[0].part.slots.size();
  TableRowsPart out = NewPart(table, max_rows, dim, slots);
  std::sort(removed.begin(), removed.end());
  removed.erase(std::unique(removed.begin(), removed.end()), removed.end());
  out.removed_ids = std::move(removed);
  while (true) {
    ShardCursor* best = nullptr;
    for (ShardCursor& c : cursors) {
      while (c.next == c.part.ids.size() && !c.done) {
        if (absl::Status s = refill(c); !s.ok()) return s;
      }
      if (c.next < c.part.ids.size() && (best == nullptr || c.part.ids[c.next] < best->part.ids[best->next])) {
        best = &c;
      }
    }
    if (best == nullptr) break;
    if (best->part.slots.size() != slots) {
      return absl::DataLossError(absl::StrCat("ScanTable: the shards of '", table, "' have different slot counts"));
    }
    AppendRow(best->part, best->next++, dim, &out);
    if (static_cast<int64_t>(out.ids.size()) == max_rows) {
      if (absl::Status s = sink(std::move(out)); !s.ok()) return s;
      out = NewPart(table, max_rows, dim, slots);
    }
  }
  if (!out.ids.empty() || !out.removed_ids.empty()) {
    CutTo(&out, dim);
    return sink(std::move(out));
  }
  return absl::OkStatus();
}

absl::Status PsClient::Impl::LoadTable(const std::string& table, const TablePartSource& source) {
  const dist::TablePlacement* t = options_.plan.Table(table);
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("restore: table '", table, "' is not in the plan"));
  }
  TableRowsPart part;
  while (true) {
    absl::StatusOr<bool> more = source(&part);
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();
    if (absl::Status s = CheckRestoredPart(table, part, t->spec.dim); !s.ok()) return s;
    absl::StatusOr<std::vector<std::vector<size_t>>> picks = RowsPerShard(table, *t, options_.plan.num_ps, part);
    if (!picks.ok()) return picks.status();
    std::vector<wire::LoadTableRequest> headers(channels_.size());
    std::vector<std::vector<rpc::OutgoingTensor>> tensors(channels_.size());
    for (size_t s = 0; s < picks->size(); ++s) {
      if ((*picks)[s].empty()) continue;
      const int k = t->shards[s].ps_task;
      AddLoadBlock(t->shards[s], part, (*picks)[s], t->spec.dim, &headers[k], &tensors[k]);
    }
    std::vector<rpc::ClientChannel*> channels;
    std::vector<rpc::OutgoingMessage> requests;
    for (int k = 0; k < num_ps(); ++k) {
      if (headers[k].rows_size() == 0) continue;
      headers[k].set_worker_index(options_.worker_index);
      rpc::OutgoingMessage message = rpc::OutgoingMessage::Of(headers[k]);
      message.tensors = std::move(tensors[k]);
      channels.push_back(channel(k));
      requests.push_back(std::move(message));
    }
    // A retried load stores the same rows again (a ps's Load overwrites): safe to retry.
    if (absl::Status s = CallAndWait(channels, rpc::Method::kLoadTable, std::move(requests),
                                     Control(options_.rpc_timeout_secs), nullptr, retrier_.get());
        !s.ok()) {
      return s;
    }
  }
}

}  // namespace psflow::ps
