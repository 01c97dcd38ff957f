// A worker session's tables and prefetches (train/session_tables.h).
#include "train/session_tables.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace psflow::train {

SessionTables::SessionTables(std::vector<dist::TableSpec> tables) : tables_(std::move(tables)) {
  batches_.resize(tables_.size());
  prefetched_.resize(tables_.size());
  group_of_.assign(tables_.size(), -1);
  taken_.assign(tables_.size(), 0);
}

bool SessionTables::SameIds(absl::Span<const int64_t> raw, absl::Span<const int64_t> ids) {
  return raw.size() == ids.size() && (raw.data() == ids.data() || raw == ids);
}

std::vector<absl::Span<const int64_t>> SessionTables::PrefetchedIds() const {
  std::vector<absl::Span<const int64_t>> ids;
  ids.reserve(prefetched_.size());
  for (const Prefetched& p : prefetched_) ids.emplace_back(p.raw);
  return ids;
}

absl::StatusOr<int> SessionTables::Group(int first, int count) {
  const int n = size();
  if (count < 1 || first < 0 || first + count > n) {
    return absl::InvalidArgumentError(absl::StrCat("GroupTables(", first, ", ", count, "): the session declares ", n,
                                                   " tables; give consecutive declared tables"));
  }
  if (started_) {
    return absl::FailedPreconditionError(absl::StrCat("GroupTables: table '", tables_[first].name,
                                                      "' was looked up already; group tables before the first Lookup"));
  }
  for (int t = first; t < first + count; ++t) {
    if (group_of_[t] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("GroupTables: table '", tables_[t].name, "' is in another group"));
    }
    if (tables_[t].dim != tables_[first].dim) {
      return absl::InvalidArgumentError(absl::StrCat("GroupTables: table '", tables_[t].name, "' has dim ",
                                                     tables_[t].dim, ", table '", tables_[first].name, "' ",
                                                     tables_[first].dim, "; a group's tables share one dim"));
    }
  }
  const int g = num_groups();
  TableGroup& group = groups_.emplace_back();
  group.batch.first = first;
  group.batch.count = count;
  group.batch.offsets.assign(static_cast<size_t>(count) + 1, 0);
  for (int t = first; t < first + count; ++t) group_of_[t] = g;
  return g;
}

TableGroupBatch& SessionTables::group(int g) {
  CHECK(g >= 0 && g < num_groups()) << "table_group(" << g << ") of " << groups_.size();
  return groups_[static_cast<size_t>(g)].batch;
}

void SessionTables::FillGroup(size_t g, const std::vector<char>& taken, ps::TableStep* step) {
  TableGroup& group = groups_[g];
  TableGroupBatch& gb = group.batch;
  const int64_t dim = tables_[static_cast<size_t>(gb.first)].dim;
  bool all = true;
  for (int k = 0; k < gb.count; ++k) {
    const size_t t = static_cast<size_t>(gb.first + k);
    gb.offsets[k + 1] = gb.offsets[k] + static_cast<int64_t>(batches_[t].ids.size());
    all = all && taken[t] != 0;
  }
  const int64_t total = gb.offsets.back();
  // The index: the prefetch's when every table took the prefetch's deduplication (taken == 2),
  // else made here.
  bool same_dedup = true;
  for (int k = 0; k < gb.count && same_dedup; ++k) same_dedup = taken[static_cast<size_t>(gb.first + k)] == 2;
  if (same_dedup && group.next_has_index) {
    gb.index.swap(group.next_index);
    gb.has_index = true;
  } else {
    std::vector<const std::vector<int64_t>*> index;
    for (int k = 0; k < gb.count; ++k) index.push_back(&batches_[static_cast<size_t>(gb.first + k)].index);
    gb.has_index = GroupIndex(index, gb.offsets, &gb.index);
  }
  if (all && group.next_offsets == gb.offsets && group.next.shape() == Shape{total, dim}) {
    gb.rows = std::move(group.next);  // the prefetch filled it: no copy
    group.next = Tensor();
    return;
  }
  gb.rows = Tensor::Uninitialized({total, dim});
  for (int k = 0; k < gb.count; ++k) {
    const size_t t = static_cast<size_t>(gb.first + k);
    const TableBatch& b = batches_[t];
    const size_t n = b.ids.size() * static_cast<size_t>(dim);
    float* dest = gb.rows.data() + gb.offsets[k] * dim;
    if (taken[t] != 0) {  // its rows came with the prefetch, among another batch's
      if (n > 0) std::memcpy(dest, group.next.data() + group.next_offsets[k] * dim, n * sizeof(float));
    } else if (n > 0) {
      step->pulls.push_back({tables_[t].name, &b.ids, nullptr, nullptr, {}, absl::MakeSpan(dest, n)});
    }
  }
}

