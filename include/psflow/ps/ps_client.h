// psflow/ps/ps_client.h — a worker's view of all parameter-server tasks: connects, initializes
// (chief) or waits for initialization, pulls variables assembled from their shards, and pushes
// gradients split per shard, talking to every ps in parallel.
//
// Thread-safe: calls from several threads may overlap; calls to different ps tasks run in
// parallel. The *Async variants call `done` on the transport's completion thread (keep it short:
// hand heavy work to another thread); the tensors they read or write (the `out` tensors of
// PullAsync, the gradients of PushAsync) are borrowed and must stay alive, unchanged (gradients)
// or untouched (pull destinations), until `done` runs, and the client must outlive its pending
// calls. Blocking calls from inside a `done` are a programmer error (CHECKed: they would deadlock).
// Errors name the ps task and its address.
//
// Failures: every call has a deadline sized to the bytes it moves (rpc_timeout_secs + 1 s per MiB,
// src/ps/client/call_deadline.h). A data or control call (Pull, Push, PushAndPull, PullState,
// Initialize, IsInitialized, Stats, Shutdown, Abort) to a ps task that is silent — it missed the
// deadline (frozen, link down) or is unreachable (killed) — is retried with exponential back-off
// (50 ms doubling to 2 s) for up to ps_unavailable_timeout_secs (--ps_timeout_secs) from the call's
// start, logging when the silence starts and every 10 s; only the calls to the silent task are
// repeated (the answers of the others are kept). Retries are safe: a push carries this client's id
// and a sequence number, and each ps applies it at most once (src/ps/server/push_dedup.h). Past that
// bound: DeadlineExceeded or Unavailable naming the task, the call and the flags. A ps
// task that answers but lost its variables (restarted) fails the call with FailedPrecondition
// "ps task 1 (127.0.0.1:2223) is not initialized (restarted?)" (IsPsRestarted, RestartedPsTask);
// the chief then rolls every ps task back to the last checkpoint with Initialize (or, without
// checkpoints, gives that task fresh values with InitializePs). Calls held by a task that is being
// re-initialized fail the same way, so workers wait for the chief and pull again.
#ifndef PSFLOW_PS_PS_CLIENT_H_
#define PSFLOW_PS_PS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "psflow/core/row_sparse.h"
#include "psflow/core/tensor.h"
#include "psflow/dist/cluster.h"
#include "psflow/dist/partition.h"
#include "psflow/ps/ps_types.h"

