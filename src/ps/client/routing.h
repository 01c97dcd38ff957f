// ps/client/routing.h — how a worker maps variables to shards on the wire: slicing full tensors into
// shard tensors (zero-copy when the shard is a contiguous range, i.e. split along axis 0),
// assembling received shards into full tensors, and routing row-sparse gradients to the shards
// holding their rows. Pure functions over borrowed tensors.
#ifndef PSFLOW_PS_CLIENT_ROUTING_H_
#define PSFLOW_PS_CLIENT_ROUTING_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "psflow/core/autodiff.h"
#include "psflow/core/tensor.h"
#include "psflow/dist/partition.h"
#include "rpc/transport.h"

namespace psflow::ps {

// Product of the dims after `axis` (floats per step along the axis).
int64_t InnerSize(const Shape& shape, int axis);

// The shard's part of `full` (the whole variable) as an outgoing tensor named after the shard.
// Borrows full's memory when the part is contiguous; otherwise owns a sliced copy.
rpc::OutgoingTensor ShardOf(const Tensor& full, const dist::ShardSpec& shard);

// Copies tensor i of `message` — the shard's elements [offset, offset + count): the whole shard
// (with its shape), or one run of a pull in parts (TensorMeta.slice) — into their place in
// `full`. DataLoss when the message's tensor is not that.
absl::Status AssembleShard(const rpc::IncomingMessage& message, int i, const dist::ShardSpec& shard, int64_t offset,
                           int64_t count, Tensor* full);

// Checks a row-sparse gradient against its variable: rows in range, values [rows, other dims].
absl::Status ValidateSparse(const RowSparse& sparse, const dist::VariableSpec& variable);

// Splits a validated row-sparse gradient over the variable's shards: shard-local rows for shards
// split along axis 0, every row's column slice otherwise. Shards no row touches get nothing.
// Returns one entry per shard (index into `shards`), possibly with meta only (no rows) omitted.
std::vector<std::pair<int, rpc::OutgoingTensor>> RouteSparse(const RowSparse& sparse,
                                                             const std::vector<dist::ShardSpec>& shards);

// InvalidArgument naming the variable and the first element that is Inf or NaN, if any.
absl::Status CheckFinite(const std::string& variable, const Tensor* dense, const RowSparse* sparse);

// Dense sum of a dense and a row-sparse gradient (a variable with both kinds of gradient).
Tensor Densify(const Tensor* dense, const RowSparse& sparse, const Shape& shape);

}  // namespace psflow::ps

#endif  // PSFLOW_PS_CLIENT_ROUTING_H_