void SessionTables::SizeGroupsNext() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    TableGroup& group = groups_[g];
    const int first = group.batch.first;
    group.next_offsets.assign(static_cast<size_t>(group.batch.count) + 1, 0);
    for (int k = 0; k < group.batch.count; ++k) {
      group.next_offsets[k + 1] =
          group.next_offsets[k] + static_cast<int64_t>(prefetched_[static_cast<size_t>(first + k)].ids.size());
    }
    const Shape shape{group.next_offsets.back(), tables_[static_cast<size_t>(first)].dim};
    if (group.next.shape() != shape) group.next = Tensor::Uninitialized(shape);
    std::vector<const std::vector<int64_t>*> index;
    for (int k = 0; k < group.batch.count; ++k) index.push_back(&prefetched_[static_cast<size_t>(first + k)].index);
    group.next_has_index = GroupIndex(index, group.next_offsets, &group.next_index);
  }
}

bool SessionTables::GroupIndex(const std::vector<const std::vector<int64_t>*>& index,
                               const std::vector<int64_t>& offsets, std::vector<int64_t>* out) {
  const size_t n = index.empty() ? 0 : index[0]->size();
  for (const std::vector<int64_t>* i : index) {
    if (i->size() != n) return false;
  }
  const size_t count = index.size();
  out->resize(n * count);
  int64_t* o = out->data();
  // Example by example: each table's index read in order, the output written in order.
  for (size_t i = 0; i < n; ++i, o += count) {
    for (size_t k = 0; k < count; ++k) o[k] = (*index[k])[i] + offsets[k];
  }
  return true;
}

ps::TableRowsRef SessionTables::PrefetchPull(size_t t) {
  Prefetched& p = prefetched_[t];
  const int g = group_of_[t];
  if (g < 0) return {tables_[t].name, &p.ids, &p.rows, nullptr};
  TableGroup& group = groups_[static_cast<size_t>(g)];
  const int64_t dim = tables_[t].dim;
  const size_t k = t - static_cast<size_t>(group.batch.first);
  return {tables_[t].name,
          &p.ids,
          nullptr,
          nullptr,
          {},
          absl::MakeSpan(group.next.data() + group.next_offsets[k] * dim, p.ids.size() * static_cast<size_t>(dim))};
}

absl::Status SessionTables::CheckCount(const char* call, size_t given) const {
  if (given == tables_.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(call, " got ids for ", given, " tables but the session declares ",
                                                 tables_.size(), "; pass one span per table, in declaration order"));
}

