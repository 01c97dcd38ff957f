// A worker session's tables and prefetches (train/session_tables.h).
#include "train/session_tables.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace psflow::train {

SessionTables::SessionTables(std::vector<dist::TableSpec> tables) : tables_(std::move(tables)) {
  batches_.resize(tables_.size());
  prefetched_.resize(tables_.size());
}

absl::Status SessionTables::CheckCount(const char* call, size_t given) const {
  if (given == tables_.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(call, " got ids for ", given, " tables but the session declares ",
                                                 tables_.size(), "; pass one span per table, in declaration order"));
}

void SessionTables::StartLookup(const std::vector<absl::Span<const int64_t>>& ids, ps::TableStep* step) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    TableBatch& b = batches_[t];
    b.grads = Tensor();
    Prefetched& p = prefetched_[t];
    if (p.valid && std::equal(ids[t].begin(), ids[t].end(), p.given.begin(), p.given.end())) {
      // The very ids given to Prefetch (the usual case): their dedup is the prefetch's.
      b.ids.swap(p.ids);
      b.index.swap(p.index);
      b.rows = std::move(p.rows);
      p.rows = Tensor();
      p.valid = false;
      continue;
    }
    DedupIds(ids[t].data(), static_cast<int64_t>(ids[t].size()), 1, &dedup_);
    b.ids.swap(dedup_.ids);
    b.index.swap(dedup_.index);
    if (p.valid && p.ids == b.ids) {  // the rows came back with the last step's answer
      b.rows = std::move(p.rows);
      p.rows = Tensor();
    } else {
      b.rows = Tensor::Uninitialized({static_cast<int64_t>(b.ids.size()), tables_[t].dim});
      if (!b.ids.empty()) step->pulls.push_back({tables_[t].name, &b.ids, &b.rows, nullptr});
    }
    p.valid = false;
  }
}

void SessionTables::Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    Prefetched& p = prefetched_[t];
    p.given.assign(next_ids[t].begin(), next_ids[t].end());
    DedupIds(next_ids[t].data(), static_cast<int64_t>(next_ids[t].size()), 1, &dedup_);
    p.ids.swap(dedup_.ids);
    p.index.swap(dedup_.index);
    const int64_t rows = static_cast<int64_t>(p.ids.size());
    if (p.rows.shape() != Shape{rows, tables_[t].dim}) p.rows = Tensor::Uninitialized({rows, tables_[t].dim});
    p.asked = true;
    p.valid = false;
  }
}

ps::TableStep SessionTables::StepCall() {
  ps::TableStep step;
  for (size_t t = 0; t < tables_.size(); ++t) {
    TableBatch& b = batches_[t];
    if (!b.grads.empty() && !b.ids.empty()) step.pushes.push_back({tables_[t].name, &b.ids, nullptr, &b.grads});
    Prefetched& p = prefetched_[t];
    if (p.asked && !p.ids.empty()) step.pulls.push_back({tables_[t].name, &p.ids, &p.rows, nullptr});
  }
  return step;
}

void SessionTables::EndStep(bool call_ok) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    batches_[t].grads = Tensor();
    prefetched_[t].valid = call_ok && prefetched_[t].asked;
    prefetched_[t].asked = false;
  }
}

TableBatch& SessionTables::batch(int t) {
  CHECK(t >= 0 && t < static_cast<int>(batches_.size())) << "table_batch(" << t << ") of " << batches_.size();
  return batches_[t];
}

}  // namespace psflow::train
