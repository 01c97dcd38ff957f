// Embedding tables in the chief's checkpoint files (docs/tables.md#semantics, checkpoints), streamed:
// - a fixed table [N, dim] is a variable like any other: NAME [N, dim] and its sparse rule's slots
//   NAME/slot/SLOT [N, dim] (plus NAME/count int64 [N] under lazy adam), written row part by row
//   part as PsClient::ScanTable hands them over (ids 0..N-1 in order);
// - a dynamic table is NAME/ids (int64 [n], ascending), NAME [n, dim], NAME/SLOT [n, dim],
//   NAME/last_step and NAME/count (int64 [n]); evicted rows are not saved (the ps tasks run a
//   removal pass before their scan).
// An increment (docs/checkpoints.md#increments) holds of each table the rows changed since the save
// it follows, with their ids (NAME/ids for a fixed table too) and the ids removed since
// (NAME/removed, int64 ascending; dynamic tables); a chain is read back merged
// (ckpt::ChainTableReader) by the same sources.
// Neither side holds a second copy of a table: the ps tasks stream parts, the chief appends each
// part to the file's streamed tensors (ckpt::SafetensorsWriter) and drops it. A restore reads the
// same tensors back part by part as PsClient::Initialize's table sources, which route every row to
// its owner under the new plan (any number of ps tasks). Stateless functions; the sources borrow
// the reader, which must outlive them. Used by the chief's thread and `psflow eval`.
#ifndef PSFLOW_SRC_TRAIN_TABLE_CHECKPOINT_H_
#define PSFLOW_SRC_TRAIN_TABLE_CHECKPOINT_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/server/table/table_config.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/safetensors_stream.h"
#include "psflow/dist/partition.h"
#include "psflow/ps/ps_client.h"

namespace psflow::train {

// The tables' layout in a checkpoint: the sparse rule's slot names, and whether fixed tables keep
// a per-row count (lazy adam).
struct TableLayout {
  std::vector<std::string> slot_names;
  bool fixed_count = false;
};
absl::StatusOr<TableLayout> TableLayoutOf(const ps::TrainingConfig& config);
absl::StatusOr<TableLayout> TableLayoutOf(const ps::table::SparseRuleConfig& rule);

// Reads one table's rows in ascending id order, handing `sink` parts of at most `max_rows` rows
// (PsClient::ScanTable's signature).
using TableScan = std::function<absl::Status(const std::string& table, int64_t max_rows,
                                             const std::function<absl::Status(ps::TableRowsPart part)>& sink)>;

// Scans every table (from the ps tasks, or the single process's own shards) into `writer`: a full
// save's layout, or with `increment` an increment's (the scan then hands over only changed rows and
// the removed ids).
absl::Status WriteTables(const TableScan& scan, const std::vector<dist::TableSpec>& tables, const TableLayout& layout,
                         ckpt::SafetensorsWriter& writer, bool increment = false);
// From the ps tasks, the scans numbered and full or increments as `options` say.
absl::Status WriteTables(ps::PsClient& client, const std::vector<dist::TableSpec>& tables, const TableLayout& layout,
                         ckpt::SafetensorsWriter& writer, const ps::TableScanOptions& options = {});

// One source per table reading its rows back from `reader`. FailedPrecondition, one line naming the
// table, when the file lacks it or holds it with another dim (or a fixed table with another N), or
// lacks a slot of the rule (another --sparse_optimizer).
absl::StatusOr<std::vector<std::pair<std::string, ps::TablePartSource>>> TableSources(
    const ckpt::SafetensorsReader& reader, const std::vector<dist::TableSpec>& tables, const TableLayout& layout);

// The same from a checkpoint that may be an increment: its chain's tables merged (checked against
// the chain's full save as above).
absl::StatusOr<std::vector<std::pair<std::string, ps::TablePartSource>>> TableSources(
    const ckpt::OpenedCheckpoint& checkpoint, const std::vector<dist::TableSpec>& tables, const TableLayout& layout);

// The rows of `ids` (ascending, unique) of `table` read from the file, [ids, dim]; `found[i]` false
// for an id the file does not hold (a dynamic row never admitted or evicted: the caller decides).
absl::StatusOr<Tensor> ReadTableRows(const ckpt::SafetensorsReader& reader, const dist::TableSpec& table,
                                     const std::vector<int64_t>& ids, std::vector<bool>* found);
// The same from a checkpoint that may be an increment: the rows its chain merged would hold, read
// file by file, newest first, each file asked only for the ids the newer ones did not mention (a
// search of its sorted ids, not a pass over its rows): the cost grows with the ids asked and the
// chain's length, not with the table.
absl::StatusOr<Tensor> ReadTableRows(const ckpt::OpenedCheckpoint& checkpoint, const dist::TableSpec& table,
                                     const std::vector<int64_t>& ids, std::vector<bool>* found);

// How many rows `table` holds in the checkpoint (a chain: its files merged), reading ids only: a
// full save's row count; a chain's dynamic table, the union of its files' ids (8 bytes a row) with the
// newest mention of each deciding, never the rows' values.
absl::StatusOr<int64_t> CountTableRows(const ckpt::OpenedCheckpoint& checkpoint, const dist::TableSpec& table);

}  // namespace psflow::train

#endif  // PSFLOW_SRC_TRAIN_TABLE_CHECKPOINT_H_
