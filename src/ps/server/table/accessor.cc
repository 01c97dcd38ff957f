// A row's life cycle (accessor.h).
#include "ps/server/table/accessor.h"

#include <algorithm>

#include "core/check.h"

namespace psflow::ps::table {

RowAccessor::RowAccessor(const TableConfig& config, int num_ps)
    : init_(config.spec.initializer, config.spec.initializer.seed),
      dim_(config.spec.dim),
      admit_after_(std::max<int64_t>(1, config.spec.lifecycle.admit_after)),
      steps_to_live_(config.spec.lifecycle.steps_to_live),
      row_cap_(config.spec.lifecycle.max_rows > 0 ? (config.spec.lifecycle.max_rows + num_ps - 1) / num_ps : 0),
      evict_every_(std::max<int64_t>(1, config.spec.lifecycle.evict_every)) {
  CHECK_GE(num_ps, 1);
}

bool RowAccessor::PassDue(int64_t global_step) const { return removes_anything() && global_step % evict_every_ == 0; }

std::vector<size_t> RowAccessor::SelectRemovals(const std::vector<RowAge>& rows, int64_t global_step) const {
  std::vector<size_t> removed;
  std::vector<size_t> kept;
  kept.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (steps_to_live_ > 0 && global_step - rows[i].last_step >= steps_to_live_) {
      removed.push_back(i);
    } else {
      kept.push_back(i);
    }
  }
  if (row_cap_ > 0 && static_cast<int64_t>(kept.size()) > row_cap_) {
    const int64_t target = row_cap_ * 9 / 10;
    const size_t excess = kept.size() - static_cast<size_t>(target);
    const auto older = [&rows](size_t a, size_t b) {
      if (rows[a].last_step != rows[b].last_step) return rows[a].last_step < rows[b].last_step;
      return rows[a].id < rows[b].id;
    };
    std::nth_element(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(excess), kept.end(), older);
    removed.insert(removed.end(), kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(excess));
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

RowAccessor::Cut RowAccessor::CutFor(const std::vector<std::pair<int64_t, int64_t>>& rows_per_step,
                                     int64_t global_step) const {
  int64_t total = 0, expired = 0;
  for (const auto& [step, rows] : rows_per_step) {
    total += rows;
    if (steps_to_live_ > 0 && global_step - step >= steps_to_live_) expired += rows;
  }
  // As SelectRemovals: the expired rows, then, if more than the cap remain, down to 90 % of it.
  int64_t remove = expired;
  if (row_cap_ > 0 && total - expired > row_cap_) remove = total - row_cap_ * 9 / 10;
  Cut cut;
  cut.count = remove;
  int64_t before = 0;  // rows with a smaller last step than the current one
  for (const auto& [step, rows] : rows_per_step) {
    if (before + rows > remove) {
      cut.before_step = step;
      cut.ties = remove - before;
      return cut;
    }
    before += rows;
  }
  cut.before_step = rows_per_step.empty() ? 0 : rows_per_step.back().first + 1;  // every row
  return cut;
}

}  // namespace psflow::ps::table
