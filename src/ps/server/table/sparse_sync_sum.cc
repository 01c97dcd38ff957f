// Deterministic sums of a sync step's table gradients (sparse_sync_sum.h).
#include "ps/server/table/sparse_sync_sum.h"

#include <algorithm>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ps/server/table/shard_checks.h"

namespace psflow::ps::table {

absl::StatusOr<SparseSyncMean> ParseSparseSyncMean(std::string_view flag) {
  if (flag == "workers") return SparseSyncMean::kWorkers;
  if (flag == "row_count") return SparseSyncMean::kRowCount;
  return absl::InvalidArgumentError(
      absl::StrCat("--sparse_sync_mean='", std::string(flag), "' is not one of workers, row_count"));
}

absl::Status SparseStepSum::Add(int worker, absl::Span<const int64_t> ids, absl::Span<const float> rows) {
  TableConfig config;  // the checks name the table and read dim only
  config.spec.name = table_;
  config.spec.dim = dim_;
  if (auto s = CheckRowsSize(config, "a gradient", ids.size(), rows.size()); !s.ok()) return s;
  for (const Gradient& g : grads_) {
    if (g.worker == worker) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table_, "': worker ", worker, " pushed twice in one sync step"));
    }
  }
  grads_.push_back(
      Gradient{worker, std::vector<int64_t>(ids.begin(), ids.end()), std::vector<float>(rows.begin(), rows.end())});
  return absl::OkStatus();
}

SummedRows SparseStepSum::Finish(SparseSyncMean mean) {
  SummedRows out;
  if (grads_.empty()) return out;
  std::sort(grads_.begin(), grads_.end(), [](const Gradient& a, const Gradient& b) { return a.worker < b.worker; });
  // Output position of each id: ids ascending.
  absl::flat_hash_map<int64_t, size_t> position;
  for (const Gradient& g : grads_) {
    for (int64_t id : g.ids) position.emplace(id, 0);
  }
  out.ids.reserve(position.size());
  for (const auto& entry : position) out.ids.push_back(entry.first);
  std::sort(out.ids.begin(), out.ids.end());
  for (size_t i = 0; i < out.ids.size(); ++i) position[out.ids[i]] = i;

  const size_t dim = static_cast<size_t>(dim_);
  out.rows.assign(out.ids.size() * dim, 0.0f);
  std::vector<int32_t> holders(out.ids.size(), 0);
  for (const Gradient& g : grads_) {  // worker order: the same float sums whatever the arrival order
    for (size_t r = 0; r < g.ids.size(); ++r) {
      const size_t p = position[g.ids[r]];
      float* dst = out.rows.data() + p * dim;
      const float* src = g.rows.data() + r * dim;
      for (size_t k = 0; k < dim; ++k) dst[k] += src[k];
      ++holders[p];
    }
  }
  const float workers = static_cast<float>(grads_.size());
  for (size_t p = 0; p < out.ids.size(); ++p) {
    const float divisor = mean == SparseSyncMean::kWorkers ? workers : static_cast<float>(holders[p]);
    float* row = out.rows.data() + p * dim;
    for (size_t k = 0; k < dim; ++k) row[k] /= divisor;
  }
  grads_.clear();
  return out;
}

}  // namespace psflow::ps::table