namespace psflow::ps {

// A gradient for one variable: dense (the variable's shape), row-sparse (rows of axis 0), or both
// (then summed). Borrowed pointers.
struct Gradient {
  std::string variable;
  const Tensor* dense = nullptr;
  const RowSparse* sparse = nullptr;
};

// One table's rows in a step's call (docs/tables.md): `ids` unique (dedup the batch first), global
// (a fixed table's in [0, N)); `rows` the pull's destination [ids, dim] (filled by the call), or
// `grads` a push's gradient rows [ids, dim] (summed per unique id), or, with `grads` null,
// `grad_values`: the same rows as ids × dim floats (row-major) in memory of the caller's, read
// where `grads` would be (a caller's gradients pushed without copying them into a Tensor); a
// pull with `rows` null writes `row_values` instead: ids × dim floats in memory of the caller's
// (several tables' rows filled into one buffer, e.g. a table collection's).
// Borrowed: they must stay alive, untouched, until the call completes.
struct TableRowsRef {
  std::string table;
  const std::vector<int64_t>* ids = nullptr;
  Tensor* rows = nullptr;
  const Tensor* grads = nullptr;
  absl::Span<const float> grad_values = {};
  absl::Span<float> row_values = {};
};

// The tables' part of one step; it rides in the same call per ps task as the dense variables.
// With a Pull: `pulls` are read now. With a push: `pushes` are applied like the dense gradients
// (async: at once; sync: summed over the step's quorum in worker order, divided as
// --sparse_sync_mean says) and `pulls` are a prefetch: their rows are read after the push was
// applied (sync: after its step) and come back with the push's answer — one round trip per step.
// The client validates everything before sending (an unknown table, rows not [ids, dim], a repeated
// id, a fixed table's id outside [0, N), a NaN/Inf gradient): InvalidArgument naming the table,
// nothing applied on any ps task.
struct TableStep {
  std::vector<TableRowsRef> pulls;
  std::vector<TableRowsRef> pushes;
};

// A run of one table's rows in ascending id order, as a checkpoint stores them (docs/tables.md#semantics):
// ids, values [n, dim], each slot of the sparse rule [n, dim] (its slot_names order), and each
// row's last update step and push count. Owns its memory. An incremental save's scan also hands over
// the ids removed since the save it follows (docs/checkpoints.md#increments): all of them, ascending,
// in its first part (which may then hold no rows).
struct TableRowsPart {
  std::string table;
  std::vector<int64_t> ids;
  Tensor values;
  std::vector<Tensor> slots;
  std::vector<int64_t> last_step, count;
  std::vector<int64_t> removed_ids;
};

// What a checkpoint's table scan reads (docs/checkpoints.md#increments). The chief numbers its saves
// 1, 2, 3 ... (save_id). A full scan reads every row; an increment reads the rows changed since save
// `changed_since` (the last committed save of the chain) and the ids removed since. track_changes
// asks the ps tasks to keep the change logs later increments read (on while saves may be
// increments). An increment a ps task cannot answer (restarted, restored or saved without
// track_changes since) fails with FailedPrecondition naming the table: save in full.
struct TableScanOptions {
  int64_t save_id = 0;
  bool increment = false;
  int64_t changed_since = -1;
  bool track_changes = false;
};

// Fills `part` with a table's next rows (ascending ids across calls); false once none are left.
using TablePartSource = std::function<absl::StatusOr<bool>(TableRowsPart* part)>;

// True for the status of a call that reached a ps task which lost its variables (restarted).
bool IsPsRestarted(const absl::Status& status);
// That ps task's index, or -1 when the status is not IsPsRestarted.
int RestartedPsTask(const absl::Status& status);

struct PushResult {
  int64_t global_step = 0;  // after this push (async) or after the step it joined (sync)
  bool stale = false;       // sync: dropped because it was older than the step (or a late backup)
};

class PushStream;
class SlicePulls;

class PsClient {
 public:
  struct Options {
    dist::ClusterSpec cluster;
    dist::PlacementPlan plan;
    int worker_index = 0;
    rpc::TransportOptions security;
    // Base deadline of one attempt of a call, plus 1 s per MiB it moves (sync pushes get
    // sync_timeout_secs more).
    double rpc_timeout_secs = 30;
    double connect_timeout_secs = 120;
    // How long a call keeps retrying a silent ps task before failing (--ps_timeout_secs); at least
    // one full attempt.
    double ps_unavailable_timeout_secs = 120;
    // An async push, the chief's Initialize, or a pull (a push-and-pull's too, and a
    // checkpoint's) moving more tensor bytes than this to or from one ps task goes as parts of at
    // most this size, one call after another, so neither side holds more than a part of the
    // message in flight (peak memory stays near the state); a pull's parts may see different
    // versions of a big shard, as async training reads it anyway. 0: never in parts.
    int64_t max_part_bytes = int64_t{16} << 20;
    // --wire_dtype: "float32", "bfloat16" or "float16". Dense gradients are pushed rounded to it,
    // each shard's rounding error kept here and added to that shard's next gradient before
    // rounding (error feedback), so nothing is lost systematically. Must be the ps tasks' (the
    // chief's TrainingConfig::wire_dtype): a ps refuses dense gradients in another. Pulls arrive in
    // the ps's wire dtype whatever this is.
    std::string wire_dtype = "float32";
    // --transfer_slice_bytes (async; 0: off): with pull-back destinations given (PullBackSlices),
    // a PushStream::Send cuts a ps task's share of its gradients into slices of at most this many
    // bytes on the wire — a big variable's shard into element runs, in order — and pulls each
    // slice's values back as soon as the ps answered its push (see PullBackSlices).
    int64_t transfer_slice_bytes = 0;
    // Where the client reports waiting for an unreachable ps task. Default: stderr.
    std::function<void(const std::string&)> log;
  };

  // InvalidArgument when the plan and the cluster disagree (number of ps tasks).
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(Options options);
  ~PsClient();

  // Waits (bounded by connect_timeout_secs, retrying) until every ps answers, and checks that it
  // runs the same cluster (mismatch: error naming the ps task and both cluster texts).
  absl::Status Connect();

