// psflow/ps/ps_types.h — plain values shared by the parameter server (ps_server.h) and the
// workers' client (ps_client.h): the training configuration the chief sends to
// every ps task, per-task statistics, and the model's full state for checkpoints. Plain structs;
// no synchronization.
#ifndef PSFLOW_PS_PS_TYPES_H_
#define PSFLOW_PS_PS_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "psflow/core/tensor.h"
#include "psflow/dist/partition.h"
#include "psflow/dist/table_spec.h"
#include "psflow/optim/optimizer.h"
#include "psflow/rpc/transport_options.h"

namespace psflow::ps {

// A table as the chief declares it to the ps tasks (its spec and the plan's number of shards):
// dist::TableDeclaration (psflow/dist/table_spec.h). PsClient::Initialize fills
// TrainingConfig::tables from its plan.
using TableDeclaration = dist::TableDeclaration;

// Sent by the chief when it initializes the ps tasks.
struct TrainingConfig {
  optim::OptimizerConfig optimizer;
  bool sync = false;
  int replicas_to_aggregate = 1;
  int total_num_replicas = 1;
  int64_t train_steps = 0;  // pushes are refused (OutOfRange) once the global step reaches it; 0 = no limit
  // A sync step waiting longer than this for its quorum applies what arrived (no hang on a dead
  // worker), logs which workers were missing and drops them from the quorum until they push again.
  double sync_timeout_secs = 30;
  int64_t initial_global_step = 0;  // where the global step starts (restored from a checkpoint)
  // Embedding tables (docs/tables.md): their declarations (never values), and the sparse update
  // rule applied to their rows: --sparse_optimizer's name (empty: optimizer.name) with the
  // hyper-parameters of `optimizer` (learning rate and its decay, momentum, betas, ...), FTRL's
  // regularization, its own learning rate, and the sync mean of a row's gradients ("workers" or "row_count").
  std::vector<TableDeclaration> tables;
  std::string sparse_optimizer;
  float ftrl_l1 = 0.0f, ftrl_l2 = 0.0f;
  std::string sparse_sync_mean = "workers";
  // The rule's initial learning rate (--sparse_learning_rate; decayed as optimizer's); 0: optimizer's.
  float sparse_learning_rate = 0.0f;
  // --wire_dtype: "float32", "bfloat16" or "float16". Dense pulls are answered in it (values stay
  // float32 on the ps; checkpoints' pulls stay float32) and dense gradients in any other are
  // refused; the workers round their gradients to it with error feedback (PsClient::Options).
  std::string wire_dtype = "float32";
  // Sync: "async" applies table rows as pushes arrive (hybrid), "sync" once per step.
  std::string table_sync = "sync";
  // Async: dense pushes of staleness τ applied at lr / max(1, τ).
  bool staleness_aware_lr = false;
};

// One variable's whole state, independent of how it is partitioned: its full value, each optimizer
// slot (full shape, in Optimizer::slot_names() order) and the optimizer updates applied to it (the
// max over its shards; Adam's t is updates + 1 at the next update).
struct VariableSnapshot {
  std::string name;
  Tensor value;
  std::vector<Tensor> slots;
  int64_t updates = 0;
};

// What a checkpoint holds of the ps side: the global step and every variable of the plan (in the
// plan's order). Restorable onto any number of ps tasks and any partitioning.
struct ModelSnapshot {
  int64_t global_step = 0;
  std::vector<VariableSnapshot> variables;
};

// One table's part on one ps task (TableShard::stats()); counters since the ps made it.
struct TableTaskStats {
  std::string table;         // the shard's name (NAME/part_I or NAME)
  int64_t rows = 0;          // rows stored
  int64_t pending_ids = 0;   // ids counted, not admitted yet (admit_after)
  int64_t bytes = 0;         // memory held: rows, slots, per-row counters, index
  int64_t admissions = 0;    // rows created (dynamic)
  int64_t evictions = 0;     // rows and pending ids removed by passes
  int64_t rows_pulled = 0;   // rows answered to pulls
  int64_t rows_pushed = 0;   // gradient rows received
  int64_t rows_dropped = 0;  // gradient rows dropped before admission
  // Storage (docs/table-storage.md): "memory" or "disk". A disk table's `bytes` are its rows in the
  // ps task's cache and its index; the counters below stay 0 for memory tables.
  std::string storage = "memory";
  int64_t cache_hits = 0;         // rows found in the cache (gathers, pushes)
  int64_t cache_misses = 0;       // rows looked up on disk (found or absent)
  int64_t disk_bytes = 0;         // the table's files on disk
  int64_t disk_rows_read = 0;     // rows read from disk into the cache
  int64_t disk_rows_written = 0;  // dirty rows written back to disk
};

struct PsTaskStats {
  int task = 0;
  int64_t bytes_in = 0, bytes_out = 0;            // payload bytes of every call (headers and tensors)
  int64_t num_params = 0;                         // floats held, not counting optimizer slots
  int64_t global_step = 0;                        // this task's step counter (the global step on its ps)
  int64_t stale_gradients_dropped = 0;            // sync: pushes tagged older than the step, or late backups
  int64_t pushes_refused = 0;                     // NaN/Inf, unknown shards, wrong shapes, rows out of range
  int64_t calls_unauthenticated = 0;              // calls refused for a missing or wrong secret
  int64_t connected_workers = 0;                  // clients that said Hello and not yet Goodbye (this task only)
  std::vector<TableTaskStats> tables;             // one per table shard this task holds
  std::vector<int32_t> connected_worker_indices;  // their worker indices, sorted, without repeats
  std::vector<int32_t> pushed_worker_indices;     // workers whose push this task accepted, sorted
  // Async: the dense pushes applied by staleness τ (global steps between the pull the gradient was
  // computed from and its apply): element i counts τ = i, the last element τ >= its index. Empty
  // when no async push was applied (sync jobs).
  std::vector<int64_t> staleness_counts;
};

// A call to the job's work queue of training-file slices, held by ps task 0
// (docs/data-files.md#the-work-queue; PsClient::CallWorkQueue).
struct WorkQueueCall {
  enum class Op { kNext, kConfigure, kState, kRelease };
  Op op = Op::kNext;
  // kRelease: the worker stops reading before its slice is used up (its training ended by steps):
  // the slice goes back to the queue, first in line, and the worker holds none.
  // kNext: this worker's slice is used up. `seq` counts the worker process's kNext calls (a retry
  // repeats it and gets the same answer); `fresh` marks its first (a slice its killed predecessor
  // held goes back to the queue).
  int64_t seq = 0;
  bool fresh = false;
  int64_t examples = 0, bad_lines = 0;  // kNext, kRelease: read since this worker's last kNext
  // kConfigure: the plan or a checkpoint's state (JSON), replacing a configured queue or not.
  std::string state_json;
  bool replace = false;
};
struct WorkQueueAnswer {
  bool configured = false;  // false: the chief has not configured it yet (ask again)
  // kNext: the slice (path, byte range [begin, end_offset) of its text, -1: to its end), or the end.
  bool end = false;
  int64_t epoch = 0;
  int slice = -1;
  std::string path;
  int64_t begin = 0, end_offset = -1;
  std::string state_json;  // kState
  // Where the queue stands: slices held by workers (and who holds them), handed out, in all
  // (slices x epochs), given back, and whether nothing is left to hand out.
  int64_t held = 0;
  std::vector<int> holders;
  int64_t handed = 0, total = 0, returned = 0;
  bool at_end = false;
  int64_t examples = 0, bad_lines = 0;  // read by all workers, as they reported
  int64_t epoch_now = 0;                // the epoch the queue's order is in
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_PS_TYPES_H_
