// The work queue of a job's training files (ps/server/work_queue.h).
#include "ps/server/work_queue.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "psflow/core/random.h"

namespace psflow::ps {
namespace {

// Version 2 adds "taken" (the slices taken beyond the cursor); version 1 states read as none.
constexpr int kStateVersion = 2;

bool SamePlan(const WorkPlan& a, const WorkPlan& b) {
  if (a.files != b.files || a.slices.size() != b.slices.size() || a.num_epochs != b.num_epochs ||
      a.shuffle != b.shuffle || a.seed != b.seed || a.split_workers != b.split_workers) {
    return false;
  }
  for (size_t i = 0; i < a.slices.size(); ++i) {
    if (a.slices[i].file != b.slices[i].file || a.slices[i].begin != b.slices[i].begin ||
        a.slices[i].end != b.slices[i].end) {
      return false;
    }
  }
  return true;
}

std::string FilesText(const WorkPlan& plan) {
  std::string text =
      absl::StrJoin(plan.files.begin(), plan.files.begin() + std::min<size_t>(plan.files.size(), 3), ",");
  if (plan.files.size() > 3) absl::StrAppend(&text, ",… (", plan.files.size(), " files)");
  return absl::StrCat(text, "; ", plan.slices.size(), " slices, ", plan.num_epochs, " epochs",
                      plan.shuffle ? ", shuffled" : "");
}

}  // namespace

std::vector<int> WorkOrder(int num_slices, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int> order(std::max(num_slices, 0));
  for (int i = 0; i < num_slices; ++i) order[i] = i;
  if (!shuffle) return order;
  Rng rng(Rng::Mix(seed, 0x51ce0000ULL + static_cast<uint64_t>(epoch)));
  for (int i = num_slices - 1; i > 0; --i) {  // Fisher-Yates with psflow's own generator
    const int j = static_cast<int>(rng.UniformInt(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

absl::Status CheckWorkPlan(const WorkPlan& plan) {
  if (plan.files.empty() || plan.slices.empty()) {
    return absl::InvalidArgumentError("work queue: the plan has no files or no slices");
  }
  if (plan.num_epochs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("work queue: ", plan.num_epochs, " epochs; at least 1"));
  }
  int file = -1;
  int64_t last_end = kWorkSliceToEnd;
  for (const WorkSlice& s : plan.slices) {
    if (s.file < 0 || s.file >= static_cast<int>(plan.files.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("work queue: a slice of file ", s.file, " of ", plan.files.size()));
    }
    if (s.file != file) {  // a new file: the previous one ended at its end, this one starts at 0
      if (last_end != kWorkSliceToEnd || s.file != file + 1 || s.begin != 0) {
        return absl::InvalidArgumentError(absl::StrCat("work queue: the slices do not cut file ", s.file, " (",
                                                       plan.files[s.file], ") whole, in file order"));
      }
      file = s.file;
    } else if (s.begin != last_end) {
      return absl::InvalidArgumentError(
          absl::StrCat("work queue: a slice of ", plan.files[s.file], " begins at ", s.begin, ", not at ", last_end));
    }
    if (s.end <= s.begin) {
      return absl::InvalidArgumentError(absl::StrCat("work queue: an empty slice of ", plan.files[s.file]));
    }
    last_end = s.end;
  }
  if (last_end != kWorkSliceToEnd || file != static_cast<int>(plan.files.size()) - 1) {
    return absl::InvalidArgumentError("work queue: the slices do not reach the end of every file");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WorkPlanState(const WorkPlan& plan) {
  WorkQueue queue;
  if (auto s = queue.Configure(plan, true); !s.ok()) return s;
  return queue.State();
}

bool WorkQueue::configured() const {
  absl::MutexLock lock(&mu_);
  return configured_;
}

absl::Status WorkQueue::Configure(const WorkPlan& plan, bool replace) {
  absl::MutexLock lock(&mu_);
  return ConfigureLocked(plan, replace);
}

absl::Status WorkQueue::ConfigureLocked(const WorkPlan& plan, bool replace) {
  if (auto s = CheckWorkPlan(plan); !s.ok()) return s;
  if (configured_ && !replace) {
    if (SamePlan(plan, plan_)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("work queue: the job reads ", FilesText(plan_),
                                                      "; this task was given ", FilesText(plan),
                                                      "; give every task the same --train_files"));
  }
  plan_ = plan;
  NewEpochLocked(0);
  returned_.clear();
  held_.clear();
  last_.clear();
  taken_by_.clear();
  split_at_.clear();
  handed_ = 0;
  returned_count_ = 0;
  examples_ = 0;
  bad_lines_ = 0;
  configured_ = true;
  return absl::OkStatus();
}

void WorkQueue::NewEpochLocked(int64_t epoch) {
  epoch_ = epoch;
  cursor_ = 0;
  order_ = WorkOrder(static_cast<int>(plan_.slices.size()), plan_.shuffle, plan_.seed, epoch_);
  taken_.assign(plan_.slices.size(), false);
}

bool WorkQueue::SameFileLocked(int a, int b) const { return plan_.slices[a].file == plan_.slices[b].file; }

bool WorkQueue::HeldLocked(int slice) const {
  for (const auto& [worker, h] : held_) {
    if (h.epoch == epoch_ && h.slice == slice) return true;
  }
  return false;
}

int WorkQueue::PickLocked(const Held* previous) const {
  const int n = static_cast<int>(plan_.slices.size());
  // The slice right after the worker's previous one, in the same file.
  if (previous != nullptr && previous->epoch == epoch_) {
    const int after = previous->slice + 1;
    if (after < n && SameFileLocked(after, previous->slice) && !taken_[after]) return after;
  }
  // Else, in the order: 0, a slice that cuts into no file being read (its file's first, or after
  // one done); 1, one that does not sit right behind a worker's slice (it leaves that worker its
  // run); 2, any slice not taken.
  int best = -1, best_rank = 3;
  for (int64_t p = cursor_; p < static_cast<int64_t>(order_.size()); ++p) {
    const int s = order_[p];
    if (taken_[s]) continue;
    const bool first_of_file = s == 0 || !SameFileLocked(s - 1, s);
    const int rank = first_of_file || (taken_[s - 1] && !HeldLocked(s - 1)) ? 0 : !HeldLocked(s - 1) ? 1 : 2;
    if (rank < best_rank) {
      best = s;
      best_rank = rank;
      if (rank == 0) break;
    }
  }
  return best;
}

bool WorkQueue::TakeLocked(int worker, const Held* previous, Held* out) {
  if (!returned_.empty()) {
    *out = returned_.front();
    returned_.pop_front();
    return true;
  }
  if (plan_.split_workers > 0) {  // the static split: this worker's own positions only
    const int n = static_cast<int>(plan_.slices.size());
    auto [it, inserted] = split_at_.try_emplace(worker, 0, worker);
    auto& [epoch, position] = it->second;
    while (position >= n) {
      if (epoch + 1 >= plan_.num_epochs) return false;
      ++epoch;
      position = worker;
    }
    *out = {epoch, WorkOrder(n, plan_.shuffle, plan_.seed, epoch)[position]};
    position += plan_.split_workers;
    return true;
  }
  while (cursor_ >= static_cast<int64_t>(order_.size())) {
    if (epoch_ + 1 >= plan_.num_epochs) return false;
    NewEpochLocked(epoch_ + 1);
  }
  const int slice = PickLocked(previous);
  taken_[slice] = true;
  while (cursor_ < static_cast<int64_t>(order_.size()) && taken_[order_[cursor_]]) ++cursor_;
  *out = {epoch_, slice};
  return true;
}

absl::StatusOr<WorkQueue::Taken> WorkQueue::Next(int worker, int64_t seq, bool fresh, int64_t examples,
                                                 int64_t bad_lines) {
  absl::MutexLock lock(&mu_);
  if (!configured_) {
    return absl::FailedPreconditionError("the work queue is not configured yet (the chief configures it at start)");
  }
  auto last = last_.find(worker);
  if (!fresh && last != last_.end() && last->second.seq == seq) return last->second.taken;  // a retried call
  examples_ += std::max<int64_t>(examples, 0);
  bad_lines_ += std::max<int64_t>(bad_lines, 0);
  auto held = held_.find(worker);
  std::optional<Held> previous;
  if (held != held_.end()) {
    if (fresh) {  // its predecessor's slice, unfinished: back to the queue, first in line
      returned_.push_front(held->second);
      ++returned_count_;
    } else {
      previous = held->second;
    }
    held_.erase(held);
  }
  Taken taken;
  Held next;
  if (!TakeLocked(worker, previous ? &*previous : nullptr, &next)) {
    taken.end = true;
  } else {
    held_[worker] = next;
    ++handed_;
    ++taken_by_[worker];
    const WorkSlice& s = plan_.slices[next.slice];
    taken.epoch = next.epoch;
    taken.slice = next.slice;
    taken.path = plan_.files[s.file];
    taken.begin = s.begin;
    taken.end_offset = s.end;
  }
  last_[worker] = {seq, taken};
  return taken;
}

void WorkQueue::Release(int worker, int64_t examples, int64_t bad_lines) {
  absl::MutexLock lock(&mu_);
  if (!configured_) return;
  auto held = held_.find(worker);
  if (held == held_.end()) return;  // holds nothing (or a retried release): nothing to give back
  examples_ += std::max<int64_t>(examples, 0);
  bad_lines_ += std::max<int64_t>(bad_lines, 0);
  returned_.push_front(held->second);
  ++returned_count_;
  held_.erase(held);
  last_.erase(worker);  // a later Next of this worker is not a retry of the one before
}

WorkQueue::Progress WorkQueue::progress() const {
  absl::MutexLock lock(&mu_);
  Progress p;
  p.epoch = epoch_;
  p.handed = handed_;
  p.held = static_cast<int64_t>(held_.size());
  p.total = static_cast<int64_t>(plan_.slices.size()) * plan_.num_epochs;
  p.returned = returned_count_;
  p.end = configured_ && returned_.empty() && cursor_ >= static_cast<int64_t>(order_.size()) &&
          epoch_ + 1 >= plan_.num_epochs;
  for (const auto& [worker, h] : held_) p.holders.push_back(worker);
  p.taken_by = taken_by_;
  p.examples = examples_;
  p.bad_lines = bad_lines_;
  return p;
}

absl::StatusOr<std::string> WorkQueue::State() const {
  absl::MutexLock lock(&mu_);
  if (!configured_) return absl::FailedPreconditionError("the work queue is not configured");
  nlohmann::json slices = nlohmann::json::array();
  for (const WorkSlice& s : plan_.slices) {
    slices.push_back({s.file, s.begin, s.end == kWorkSliceToEnd ? nlohmann::json(-1) : nlohmann::json(s.end)});
  }
  nlohmann::json returned = nlohmann::json::array();
  for (const Held& h : returned_) returned.push_back({h.epoch, h.slice});
  nlohmann::json held = nlohmann::json::array();
  for (const auto& [worker, h] : held_) held.push_back({worker, h.epoch, h.slice});
  nlohmann::json taken_by = nlohmann::json::array();
  for (const auto& [worker, n] : taken_by_) taken_by.push_back({worker, n});
  nlohmann::json taken = nlohmann::json::array();  // beyond the cursor (before it, all are)
  for (int64_t p = cursor_; p < static_cast<int64_t>(order_.size()); ++p) {
    if (taken_[order_[p]]) taken.push_back(order_[p]);
  }
  nlohmann::json split_at = nlohmann::json::array();
  for (const auto& [worker, at] : split_at_) split_at.push_back({worker, at.first, at.second});
  nlohmann::json state = {
      {"version", kStateVersion}, {"files", plan_.files},
      {"slices", slices},         {"num_epochs", plan_.num_epochs},
      {"shuffle", plan_.shuffle}, {"seed", plan_.seed},
      {"epoch", epoch_},          {"cursor", cursor_},
      {"returned", returned},     {"held", held},
      {"handed", handed_},        {"returned_count", returned_count_},
      {"taken_by", taken_by},     {"examples", examples_},
      {"bad_lines", bad_lines_},  {"split_workers", plan_.split_workers},
      {"split_at", split_at},     {"taken", taken},
  };
  return state.dump();
}

absl::Status WorkQueue::Restore(std::string_view state_json, bool replace) {
  WorkPlan plan;
  int64_t epoch = 0, cursor = 0, handed = 0, returned_count = 0, examples = 0, bad_lines = 0;
  std::deque<Held> returned;
  std::map<int, int64_t> taken_by;
  std::map<int, std::pair<int64_t, int64_t>> split_at;
  std::vector<int> taken;
  try {
    const nlohmann::json state = nlohmann::json::parse(state_json);
    if (const int version = state.at("version").get<int>(); version != kStateVersion && version != 1) {
      return absl::InvalidArgumentError(absl::StrCat("work queue state of version ", state.at("version").dump(),
                                                     "; this psflow reads versions 1 to ", kStateVersion));
    }
    plan.files = state.at("files").get<std::vector<std::string>>();
    for (const auto& s : state.at("slices")) {
      const int64_t end = s.at(2).get<int64_t>();
      plan.slices.push_back({s.at(0).get<int>(), s.at(1).get<int64_t>(), end < 0 ? kWorkSliceToEnd : end});
    }
    plan.num_epochs = state.at("num_epochs").get<int64_t>();
    plan.shuffle = state.at("shuffle").get<bool>();
    plan.seed = state.at("seed").get<uint64_t>();
    epoch = state.at("epoch").get<int64_t>();
    cursor = state.at("cursor").get<int64_t>();
    handed = state.at("handed").get<int64_t>();
    returned_count = state.at("returned_count").get<int64_t>();
    examples = state.value("examples", int64_t{0});
    bad_lines = state.value("bad_lines", int64_t{0});
    // The slices held when the state was saved go back first (at-least-once), then the returned ones.
    for (const auto& h : state.at("held")) {
      returned.push_back({h.at(1).get<int64_t>(), h.at(2).get<int>()});
      ++returned_count;
    }
    for (const auto& r : state.at("returned")) returned.push_back({r.at(0).get<int64_t>(), r.at(1).get<int>()});
    for (const auto& t : state.at("taken_by")) taken_by[t.at(0).get<int>()] = t.at(1).get<int64_t>();
    plan.split_workers = state.value("split_workers", 0);
    if (state.contains("taken")) taken = state.at("taken").get<std::vector<int>>();
    if (state.contains("split_at")) {
      for (const auto& a : state.at("split_at")) {
        split_at[a.at(0).get<int>()] = {a.at(1).get<int64_t>(), a.at(2).get<int64_t>()};
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("work queue state is not valid: ", e.what()));
  }
  if (auto s = CheckWorkPlan(plan); !s.ok()) return s;
  const int n = static_cast<int>(plan.slices.size());
  if (epoch < 0 || epoch >= plan.num_epochs || cursor < 0 || cursor > n) {
    return absl::InvalidArgumentError(absl::StrCat("work queue state: epoch ", epoch, " cursor ", cursor, " outside ",
                                                   plan.num_epochs, " epochs of ", n, " slices"));
  }
  for (const int s : taken) {
    if (s < 0 || s >= n) {
      return absl::InvalidArgumentError(absl::StrCat("work queue state: taken slice ", s, " outside ", n, " slices"));
    }
  }
  for (const Held& h : returned) {
    if (h.slice < 0 || h.slice >= n || h.epoch < 0 || h.epoch >= plan.num_epochs) {
      return absl::InvalidArgumentError(absl::StrCat("work queue state: slice ", h.slice, " of epoch ", h.epoch,
                                                     " outside ", plan.num_epochs, " epochs of ", n, " slices"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (configured_ && !replace) return ConfigureLocked(plan, false);  // keeps the running queue (same plan)
  if (auto s = ConfigureLocked(plan, true); !s.ok()) return s;
  NewEpochLocked(epoch);
  for (int64_t p = 0; p < cursor; ++p) taken_[order_[p]] = true;
  for (const int s : taken) taken_[s] = true;
  cursor_ = cursor;
  while (cursor_ < n && taken_[order_[cursor_]]) ++cursor_;
  returned_ = std::move(returned);
  handed_ = handed;
  returned_count_ = returned_count;
  taken_by_ = std::move(taken_by);
  split_at_ = std::move(split_at);
  examples_ = examples;
  bad_lines_ = bad_lines;
  return absl::OkStatus();
}

}  // namespace psflow::ps
