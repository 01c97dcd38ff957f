// psflow/train/session.h — a worker session: the one implementation of a psflow worker's and
// chief's machinery (docs/design.md#the-worker-session-and-the-python-package), driven step by step by whoever computes
// the gradients — `psflow train`'s C++ worker (programs/mnist/worker.cc) and the Python binding (python/psflow) alike.
//
// It is handed named parameter buffers (name, value memory, dense gradient memory and/or a
// row-sparse gradient), which become the ps variables: the placement plan is made from their
// names and shapes (partitioners and placement flags apply). Then:
//   Open()   resolves the cluster (flags or $TF_CONFIG; none given: the session runs alone, worker 0
//            of a one-worker loopback cluster whose ps task it starts on a thread of this process,
//            and Close/Abort end that task too), connects to every ps task, prints the
//            placement listing (chief, or --log_device_placement), and either initializes the ps
//            tasks (chief: from the values its buffers hold at Open — the caller's initialization
//            is honoured, and they are copied once so that a ps restart before the first checkpoint
//            goes back to them (see Options::rebuild_initial_values) — or from the newest
//            checkpoint of --checkpoint_dir; a restarted chief resumes the running job) or waits
//            for the chief (others; released the moment it is done). Finally
//            pulls the current values into the value buffers.
//   ShouldStop()  true once the global step reached --train_steps or training ended elsewhere.
//   Step(loss, accuracy)  pushes the gradients and pulls the new values into the value buffers in
//            one call per ps (PushAndPull), tagged with the global step the gradients were computed
//            at (sync mode drops stale ones and counts them); recovers from a ps task that
//            restarted empty (the chief restores it, the others wait for the chief and pull again);
//            logs the progress line every --log_every steps, feeds --logdir / --metrics_port, and
//            the chief checkpoints on schedule. A non-finite loss is refused (the step is not pushed).
//   Close(evaluate)  chief: pulls the final values, saves the final checkpoint, calls `evaluate`
//            (the caller's accuracy on its validation/test data, with the final values in its
//            buffers), asks every ps for its traffic (ps_traffic), prints the final summary and its
//            `summary_json:` line, writes --metrics_json, and shuts the ps tasks down (they exit 0).
//            Others: log and say Goodbye.
//   Abort(reason)  after a failure: the chief aborts the job (every ps task exits non-zero with the
//            reason); a worker told the job was aborted says Goodbye. No-op once Close() ended the
//            job (Shutdown or Goodbye sent). Destroying an open session whose job has not ended
//            (no Close(), or a Close() that failed before the end) aborts it the same way.
//
// Embedding tables (docs/tables.md) are declared beside the parameters
// (dist::TableSpec, psflow/dist/table_spec.h) and live on the ps tasks only: the chief declares them (each ps
// computes its rows' initial values; no one sends or holds a whole table), and a worker holds the
// rows of its batch and nothing more, so its memory does not grow with a table's size. Per step:
//   Lookup(ids)   one span of ids per table (declaration order; a fixed table's in [0, N)): each is
//            deduplicated into table_batch(t).ids (first appearance order) and .index (example i's
//            position among them), and .rows [U, dim] gets their values — the rows prefetched by
//            the last Step when the unique ids are the ones given to Prefetch, else one Pull call
//            per ps for every table at once. OutOfRange once training finished elsewhere
//            (ShouldStop() is then true). The chief may also call it inside Close's `evaluate`.
//   the caller computes and writes table_batch(t).grads [U, dim]: each unique id's gradient,
//            summed over the examples that hold it (an empty Tensor: the table is not pushed);
//            or lends them from memory of its own (grads_values and grads_owner: no copy).
//   Prefetch(next_ids)   optional, after this step's Lookup and before Step: the next batch's ids
//            ride on Step's push and their rows come back with its answer (one round trip per
//            step); the next Lookup with the same ids uses them (other ids: Lookup pulls them
//            instead). Called before this step's Lookup, it would drop the rows the last Step
//            prefetched for it.
//   PrefetchAhead(next_ids)   the same, but in async mode (with --overlap other than none) the
//            rows are pulled at once, in a call of their own, beside the caller's compute; Step
//            waits for them before sending its push, so they never hold this step's own update
//            (rows both batches share are one step stale, as async allows; the same run twice
//            gives the same values). Call it early in the step (right after Lookup): given just
//            before Step it costs a round trip Prefetch does not. Sync and hybrid: Prefetch.
//   Step()   pushes the dense gradients and each table's (ids, grads) in the same call per ps
//            (PushAndPull), the dense values and the prefetched rows coming back with its answer;
//            the tables' rules run on the ps (--sparse_optimizer; sync: summed over the step's
//            quorum in worker order, divided as --sparse_sync_mean says). The grads are consumed.
// The TableBatch buffers belong to the session and are reused: the caller may read or move
// `rows` out, and fill or move a Tensor into `grads`, between Lookup and Step.
//
// Overlap (--overlap, docs/sync-async.md#overlap): with "push" or "push_pull" the caller may call
// GradientReady(i) as soon as backward has finished parameter i's gradient (psflow train's workers
// do it from autodiff, psflow.torch from gradient hooks): the gradients go to the ps tasks in parts
// while backward runs, and Step sends the rest as the push's last part (sync: each ps counts the
// parts with it, one mean of whole pushes per step, bit for bit as without overlap). With
// "push_pull" and Options::waits_for_values, Step does not wait for the pull: the values come
// back in forward order (the parameters' order), a group after another, and the caller calls
// WaitForValues(i) before its forward reads parameter i (a forward pre-hook); the pull of step
// k + 1 starts with the push's last part in async mode, after the step is applied in sync mode.
// Every other call (Step, Lookup, Close, the chief's evaluation) first waits for the pull to end.
//
// Deferred push (async, --overlap other than none, Options::waits_for_values): Step returns once
// its push is sent, without waiting for the answer (which carries the global step the push
// claimed); the answer is collected by the next call that must see it — the next Step before its
// own push (one push in flight per worker), Close, a Lookup that pulls, an early part
// (GradientReady) and a pull ahead (PrefetchAhead), which go only once it is answered so that the
// ps applies this worker's calls in order. global_step() is the last answer's plus the push in
// flight (an estimate, exact once answered); a Step whose push would reach --train_steps waits
// for its answer, so one worker ends at exactly train_steps. The dense values of a push without
// forward-order pulls come with its answer: WaitForValues waits for it. A failure of that answer
// is the next call's error, in one line naming the step it belonged to (a ps restart and the end
// of training are recovered from as before; the step after such a push pushes nothing). Async
// data order then: data_step (below). A Step whose prefetch rides on the push waits as before.
//
// Memory: the session pulls straight into the caller's value Tensors and pushes straight from its
// gradient Tensors (psflow Tensors own their memory; the Python binding therefore allocates the
// Tensors and points each torch parameter's .data and .grad at them, so that no copy is made per
// step beyond the wire decode). The buffers are borrowed: they must outlive the session, and the
// caller must not touch them while a call runs. A parameter whose gradient Tensor is empty and
// whose sparse gradient is unset (or not given) is not pushed that step.
//
// Thread safety: none; one thread drives a session, except that WaitForValues may run while
// another thread is inside GradientReady or Prefetch/PrefetchAhead (the Python binding's helper).
// Errors are absl::Status with one line naming what is wrong.
#ifndef PSFLOW_TRAIN_SESSION_H_
#define PSFLOW_TRAIN_SESSION_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "psflow/core/autodiff.h"
#include "psflow/core/tensor.h"
#include "psflow/core/unique_ids.h"
#include "psflow/dist/partition.h"
#include "psflow/dist/table_spec.h"
#include "psflow/optim/optimizer.h"
#include "psflow/ps/ps_types.h"
#include "psflow/train/options.h"
#include "psflow/train/summary.h"

