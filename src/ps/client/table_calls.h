// ps/client/table_calls.h — a step's table rows cut into per-ps blocks (docs/tables.md "Wire
// format"): each table's unique ids routed to the ps task and shard that own them (div/mod for
// fixed tables, Mix64(id) % P for dynamic ones, psflow/dist/table_routing.h), refused up front when
// an id cannot be routed, is repeated or has a NaN or Inf row, so that one bad id fails the whole
// call before any ps applies anything (each ps checks its blocks again where they enter it,
// PsTables::Decode: it cannot trust the wire, and cannot undo another task's part); then written
// into requests (PullRequest.table_pulls, PushRequest.table_pushes / table_prefetch, rows in the
// tensor area) and the answers' rows scattered back into the caller's tensors.
//
// Plain values; a TableWork is built by one call and read by its completion callbacks (the
// callbacks of different ps tasks write disjoint rows of the destinations).
#ifndef PSFLOW_PS_CLIENT_TABLE_CALLS_H_
#define PSFLOW_PS_CLIENT_TABLE_CALLS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/psflow.pb.h"
#include "psflow/dist/partition.h"
#include "psflow/ps/ps_client.h"
#include "rpc/transport.h"

namespace psflow::ps {

// One table block asked of one ps task: the ids, and for a pull their positions in `dest`.
struct TableBlockCall {
  std::string block;  // the shard's wire name
  int64_t dim = 0;
  std::vector<int64_t> ids;
  std::vector<int64_t> positions;     // pulls: row of `dest` for each id
  float* dest = nullptr;              // pulls: [rows, dim] floats
  std::shared_ptr<FloatBuffer> rows;  // pushes: [ids, dim]
};

// Per ps task: the blocks pulled (or prefetched) and pushed.
struct TableWork {
  std::vector<std::vector<TableBlockCall>> pulls, pushes;
  bool Any(int k) const { return !pulls[k].empty() || !pushes[k].empty(); }
  bool empty() const;
};

// Routes and validates `tables` against the plan; InvalidArgument (one line naming the table, `what`
// the caller) for: an unknown table, null ids or rows, rows not [ids, dim], a repeated id, a fixed
// table's id outside [0, N), a NaN or Inf in a gradient row.
absl::StatusOr<std::shared_ptr<TableWork>> RouteTables(const char* what, const TableStep& tables,
                                                       const dist::PlacementPlan& plan);

// Adds ps task k's blocks to a request: pulls as `pull_blocks` (PullRequest.table_pulls or
// PushRequest.table_prefetch), pushes as `push_blocks` with their rows appended to `tensors`.
void AddTableBlocks(const std::vector<TableBlockCall>& pulls,
                    google::protobuf::RepeatedPtrField<wire::TableRows>* pull_blocks);
void AddTablePushes(const std::vector<TableBlockCall>& pushes,
                    google::protobuf::RepeatedPtrField<wire::TableRows>* push_blocks,
                    std::vector<rpc::OutgoingTensor>* tensors);
// Bytes of the rows ps task k's pull blocks answer with.
int64_t TablePullBytes(const std::vector<TableBlockCall>& pulls);

// Copies the last pulls.size() tensors of `answer` (the blocks' rows, in order) into their
// destinations. DataLoss naming `peer` when the answer does not match.
absl::Status ScatterTableRows(const rpc::IncomingMessage& answer, const std::vector<TableBlockCall>& pulls,
                              const std::string& peer);

}  // namespace psflow::ps

#endif  // PSFLOW_PS_CLIENT_TABLE_CALLS_H_
