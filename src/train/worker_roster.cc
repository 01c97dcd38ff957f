#include "train/worker_roster.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace psflow::train {
namespace {

std::string Workers(const std::vector<int>& indices) {
  return absl::StrCat(indices.size() == 1 ? "worker " : "workers ", absl::StrJoin(indices, ", "));
}

std::set<int> Union(const std::vector<ps::PsTaskStats>& stats, std::vector<int32_t> ps::PsTaskStats::*field) {
  std::set<int> all;
  for (const ps::PsTaskStats& s : stats) all.insert((s.*field).begin(), (s.*field).end());
  return all;
}

}  // namespace

std::string WorkerRoster::Update(const std::vector<ps::PsTaskStats>& stats, double elapsed_secs) {
  std::set<int> connected = Union(stats, &ps::PsTaskStats::connected_worker_indices);
  connected.insert(self_);  // the asking worker is connected
  std::vector<int> missing;
  for (int i = 0; i < num_workers_; ++i) {
    if (!connected.contains(i)) missing.push_back(i);
  }
  connected_ = num_workers_ - static_cast<int>(missing.size());
  if (missing.empty()) {
    if (reported_missing_.empty()) return "";
    reported_missing_.clear();
    return absl::StrCat("chief: all ", num_workers_, " workers connected");
  }
  if (elapsed_secs < grace_secs_) return "";
  if (missing == reported_missing_ && elapsed_secs - reported_at_ < repeat_secs_) return "";
  reported_missing_ = missing;
  reported_at_ = elapsed_secs;
  return absl::StrFormat(
      "chief: %s %s not connected (%d of %d workers connected, %.0f s after the start); "
      "training goes on without %s",
      Workers(missing), missing.size() == 1 ? "has" : "have", connected_, num_workers_, elapsed_secs,
      missing.size() == 1 ? "it" : "them");
}

int WorkerRoster::PushedWorkers(const std::vector<ps::PsTaskStats>& stats) {
  return static_cast<int>(Union(stats, &ps::PsTaskStats::pushed_worker_indices).size());
}

std::string WorkerRoster::NeverPushed(const std::vector<ps::PsTaskStats>& stats, int num_workers) {
  const std::set<int> pushed = Union(stats, &ps::PsTaskStats::pushed_worker_indices);
  std::vector<int> never;
  for (int i = 0; i < num_workers; ++i) {
    if (!pushed.contains(i)) never.push_back(i);
  }
  return never.empty() ? "" : Workers(never);
}

}  // namespace psflow::train