namespace psflow::train {

// One ps variable. All pointers are borrowed and must stay valid while the session lives.
struct SessionParameter {
  std::string name;                                       // the ps variable's name (checkpoints use it)
  Tensor* value = nullptr;                                // required; its shape is the variable's shape
  const Tensor* grad = nullptr;                           // dense gradient, pushed when non-empty
  const std::optional<RowSparse>* sparse_grad = nullptr;  // row-sparse gradient, pushed when set
  // When given, the dense gradient is pushed only while *dense_grad_ready is true (the caller's
  // "this parameter got a gradient this step").
  const bool* dense_grad_ready = nullptr;
};

// The old form of a table: its name beside a spec whose own name was ignored. Use dist::TableSpec
// (psflow/dist/table_spec.h), whose `name` is the table's name: Create(options, params, {spec, ...}).
struct [[deprecated("declare tables as dist::TableSpec (its .name is the table's name)")]] SessionTable {
  std::string name;
  dist::TableSpec spec;
};

// One table's rows of the current batch (see Lookup); owned by the session.
struct TableBatch {
  std::vector<int64_t> ids;    // the batch's unique ids [U], in order of first appearance
  std::vector<int64_t> index;  // [batch]: example i's id is ids[index[i]]
  Tensor rows;                 // [U, dim]: their values
  Tensor grads;                // [U, dim], written by the caller: pushed by Step (empty: not pushed)
  // Instead of `grads` (left empty): the same [U, dim] gradients (row-major) in memory of the
  // caller's, pushed without a copy. `grads_owner` keeps that memory alive, and the caller leaves
  // it unchanged, until the session lets go of the owner: when Step returns, or for a push Step
  // leaves in flight (async with --overlap=push_pull) once its answer is taken (the next Step,
  // Close); a Step that pushes nothing keeps it until the next Lookup or the session's end.
  absl::Span<const float> grads_values = {};
  std::shared_ptr<const void> grads_owner;
};

// The rows of a group of tables of the current batch, in one buffer (WorkerSession::GroupTables: a
// table collection's, e.g. psflow.torch.EmbeddingBagCollection's one leaf); owned by the session.
// Table first + k's unique rows (TableBatch::ids order) are rows [offsets[k], offsets[k + 1]).
struct TableGroupBatch {
  int first = 0;  // the tables [first, first + count), of one dim
  int count = 0;
  Tensor rows;                   // [offsets[count], dim]; the caller may move it out between Lookup and Step
  std::vector<int64_t> offsets;  // [count + 1]: each table's first row in `rows`, then their total
  // When every table of the group was given n ids (has_index): [n, count], example i's row in
  // `rows` of each table (table_batch(first + k).index[i] + offsets[k]), made where the ids were
  // deduplicated (for a prefetched batch: beside the caller's compute); the caller may move it out.
  std::vector<int64_t> index;
  bool has_index = false;
};

// What the caller's evaluation at Close() found (NaN: not measured). A model that is not a
// classifier (a regression) leaves the accuracies and reports its own measures in `metrics`
// (names of letters, digits and '_'), which the summary prints and --metrics_json writes.
struct SessionEval {
  double validation_accuracy = std::numeric_limits<double>::quiet_NaN();
  double validation_cross_entropy = std::numeric_limits<double>::quiet_NaN();
  double test_accuracy = std::numeric_limits<double>::quiet_NaN();
  double test_cross_entropy = std::numeric_limits<double>::quiet_NaN();
  // Any other scalars, by the caller's names, in its order (e.g. "validation_perplexity"): they
  // reach the summary line, --metrics_json and TensorBoard as named. Names are checked by
  // CheckMetricName (summary.h).
  std::vector<std::pair<std::string, double>> scalars;
  // A ctr model's test figures (the summary's `ctr` block; table_rows is filled by the session
  // from the ps tasks' table stats).
  std::optional<CtrFigures> ctr;
};

class WorkerSession {
 public:
  struct Options {
    TrainOptions train;  // as after ResolveTrainOptions (Create resolves them again; idempotent)
    // The model's name in the summary and in the checkpoints' metadata (default: train.model).
    std::string model_name;
    // Where log lines go (default: stdout).
    std::function<void(const std::string&)> log;
    // The chief prints the final summary (FormatSummary) through `log` and writes --metrics_json
    // at Close.
    bool report_summary = true;
    // The chief's initial values (the values its buffers hold at Open) are needed again when a ps
    // task restarts before the first checkpoint. By default the chief keeps a copy made at Open;
    // when this is given (e.g. rebuilding a model from its seed), it is called instead and no copy
    // is kept. Returns the values in the parameters' order.
    std::function<absl::StatusOr<std::vector<Tensor>>()> rebuild_initial_values;
    // With --eval_every_steps=N, the chief calls this after each step that reaches a multiple of N
    // (with the current values in its buffers), logs "eval at global step S: name=value ..." and
    // writes the values to TensorBoard at step S. Null: no evaluation during training.
    std::function<absl::StatusOr<SessionEval>()> evaluate;
    // With --eval_every_steps=N and --checkpoint_dir, the evaluation runs beside training instead:
    // the chief saves the checkpoint of each step that reaches a multiple of N (beside training, as
    // every save), this evaluates that file on an evaluation thread while the chief trains on, and
    // the chief logs "eval at global step S: name=value ... (Ts beside training, PATH)" and writes
    // the values to TensorBoard at step S. The figures are the checkpoint's, as `psflow eval` gives.
    // Called on the evaluation thread; it must not touch the session or the caller's buffers.
    std::function<absl::StatusOr<SessionEval>(const std::string& checkpoint_path)> evaluate_checkpoint;
    // The ps tasks' update rule, parameter groups and learning-rate schedule, instead of the
    // flags' (--optimizer, --learning_rate, --lr_decay_*): psflow.optim's. Checked by Create.
    std::optional<optim::OptimizerConfig> optimizer;
    // The caller calls WaitForValues(i) before its forward reads parameter i (and WaitForValues()
    // before reading them all): with --overlap=push_pull (or auto) the pull then runs in forward
    // order behind Step instead of inside it.
    bool waits_for_values = false;
  };

