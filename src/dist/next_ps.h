// dist/next_ps.h — the one choice of a ps task for the next variable, shard or fixed-table shard
// (PlanPlacement and PlanTables share it, so tables follow the same strategy state as variables).
#ifndef PSFLOW_DIST_NEXT_PS_H_
#define PSFLOW_DIST_NEXT_PS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "psflow/dist/partition.h"

namespace psflow::dist {

// Round robin: task counter % P, advancing the counter. Greedy: the task with the fewest bytes so
// far; min_element returns the first minimum, so ties go to the lowest index, like TF's
// list.index(min()).
inline int NextPs(PlacementStrategy strategy, int64_t& round_robin_counter, const std::vector<int64_t>& bytes_per_ps) {
  const int64_t num_ps = static_cast<int64_t>(bytes_per_ps.size());
  if (strategy == PlacementStrategy::kRoundRobin) return static_cast<int>(round_robin_counter++ % num_ps);
  return static_cast<int>(std::min_element(bytes_per_ps.begin(), bytes_per_ps.end()) - bytes_per_ps.begin());
}

}  // namespace psflow::dist

#endif  // PSFLOW_DIST_NEXT_PS_H_