  // Chief: creates each ps's shards from the full initial values (split per plan), sends the
  // TrainingConfig and the model signature, then marks every ps initialized, which releases the
  // waiting workers at once. Every variable of the plan must be given, with its shape.
  absl::Status Initialize(const std::vector<std::pair<std::string, const Tensor*>>& variables,
                          const TrainingConfig& config);
  // Chief, restoring a checkpoint: as above, with the snapshot's values, optimizer slots (in
  // Optimizer::slot_names() order of config.optimizer) and update counts, split per this client's
  // plan whatever the plan was when the snapshot was taken; the global step starts at
  // state.global_step (overriding config.initial_global_step). InvalidArgument naming the first
  // variable missing, unknown, of the wrong shape or with the wrong number of slots.
  absl::Status Initialize(const ModelSnapshot& state, const TrainingConfig& config);
  // The same, and the tables' rows read from `tables` (one source per table, by name; a table
  // left out starts from its initial values): each row is routed to the ps task and shard that own
  // it under this client's plan (so a checkpoint written with P ps tasks restores onto P'), part by
  // part, before the ps tasks are marked initialized. InvalidArgument naming the table for an
  // unknown table, a fixed table's id out of range, or rows the ps refuses (another dim, another
  // sparse rule's slots).
  absl::Status Initialize(const ModelSnapshot& state, const TrainingConfig& config,
                          const std::vector<std::pair<std::string, TablePartSource>>& tables);
  // The same for ps task `ps_task` alone (a restarted one): its shards only, then it is marked
  // initialized. The other tasks are untouched.
  absl::Status InitializePs(int ps_task, const ModelSnapshot& state, const TrainingConfig& config);

  // Non-chief: returns as soon as every ps is initialized (the ps holds the call open and answers
  // it when the chief marks it initialized; no polling), or DeadlineExceeded "waited 300 s for the
  // chief (worker 0) to initialize the variables on ps task 1 (127.0.0.1:2223)". Then checks the
  // model: FailedPrecondition naming the first variable that differs from the chief's.
  absl::Status WaitForInitialization(double timeout_secs);
  // True when every ps is initialized (e.g. a restarted chief finding a running job).
  absl::StatusOr<bool> IsInitialized();

  // Pulls the variables into preallocated full-shape tensors, assembling shards; all ps in
  // parallel. Returns the global step.
  absl::StatusOr<int64_t> Pull(const std::vector<std::pair<std::string, Tensor*>>& out);
  void PullAsync(const std::vector<std::pair<std::string, Tensor*>>& out,
                 std::function<void(absl::StatusOr<int64_t>)> done);
  // The same, with the tables' rows (`tables.pulls`; `tables.pushes` must be empty) in the same
  // call per ps task.
  absl::StatusOr<int64_t> Pull(const std::vector<std::pair<std::string, Tensor*>>& out, const TableStep& tables);
  void PullAsync(const std::vector<std::pair<std::string, Tensor*>>& out, const TableStep& tables,
                 std::function<void(absl::StatusOr<int64_t>)> done);
  // Rows of axis 0 of one variable: a [rows.size(), other dims...] tensor. Pulls the whole variable
  // (the ps no longer has a call for rows); removed in the release after 0.2.0.
  [[deprecated("Pull the variable and index its rows; PullRows is removed after 0.2.0")]] absl::StatusOr<Tensor>
  PullRows(const std::string& variable, const std::vector<int64_t>& rows);

  // Pushes gradients tagged with the global step they were computed at (dense sliced per shard,
  // sparse rows routed to their shard); all ps in parallel. Async: returns once every ps applied.
  // Sync: returns when the step's quorum released it, or at once when stale. Once training has
  // finished: OutOfRange "training finished at step N". A gradient with a NaN or Inf is refused
  // (InvalidArgument naming the variable and element) and applied on no ps task.
  absl::StatusOr<PushResult> Push(const std::vector<Gradient>& grads, int64_t step_tag);
  void PushAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                 std::function<void(absl::StatusOr<PushResult>)> done);