  // Checks the options and the parameters (non-null values, distinct non-empty names, gradient
  // shapes equal to the values'); InvalidArgument naming the parameter. Nothing is contacted yet.
  // Tables (dist::TableSpec, each named by its .name): distinct names, none a parameter's; the plan
  // refuses a bad spec (one line naming it).
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Create(Options options, std::vector<SessionParameter> params,
                                                               std::vector<dist::TableSpec> tables = {});
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  [[deprecated("declare tables as dist::TableSpec (its .name is the table's name)")]] static absl::StatusOr<
      std::unique_ptr<WorkerSession>>
  Create(Options options, std::vector<SessionParameter> params, std::vector<SessionTable> tables);
#pragma GCC diagnostic pop
  ~WorkerSession();
  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  absl::Status Open();
  bool ShouldStop() const;
  // FailedPrecondition before Open(), after Close(), or after ShouldStop() became true.
  absl::Status Step(double loss, double accuracy = std::numeric_limits<double>::quiet_NaN());
  // Overlap (see the header comment): parameter `index`'s gradient is final for this step; with
  // --overlap=push|push_pull it is pushed in the next part (parts of at least 64 KiB, the small
  // ones joining the next), else with Step. Call it between the forward and Step, at most once per
  // parameter and step; the gradient must stay unchanged until Step returns. InvalidArgument for an
  // index out of range or a parameter handed over twice in one step (a second backward before
  // Step: its gradient was already pushed; use --overlap=none to accumulate several backward
  // passes); FailedPrecondition when the session is not open.
  absl::Status GradientReady(int index);
  // Waits until parameter `index`'s values of the pull after the last Step have arrived (at once
  // when there is none in flight). A failed pull is reported by the next Step instead.
  void WaitForValues(int index);
  // The same for every parameter.
  void WaitForValues();
  // The index of the parameter named `name`, or -1.
  int ParameterIndex(const std::string& name) const;

