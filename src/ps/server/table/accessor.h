// ps/server/table/accessor.h — what a table row is and how it lives (docs/tables.md#semantics, Life cycle of a
// dynamic row; Paddle's accessor role): a row's initial value (create / select of an absent row),
// whether a push's gradient is admitted, a row's update count for the rule, and which rows a
// removal pass drops. The table stores rows and calls these; a new policy changes this file only.
//
//   admit_after=K    each push holding an id counts once; its gradient is dropped until the count
//                    reaches K (the K-th push is applied). K <= 1 admits every push.
//   steps_to_live=S  a row (or a pending count) whose last update was at global step u is removed
//                    by a pass at step g when g - u >= S.
//   max_rows=M       a ps keeps ceil(M / P) rows; a pass finding more removes the least recently
//                    updated (smaller last step first, ties: lower id first) down to 90 % of it.
//   evict_every=E    passes run at global steps that are multiples of E, and before a checkpoint.
// Immutable; thread-safe.
#ifndef PSFLOW_PS_SERVER_TABLE_ACCESSOR_H_
#define PSFLOW_PS_SERVER_TABLE_ACCESSOR_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "ps/server/table/row_init.h"
#include "ps/server/table/table_config.h"

namespace psflow::ps::table {

// A stored row (or pending id) as the removal pass sees it.
struct RowAge {
  int64_t id = 0;
  int64_t last_step = 0;
};

class RowAccessor {
 public:
  // `num_ps`: the ps tasks sharing the table (P of a dynamic table's ceil(M / P)).
  RowAccessor(const TableConfig& config, int num_ps);

  // create/select: the initial value of row `id` into out[0, dim).
  void InitialValue(int64_t id, float* out) const { init_.Fill(id, out, dim_); }
  // Whether a push is applied, given how many pushes (this one included) held the id.
  bool Admits(int64_t count) const { return count >= admit_after_; }
  // Whether ids need a pending count before admission (K > 1).
  bool counts_pending() const { return admit_after_ > 1; }
  // The rule's update count of a row whose pushes number `count`: count - K + 1 (1 at the first
  // applied update).
  int64_t UpdatesOf(int64_t count) const { return count - admit_after_ + 1; }

  // Rows a ps may keep (ceil(M / P)), or 0 for no bound.
  int64_t row_cap() const { return row_cap_; }
  // Whether a removal pass is due at `global_step` (a multiple of evict_every) and anything can be
  // removed at all (steps_to_live or max_rows set).
  bool PassDue(int64_t global_step) const;
  bool removes_anything() const { return steps_to_live_ > 0 || row_cap_ > 0; }

  // shrink: the indices into `rows` that a pass at `global_step` removes: the expired ones, then, if
  // more than row_cap() remain, the least recently updated down to 90 % of row_cap(). In ascending
  // index order. `rows` in any order; ids unique.
  std::vector<size_t> SelectRemovals(const std::vector<RowAge>& rows, int64_t global_step) const;

  // The same choice for a table too large to list: both criteria remove a prefix of the rows in
  // (last_step, id) order, so a pass is a cut in that order, found from the number of rows per last
  // step (ascending steps, counts > 0). The pass removes every row with last_step < before_step and
  // the `ties` lowest ids among those with last_step == before_step: `count` rows in all.
  struct Cut {
    int64_t before_step = 0;
    int64_t ties = 0;
    int64_t count = 0;
  };
  Cut CutFor(const std::vector<std::pair<int64_t, int64_t>>& rows_per_step, int64_t global_step) const;
  // Whether a pass over `rows` stored rows can remove any (false: skip the scan).
  bool MayRemove(int64_t rows) const { return steps_to_live_ > 0 || (row_cap_ > 0 && rows > row_cap_); }

 private:
  RowInitializer init_;
  int64_t dim_;
  int64_t admit_after_;  // normalized to >= 1
  int64_t steps_to_live_;
  int64_t row_cap_;
  int64_t evict_every_;
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_ACCESSOR_H_
