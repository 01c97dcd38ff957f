#include "ps/server/table/scan_snapshot.h"

#include <algorithm>

namespace psflow::ps::table {

std::unique_ptr<Snapshot> SnapshotSet::Open(uint32_t start_gen) {
  auto snapshot = std::unique_ptr<Snapshot>(new Snapshot(shared_from_this(), start_gen));
  absl::MutexLock lock(&mu_);
  snapshots_.push_back(snapshot.get());
  open_.fetch_add(1, std::memory_order_release);
  return snapshot;
}

Snapshot::~Snapshot() {
  absl::MutexLock lock(&set_->mu_);
  auto& list = set_->snapshots_;
  list.erase(std::remove(list.begin(), list.end(), this), list.end());
  set_->open_.fetch_sub(1, std::memory_order_release);
}

void SnapshotSet::Capture(int64_t id, uint32_t gen, const float* floats, int64_t n, int64_t last_step, int64_t count) {
  absl::MutexLock lock(&mu_);
  for (Snapshot* s : snapshots_) {
    s->set_->mu_.AssertHeld();                      // (mu_ itself: every snapshot of the set is guarded by it)
    if (gen >= s->start_gen_) continue;             // changed since the snapshot: kept already, or made after it
    if (s->started_ && id <= s->cursor_) continue;  // read already
    auto [it, added] = s->kept_.try_emplace(id);
    if (!added) continue;  // (a stamp left unchanged by a refused push: the first copy stands)
    it->second.floats.assign(floats, floats + n);
    it->second.last_step = last_step;
    it->second.count = count;
    it->second.gen = gen;
  }
}

Snapshot::Source Snapshot::Read(int64_t id, uint32_t live_gen, KeptRow* kept) {
  absl::MutexLock lock(&set_->mu_);
  started_ = true;
  cursor_ = std::max(cursor_, id);
  if (auto it = kept_.find(id); it != kept_.end()) {
    *kept = std::move(it->second);
    kept_.erase(it);
    return kKept;
  }
  return live_gen >= start_gen_ ? kSkip : kLive;
}

std::vector<std::pair<int64_t, KeptRow>> Snapshot::TakeKeptBefore(std::optional<int64_t> id) {
  absl::MutexLock lock(&set_->mu_);
  std::vector<std::pair<int64_t, KeptRow>> rows;
  const auto end = id.has_value() ? kept_.lower_bound(*id) : kept_.end();
  for (auto it = kept_.begin(); it != end; ++it) {
    started_ = true;
    cursor_ = std::max(cursor_, it->first);
    rows.emplace_back(it->first, std::move(it->second));
  }
  kept_.erase(kept_.begin(), end);  // (a btree's erase moves its other iterators)
  return rows;
}

int64_t Snapshot::kept_rows() const {
  absl::MutexLock lock(&set_->mu_);
  return static_cast<int64_t>(kept_.size());
}

}  // namespace psflow::ps::table