  // Tables (see the header comment). `ids` holds one span per declared table; InvalidArgument
  // naming the table for a wrong count or (fixed) an id outside [0, N); FailedPrecondition when
  // the session is not open.
  absl::Status Lookup(const std::vector<absl::Span<const int64_t>>& ids);
  // Lookup of exactly the ids the last Prefetch (or PrefetchAhead) was given, read from the
  // session's own copy of them: neither copied nor compared again (a caller whose ids are the very
  // ones it prefetched, unchanged since, e.g. psflow.torch's learnt ids). A table the last Prefetch
  // gave no ids looks up none.
  absl::Status LookupPrefetched();
  absl::Status Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids);
  // Prefetch with each table's ids already deduplicated by the caller — unique[t] is
  // DedupIds(next_ids[t]) (psflow/core/unique_ids.h), e.g. computed on a thread of the caller's while
  // the last Step waited — so neither this call nor the next Lookup of the same ids deduplicates
  // them on the step's path. The UniqueIds are taken over (swapped with buffers to reuse).
  // InvalidArgument naming the table, and nothing prefetched, when unique[t] does not give back
  // next_ids[t] in order of first appearance (an id repeated among unique[t].ids is refused by the ps).
  absl::Status Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids, std::vector<UniqueIds>* unique);
  // Prefetch with the rows pulled ahead in async mode (see the header comment; sync, hybrid and
  // --overlap=none: Prefetch). `unique` as for Prefetch (may be null).
  absl::Status PrefetchAhead(const std::vector<absl::Span<const int64_t>>& next_ids,
                             std::vector<UniqueIds>* unique = nullptr);
  // Table `t` (declaration order) of the current batch.
  TableBatch& table_batch(int t);
  int num_tables() const;
  // Keeps the looked-up rows of tables [first, first + count) — consecutive, of one dim, in no
  // other group — in one buffer, table_group(g).rows, and the rows their prefetch brings in one
  // more (so a Lookup the prefetch served hands that buffer over without a copy); their
  // TableBatch::rows stay empty. Ids, index and gradients stay per table (TableBatch). Before the
  // first Lookup or Prefetch (FailedPrecondition after); InvalidArgument naming what is wrong.
  // Returns the group's index g.
  absl::StatusOr<int> GroupTables(int first, int count);
  // Group `g` (GroupTables' order) of the current batch.
  TableGroupBatch& table_group(int g);
  // `evaluate` is called by the chief only (may be null: accuracies stay 0). Non-chief summaries
  // carry no evaluation and no ps_traffic.
  absl::StatusOr<RunSummary> Close(const std::function<absl::StatusOr<SessionEval>()>& evaluate = nullptr);
  void Abort(const absl::Status& reason);
  // Scalars of the caller's (name, value) written to TensorBoard (--logdir, chief only: other
  // workers write no events) at the current global step. InvalidArgument for a bad name
  // (CheckMetricName); FailedPrecondition before Open().
  absl::Status LogScalars(const std::vector<std::pair<std::string, double>>& scalars);
  // A click-through-rate model's batch: its labels (0 or 1) and predicted click probabilities,
  // added to the running AUC and log-loss the next progress line shows (" auc A log_loss L", over
  // the examples since the last line). InvalidArgument when the sizes differ; FailedPrecondition
  // before Open().
  absl::Status AddClicks(absl::Span<const float> labels, absl::Span<const float> probabilities);
  // The job's work queue of training-file slices on ps task 0 (psflow/ps/ps_types.h WorkQueueCall;
  // docs/data-files.md#the-work-queue), retried like every call. FailedPrecondition before Open().
  // The chief saves the queue's state in every checkpoint and gives it back on a restore.
  absl::StatusOr<ps::WorkQueueAnswer> CallWorkQueue(const ps::WorkQueueCall& call);

  bool is_open() const;
  bool is_chief() const;
  int worker_index() const;
  int num_workers() const;
  int num_ps() const;
  bool sync() const;
  // The global step (a session that defers its pushes: the last answer's plus the push in flight).
  int64_t global_step() const;
  // The learning rate of the next update (optim::LearningRateAt at the global step; parameter
  // groups scale their own from it).
  float learning_rate() const;
  // Step() calls so far (including ones spent on recovery).
  int64_t local_step() const;
  // The data order (docs/design.md#data-order): this worker's next batch is
  // data::BatchSampler(n, batch_size, data_worker_index(), data_num_workers(), seed).BatchAt(data_step()).
  // Sync: slice worker_index() of global batch global_step() (N workers' slices = one process's
  // batch of N·B). Async: batch global_step() + N - 1 of the one-worker stream after a push (the
  // step it claimed: distinct per push, so the workers' batches are disjoint and the stream is taken
  // in order whatever their speeds), global_step() + worker_index() right after Open (or after a ps
  // restart): a resumed job continues at its checkpoint's step, not at batch 0 (it may take again at
  // most N - 1 batches pushed just before the checkpoint's step was reached). A session that defers
  // its pushes (see the header comment) reads the next batch while the last push is in flight:
  // batch S + 2N - 1 for the step S claimed by the push before it, batches B + w and B + N + w
  // first (B the step pulled at Open or after a ps restart; train/session_pending.h) — still
  // disjoint between workers, and one worker takes the same batches as without deferral.
  int64_t data_step() const;
  int data_worker_index() const;
  int data_num_workers() const;
  // Examples per global step: batch_size, times replicas_to_aggregate in sync mode.
  int64_t examples_per_global_step() const;
  const TrainOptions& options() const;
  // The placement listing ("variable placement:" table) of the parameters.
  std::string PlacementListing() const;

 private:
  class Impl;  // the implementation (src/)
  explicit WorkerSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_SESSION_H_
