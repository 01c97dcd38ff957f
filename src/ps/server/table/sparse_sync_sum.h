// ps/server/table/sparse_sync_sum.h — a sync step's table gradients combined into one update
// (docs/tables.md#semantics, Sync mode): each id's rows are summed over the gradients applied in the step, in
// worker order (so the bits do not depend on the order in which pushes arrived), then divided by
// R, the number of gradients applied (--sparse_sync_mean=workers, the dense variables' mean, so N
// workers × B equals one process with N·B), or by the number of those gradients that held the row
// (row_count, TF's SparseConditionalAccumulator).
//
// The accumulator of a step keeps each applied gradient (ids and rows, a batch's worth per worker)
// until the step completes, then sums them. Not thread-safe: the sync accumulator that owns one per
// table and step serializes calls under its own lock.
#ifndef PSFLOW_PS_SERVER_TABLE_SPARSE_SYNC_SUM_H_
#define PSFLOW_PS_SERVER_TABLE_SPARSE_SYNC_SUM_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace psflow::ps::table {

enum class SparseSyncMean { kWorkers, kRowCount };

// Parses --sparse_sync_mean=workers|row_count.
absl::StatusOr<SparseSyncMean> ParseSparseSyncMean(std::string_view flag);

// Unique ids in ascending order and their combined rows [ids.size(), dim].
struct SummedRows {
  std::vector<int64_t> ids;
  std::vector<float> rows;
};

class SparseStepSum {
 public:
  SparseStepSum(std::string table, int64_t dim) : table_(std::move(table)), dim_(dim) {}

  // Keeps worker `worker`'s gradient (ids unique, rows [ids.size(), dim], finite: checked where they
  // entered the ps, PsTables::Decode) for this step. InvalidArgument naming the table, nothing kept,
  // for a wrong size or a second gradient from the same worker.
  absl::Status Add(int worker, absl::Span<const int64_t> ids, absl::Span<const float> rows);
  int num_gradients() const { return static_cast<int>(grads_.size()); }

  // The step's combined rows: per id, the float sum over gradients in ascending worker order,
  // divided as `mean` says (R = num_gradients()). Empty when nothing was added. Leaves the
  // accumulator empty for the next step.
  SummedRows Finish(SparseSyncMean mean);

 private:
  struct Gradient {
    int worker;
    std::vector<int64_t> ids;
    std::vector<float> rows;
  };
  std::string table_;
  int64_t dim_;
  std::vector<Gradient> grads_;
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_SPARSE_SYNC_SUM_H_
