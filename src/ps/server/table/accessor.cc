// A row's life cycle (accessor.h).
#include "ps/server/table/accessor.h"

#include <algorithm>

#include "core/check.h"

namespace psflow::ps::table {

RowAccessor::RowAccessor(const TableConfig& config, int num_ps)
    : init_(config.initializer, config.seed),
      dim_(config.dim),
      admit_after_(std::max<int64_t>(1, config.lifecycle.admit_after)),
      steps_to_live_(config.lifecycle.steps_to_live),
      row_cap_(config.lifecycle.max_rows > 0 ? (config.lifecycle.max_rows + num_ps - 1) / num_ps : 0),
      evict_every_(std::max<int64_t>(1, config.lifecycle.evict_every)) {
  CHECK_GE(num_ps, 1);
}

bool RowAccessor::PassDue(int64_t global_step) const {
  return removes_anything() && global_step % evict_every_ == 0;
}

std::vector<size_t> RowAccessor::SelectRemovals(const std::vector<RowAge>& rows,
                                                int64_t global_step) const {
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

}  // namespace psflow::ps::table