void SessionTables::StartLookup(const std::vector<absl::Span<const int64_t>>& ids, ps::TableStep* step) {
  started_ = true;
  for (size_t t = 0; t < tables_.size(); ++t) {
    TableBatch& b = batches_[t];
    Prefetched& p = prefetched_[t];
    const bool prefetched_batch = p.valid && SameIds(p.raw, ids[t]);
    if (prefetched_batch) {  // the batch the last step prefetched: its deduplication is the prefetch's
      b.ids.swap(p.ids);
      b.index.swap(p.index);
    } else {
      DedupIds(ids[t].data(), static_cast<int64_t>(ids[t].size()), 1, &dedup_);
      b.ids.swap(dedup_.ids);
      b.index.swap(dedup_.index);
    }
    DropGrads(&b);
    // 2: the prefetched batch; 1: the same ids; either way the rows came back with the last step's answer.
    const char taken = prefetched_batch ? 2 : (p.valid && p.ids == b.ids) ? 1 : 0;
    if (group_of_[t] >= 0) {  // its rows: in its group's buffer (FillGroup, below)
      taken_[t] = taken;
      b.rows = Tensor();
    } else if (taken != 0) {
      b.rows = std::move(p.rows);
      p.rows = Tensor();
    } else {
      b.rows = Tensor::Uninitialized({static_cast<int64_t>(b.ids.size()), tables_[t].dim});
      if (!b.ids.empty()) step->pulls.push_back({tables_[t].name, &b.ids, &b.rows, nullptr});
    }
    p.valid = false;
  }
  for (size_t g = 0; g < groups_.size(); ++g) FillGroup(g, taken_, step);
}

void SessionTables::Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    DedupIds(next_ids[t].data(), static_cast<int64_t>(next_ids[t].size()), 1, &dedup_);
    Ask(t, next_ids[t], &dedup_);
  }
  SizeGroupsNext();
}

absl::Status SessionTables::Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids,
                                     std::vector<UniqueIds>* unique) {
  if (unique->size() != next_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Prefetch got ", unique->size(), " deduplicated tables for ",
                                                   next_ids.size(), " tables' ids; pass one per table"));
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (absl::Status s = CheckUnique(next_ids[t], (*unique)[t]); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Prefetch: table '", tables_[t].name, "': ", s.message(), "; pass DedupIds of the table's ids"));
    }
  }
  for (size_t t = 0; t < tables_.size(); ++t) Ask(t, next_ids[t], &(*unique)[t]);
  SizeGroupsNext();
  return absl::OkStatus();
}

absl::Status SessionTables::CheckUnique(absl::Span<const int64_t> raw, const UniqueIds& unique) {
  if (unique.index.size() != raw.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("an index of ", unique.index.size(), " positions for ", raw.size(), " ids"));
  }
  // Order of first appearance: each example's position is one seen before or the next new one.
  const int64_t n = static_cast<int64_t>(unique.ids.size());
  int64_t seen = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    const int64_t at = unique.index[i];
    if (at < 0 || at > seen || at >= n || unique.ids[at] != raw[i]) {
      return absl::InvalidArgumentError(absl::StrCat("example ", i, "'s id ", raw[i], " is not at its index ", at));
    }
    if (at == seen) ++seen;
  }
  if (seen != n) return absl::InvalidArgumentError(absl::StrCat(n - seen, " unique ids no example holds"));
  return absl::OkStatus();
}

void SessionTables::Ask(size_t t, absl::Span<const int64_t> raw, UniqueIds* unique) {
  started_ = true;
  Prefetched& p = prefetched_[t];
  p.raw.assign(raw.begin(), raw.end());
  p.ids.swap(unique->ids);
  p.index.swap(unique->index);
  const int64_t rows = static_cast<int64_t>(p.ids.size());
  if (group_of_[t] < 0 && p.rows.shape() != Shape{rows, tables_[t].dim}) {  // (grouped: SizeGroupsNext)
    p.rows = Tensor::Uninitialized({rows, tables_[t].dim});
  }
  p.asked = true;
  p.valid = false;
}

ps::TableStep SessionTables::StepCall() { return StepCall(nullptr); }

namespace {

// Whether a table's batch pushes: gradients written or lent, and ids.
bool Pushes(const TableBatch& b) { return (!b.grads.empty() || b.grads_values.data() != nullptr) && !b.ids.empty(); }

}  // namespace

void SessionTables::DropGrads(TableBatch* b) {
  b->grads = Tensor();
  b->grads_values = {};
  b->grads_owner.reset();
}

