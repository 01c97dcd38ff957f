// psflow/ckpt/checkpoint_chain.h — incremental checkpoints (docs/checkpoints.md#increments): a chain
// is one full save, DIR/model.ckpt-STEP.safetensors, and the increments after it,
// DIR/model.ckpt-STEP.increment.safetensors. An increment holds every dense variable whole, and of
// each embedding table only the rows changed since the save it follows (NAME/ids, always, and the
// table's other columns) and the ids removed since (NAME/removed, int64 ascending). Each file's
// metadata names its chain (an id made at the full save: the chief derives it from the job and the
// save, train/checkpointing.h), its save number and, for an
// increment, the step and save number of the file it follows and of its chain's full save, and
// lists the tables (one a line). A chain is read back merged: for each id, the newest file that
// mentions it decides — its row, or absent when it lists the id as removed (within one file, rows
// win: a removed id created again since). Every reader opens chains through checkpoint.h's
// OpenCheckpointFile/OpenLatestCheckpoint; restore, the evaluator and load_checkpoint merge whole
// tables with ChainTableReader (this file), while `psflow eval` and read_table_rows look some ids up
// file by file, newest first (train/table_checkpoint.h ReadTableRows).
// Stateless functions; a ChainTableReader borrows the files' readers.
#ifndef PSFLOW_CKPT_CHECKPOINT_CHAIN_H_
#define PSFLOW_CKPT_CHECKPOINT_CHAIN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/ckpt/safetensors_stream.h"

namespace psflow::ckpt {

// Metadata keys of a save.
inline constexpr char kKindKey[] = "psflow.kind";  // "full" or "increment" (absent: a full save)
inline constexpr char kChainKey[] = "psflow.chain";
inline constexpr char kSaveIdKey[] = "psflow.save_id";
inline constexpr char kBaseStepKey[] = "psflow.base_step";  // an increment's full save
inline constexpr char kPrevStepKey[] = "psflow.prev_step";  // the save an increment follows
inline constexpr char kPrevSaveIdKey[] = "psflow.prev_save_id";
inline constexpr char kTablesKey[] = "psflow.tables";  // the file's embedding tables, one a line

// DIR/model.ckpt-STEP.increment.safetensors.
std::string IncrementPath(const std::string& dir, int64_t step);
// Whether `path` names an increment.
bool IsIncrementPath(const std::string& path);
// A new chain id (64 random bits, hex; the chief derives its ids instead, train/checkpointing.h).
std::string NewChainId();

// The merged rows of one embedding table of a chain, in ascending id order, a part at a time,
// holding one part per file (never the table). Its columns are the full save's tensors `table` and
// `table/...` but `table/ids` (values first, then the rest in file order) whose rows match the
// table's; a fixed table's full save has no `table/ids` (its rows are ids 0..N-1).
class ChainTableReader {
 public:
  struct Column {
    std::string name;
    Dtype dtype = Dtype::kF32;
    int64_t row_elements = 0;  // values a row
  };
  // `links`: the chain's readers, its full save first (borrowed; a lone full save reads as is).
  // DataLoss naming the file for an increment whose columns differ from the full save's, or that
  // lacks `table/ids`; NotFound when the full save lacks the table.
  static absl::StatusOr<std::unique_ptr<ChainTableReader>> Open(std::vector<const SafetensorsReader*> links,
                                                                const std::string& table);
  ~ChainTableReader();

  const std::vector<Column>& columns() const { return columns_; }
  // Whether the full save lists the table's ids (a dynamic table).
  bool has_ids() const { return has_ids_; }
  // Rows of the full save (a fixed table's N).
  int64_t base_rows() const { return base_rows_; }

  // Up to max_rows (>= 1) next rows: their ids, and per column their values' bytes, rows one after
  // another. False once none are left. DataLoss naming the file when a file's ids do not ascend.
  absl::StatusOr<bool> Next(int64_t max_rows, std::vector<int64_t>* ids, std::vector<std::vector<char>>* columns);

 private:
  struct Link;
  ChainTableReader() = default;
  std::vector<Column> columns_;
  bool has_ids_ = false;
  int64_t base_rows_ = 0;
  std::vector<std::unique_ptr<Link>> links_;
};

}  // namespace psflow::ckpt

#endif  // PSFLOW_CKPT_CHECKPOINT_CHAIN_H_