  // Push, then the variables' values after it — one call per ps instead of a Push and a Pull.
  // The values are those right after this push was applied (async; other workers' pushes may be
  // in too, as with a Pull) or after the step it joined (sync); a stale push gets the current
  // values. `out` as for Pull. Returns the push's result; PushResult::global_step is the step the
  // values belong to.
  absl::StatusOr<PushResult> PushAndPull(const std::vector<Gradient>& grads, int64_t step_tag,
                                         const std::vector<std::pair<std::string, Tensor*>>& out);
  void PushAndPullAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                        const std::vector<std::pair<std::string, Tensor*>>& out,
                        std::function<void(absl::StatusOr<PushResult>)> done);

  // A step with tables (see TableStep): dense gradients and table gradient rows pushed, the dense
  // `out` and the tables' prefetch pulled after it, in one call per ps task (a session drives a
  // step with this one call). `out` may be empty.
  absl::StatusOr<PushResult> PushAndPull(const std::vector<Gradient>& grads, int64_t step_tag,
                                         const std::vector<std::pair<std::string, Tensor*>>& out,
                                         const TableStep& tables);
  void PushAndPullAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                        const std::vector<std::pair<std::string, Tensor*>>& out, const TableStep& tables,
                        std::function<void(absl::StatusOr<PushResult>)> done);

  // A push sent as its gradients become ready (push as backward goes): see PushStream. The
  // stream borrows this client, which must outlive it.
  std::unique_ptr<PushStream> StartPush(int64_t step_tag);
  // Push and pull pipelined in slices (BytePS's tensor partitioning; docs/sync-async.md#overlap),
  // for a worker whose next forward waits for each variable's values (--overlap=push_pull), async
  // only, with Options::transfer_slice_bytes > 0 (else null). From now on a PushStream::Send of
  // dense gradients of which some ps task's share is bigger than a slice goes slice by slice, in
  // order (two in flight per ps task), and the values of every variable of `out` it carries are
  // pulled back into `out`'s tensor slice by slice, each as soon as the ps answered that slice's
  // push — so the worker's pushes (in) and pulls (out) run at once on a ps task's link. The values
  // a slice's pull reads hold this worker's update of that slice (and whatever other workers
  // pushed by then), as the pull after a push in parts reads today. The whole gradient is checked
  // finite before its first slice leaves (a push stays all or nothing for the worker's checks;
  // each ps checks every slice too). Sync (and hybrid) pushes are never sliced: a sync step
  // counts whole pushes. One registration per client (a second replaces the first); `out`'s
  // tensors are borrowed until the handle is destroyed, which waits for its pulls in flight.
  std::unique_ptr<SlicePulls> PullBackSlices(std::vector<std::pair<std::string, Tensor*>> out);
  // Sync mode: until the returned handle is released, every ps task hears every quarter of
  // --sync_timeout_secs that this worker is alive, so that a worker waiting on a stalled task
  // outside a push (for a pull in forward order) stays in the other tasks' quorum. Null in async
  // mode and with one ps task.
  std::shared_ptr<void> KeepAlive();

  // The whole model for a checkpoint: every variable of the plan (in plan order) assembled from
  // its shards, with its optimizer slots and update count (the max over its shards), and the
  // global step. Each shard's value and slots are read together; different shards (and ps tasks)
  // are read at slightly different moments when pushes are running.
  absl::StatusOr<ModelSnapshot> PullState();

  // A checkpoint of one table: all its rows (every shard, every ps task's share) in ascending id
  // order, handed to `sink` in parts of at most `max_rows` rows. Each ps runs a removal pass first
  // and keeps a cursor (8 bytes a row) while the scan lasts; the client holds one part per shard:
  // no task holds a second copy of the table. Each shard is read as it was when its scan started
  // (OpenTableScans, or the first part's call), whatever is pushed meanwhile: the ps keeps a row's
  // old record at its first change (docs/checkpoints.md#saves-beside-training). A failed call fails
  // the scan (it is not retried: a repeated part would skip rows); the chief checkpoints again later.
  absl::Status ScanTable(const std::string& table, int64_t max_rows,
                         const std::function<absl::Status(TableRowsPart part)>& sink);
  // The same as a numbered save, full or an increment (TableScanOptions).
  absl::Status ScanTable(const std::string& table, int64_t max_rows, const TableScanOptions& options,
                         const std::function<absl::Status(TableRowsPart part)>& sink);
  // A save's table scans opened on every ps task at once, before any is read: each shard's scan
  // starts now and reads the shard as it is now, whatever is pushed later (the ps keeps a row's old
  // record when a push first changes it: docs/checkpoints.md#saves-beside-training). The next
  // ScanTable of each table by this client reads its scan (with the options given here). A scan
  // left unread is dropped by the ps when the next scan of that table starts.
  absl::Status OpenTableScans(const std::vector<std::string>& tables, const TableScanOptions& options);
  // Closes the scans OpenTableScans opened that no ScanTable has read yet (a save that failed before
  // reading them), so the ps tasks drop their snapshots now. Best effort: errors are returned, the
  // scans are forgotten here either way.
  absl::Status CloseTableScans();

  // This worker stops; with a `failure`, it gives up on the job and says why (a ps task whose
  // workers all left, one of them failing, exits non-zero at once instead of waiting
  // --worker_timeout_secs). Retried for min(rpc_timeout_secs, ps_unavailable_timeout_secs) at most.
  absl::Status Goodbye(const std::string& failure = "");
  absl::Status Shutdown();  // chief: training finished; every ps task's Wait() returns
  // Chief: the job failed for `reason`; every reachable ps task answers further calls with
  // Aborted(reason) and its Wait() returns that error (the task exits non-zero). Best effort:
  // silent tasks are retried for up to `timeout_secs` (negative: ps_unavailable_timeout_secs).
  void Abort(const std::string& reason, double timeout_secs = -1);
  absl::StatusOr<std::vector<PsTaskStats>> Stats();
  // The job's work queue on ps task 0 (WorkQueueCall), retried like the other calls while ps
  // task 0 is silent (--ps_timeout_secs); OutOfRange / Aborted once the job ended.
  absl::StatusOr<WorkQueueAnswer> CallWorkQueue(const WorkQueueCall& call);

 private:
  class Impl;  // the implementation (src/)
  friend class PushStream;
  friend class SlicePulls;
  explicit PsClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One step's push in parts, sent while backward still runs (Horovod's and DDP's overlap, for a