ps::TableStep SessionTables::StepCall(KeptTables* kept) {
  ps::TableStep step;
  if (kept != nullptr) {  // sized first: the call points into their elements
    size_t pushed = 0;
    for (const TableBatch& b : batches_) pushed += Pushes(b);
    kept->ids.resize(pushed);
    kept->grads.resize(pushed);
  }
  size_t k = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    TableBatch& b = batches_[t];
    if (Pushes(b)) {
      const bool lent = b.grads.empty();
      auto* ids = &b.ids;
      auto* grads = &b.grads;
      if (kept != nullptr) {
        kept->ids[k] = std::move(b.ids);
        b.ids.clear();
        kept->grads[k] = std::move(b.grads);
        if (lent && b.grads_owner != nullptr) kept->owners.push_back(std::move(b.grads_owner));
        ids = &kept->ids[k];
        grads = &kept->grads[k];
      }
      step.pushes.push_back(
          {tables_[t].name, ids, nullptr, lent ? nullptr : grads, lent ? b.grads_values : absl::Span<const float>()});
      if (kept != nullptr) {
        DropGrads(&b);
        ++k;
      }
    }
    Prefetched& p = prefetched_[t];
    if (p.asked && !p.ahead && !p.ids.empty()) step.pulls.push_back(PrefetchPull(t));
  }
  return step;
}

bool SessionTables::ServedByPrefetch(const std::vector<absl::Span<const int64_t>>& ids) const {
  for (size_t t = 0; t < tables_.size(); ++t) {
    const Prefetched& p = prefetched_[t];
    if (!ids[t].empty() && !(p.valid && SameIds(p.raw, ids[t]))) return false;
  }
  return true;
}

bool SessionTables::RidesOnPush() const {
  for (const Prefetched& p : prefetched_) {
    if (p.asked && !p.ahead && !p.ids.empty()) return true;
  }
  return false;
}

void SessionTables::DropPrefetched() {
  for (Prefetched& p : prefetched_) p.valid = false;
}

void SessionTables::EndStep(bool call_ok) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    DropGrads(&batches_[t]);
    Prefetched& p = prefetched_[t];
    if (p.ahead) continue;  // its own call's answer decides (EndAhead)
    p.valid = call_ok && p.asked;
    p.asked = false;
  }
}

ps::TableStep SessionTables::AheadCall() {
  ps::TableStep step;
  for (size_t t = 0; t < tables_.size(); ++t) {
    Prefetched& p = prefetched_[t];
    if (!p.asked || p.ahead) continue;
    p.ahead = true;
    if (!p.ids.empty()) step.pulls.push_back(PrefetchPull(t));
  }
  return step;
}

void SessionTables::EndAhead(bool ok) {
  for (Prefetched& p : prefetched_) {
    if (!p.ahead) continue;
    p.valid = ok;
    p.ahead = p.asked = false;
  }
}

void SessionTables::StartAhead(ps::PsClient& client) {
  const ps::TableStep call = AheadCall();
  if (call.pulls.empty()) return EndAhead(true);
  auto ahead = std::make_shared<Ahead>();
  ahead_ = ahead;
  static const std::vector<std::pair<std::string, Tensor*>> kNoDense;
  client.PullAsync(kNoDense, call, [ahead](absl::StatusOr<int64_t> r) {
    ahead->status = r.status();
    ahead->done.Notify();
  });
}

void SessionTables::WaitAhead() {
  if (ahead_ != nullptr) ahead_->done.WaitForNotification();
}

void SessionTables::SettleAhead(bool ok) {
  if (ahead_ == nullptr) return;
  ahead_->done.WaitForNotification();
  EndAhead(ok && ahead_->status.ok());
  ahead_.reset();
}

TableBatch& SessionTables::batch(int t) {
  CHECK(t >= 0 && t < static_cast<int>(batches_.size())) << "table_batch(" << t << ") of " << batches_.size();
  return batches_[t];
}

}  // namespace psflow::train
