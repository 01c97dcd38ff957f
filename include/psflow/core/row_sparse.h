// psflow/core/row_sparse.h — a gradient that touches only some rows of a variable (an embedding
// lookup's): what the autodiff tape accumulates for such parameters and what the ps client pushes
// to the ps tasks, which apply it to those rows only. A plain value type.
#ifndef PSFLOW_CORE_ROW_SPARSE_H_
#define PSFLOW_CORE_ROW_SPARSE_H_

#include <cstdint>
#include <vector>

#include "psflow/core/tensor.h"

namespace psflow {

// A gradient touching only some rows (along axis 0) of a variable: rows[i] is the row index in
// the variable, values row i its gradient. Row indices are unique and ascending.
struct RowSparse {
  std::vector<int64_t> rows;
  Tensor values;  // [rows.size(), <remaining dims of the variable>]
};

}  // namespace psflow

#endif  // PSFLOW_CORE_ROW_SPARSE_H_