// parameter server): Send() pushes the gradients given at once, one call per ps task holding
// their shards (async: applied on arrival; sync: each ps keeps them apart and counts them with
// the push's last part, so a sync step still applies one mean of whole pushes); Finish() sends
// the rest, with the pull and the tables, as the push's last part — once every earlier part was
// acknowledged, so each ps has them all when the last counts — and its result is the push's, as
// PushAndPull's. A gradient goes in one part only. Errors of earlier parts are Finish's.
// Not thread-safe: one thread drives a stream; the gradients are borrowed until Finish returns
// (or the stream is destroyed, which waits for the parts in flight).
class PushStream {
 public:
  ~PushStream();
  PushStream(const PushStream&) = delete;
  PushStream& operator=(const PushStream&) = delete;

  // Starts the calls of a part (returns at once; a routing error is kept for Finish).
  void Send(const std::vector<Gradient>& grads);
  // Waits for the earlier parts, then pushes `grads` as the last part (with `out` pulled and
  // `tables` as for PushAndPull; `out` may be empty) and waits for its answer.
  absl::StatusOr<PushResult> Finish(const std::vector<Gradient>& grads,
                                    const std::vector<std::pair<std::string, Tensor*>>& out,
                                    const TableStep& tables = {});
  // The same, returning once the last part is sent; `done` as for PushAndPullAsync (called at
  // once, on this thread, when an earlier part failed).
  void FinishAsync(const std::vector<Gradient>& grads, const std::vector<std::pair<std::string, Tensor*>>& out,
                   const TableStep& tables, std::function<void(absl::StatusOr<PushResult>)> done);
  // Waits until every part sent so far is acknowledged; the first failure, if any.
  absl::Status WaitForParts();
  int parts_sent() const { return parts_sent_; }
  int64_t step_tag() const { return step_tag_; }

 private:
  friend class PsClient;
  PushStream(PsClient::Impl* client, int64_t step_tag);
  struct State;
  PsClient::Impl* const client_;  // borrowed
  const int64_t step_tag_;
  int parts_sent_ = 0;
  std::shared_ptr<State> state_;  // shared with the parts' completions
};

// The pulls of PsClient::PullBackSlices: which variables a PushStream is bringing back slice by
// slice, and waiting for them. Thread-safe; the pulls complete on transport threads.
class SlicePulls {
 public:
  ~SlicePulls();  // stops slicing for this client and waits for every slice pull in flight
  SlicePulls(const SlicePulls&) = delete;
  SlicePulls& operator=(const SlicePulls&) = delete;

  // Indices (into PullBackSlices' `out`) of the variables whose values started coming back since
  // the last call (the pull of the step now being pushed), ascending; they count as taken.
  std::vector<int> TakeStarted();
  // Waits until every slice of variable `index` started so far is in (or failed).
  void Wait(int index);
  // Waits for every slice pull of the taken variables; their first failure (OK when none), forgotten
  // with them.
  absl::Status Settle();
  // A slice pull (or push) of a taken or started variable failed since the last Settle.
  bool failed() const;

  struct State;  // shared with the client and the pulls in flight (src/ps/client/slice_pipe.h)

 private:
  friend class PsClient;
  SlicePulls(PsClient::Impl* client, std::shared_ptr<State> state);
  PsClient::Impl* const client_;  // borrowed
  std::shared_ptr<State> state_;
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_PS_CLIENT_H_
