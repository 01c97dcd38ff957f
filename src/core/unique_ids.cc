// A batch column's ids deduplicated (psflow/core/unique_ids.h).
#include "psflow/core/unique_ids.h"

#include "absl/container/flat_hash_map.h"

namespace psflow {

void DedupIds(const int64_t* ids, int64_t count, int64_t stride, UniqueIds* out) {
  out->ids.clear();
  out->index.resize(count);
  absl::flat_hash_map<int64_t, int64_t> position;
  position.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t id = ids[i * stride];
    auto [it, inserted] = position.try_emplace(id, static_cast<int64_t>(out->ids.size()));
    if (inserted) out->ids.push_back(id);
    out->index[i] = it->second;
  }
}

}  // namespace psflow
