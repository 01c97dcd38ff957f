// A worker task of `psflow train --model=ctr` (programs/ctr/ctr_single.h, RunCtrWorker): the ctr model's
// dense layers are the session's parameters and its fields' embedding tables the session's tables,
// which live on the ps tasks (the update rules run there, one implementation for every mode).
// Per step the worker takes its part of the one-process stream's batch at the session's data step
// (docs/design.md#data-order: sync, part w of global batch s of R·B examples, so R workers × B see
// one process's R·B; async, batch s of B, distinct per push), or a batch of --train_files; it looks its ids up
// (deduplicated; the rows usually came back with the previous step's answer), computes, hands back each unique id's
// gradient and the next batch's ids (prefetch), and steps: one round trip per step. The chief
// evaluates the final model on the generator's test set (log-loss and AUC beside Bayes).
#include <time.h>

#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "programs/ctr/ctr_files.h"
#include "programs/ctr/ctr_single.h"
#include "programs/ctr/eval_ctr.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/core/threading.h"
#include "psflow/core/unique_ids.h"
#include "psflow/train/session.h"
#include "train/option_value.h"

namespace psflow::train {
namespace {

// Fills a batch of B examples at data step `at` (ids [B, F], dense [B, D], labels [B]); OutOfRange at
// the end of the training files.
using CtrBatchFill = std::function<absl::Status(int64_t at, int64_t* ids, float* dense, float* labels)>;

// One batch of the worker's stream, its table ids per field and their deduplication (done where the
// batch is filled: for a batch filled beside the wait, off the step's path).
struct CtrBatch {
  int64_t step = -1;
  std::vector<int64_t> ids;
  std::vector<float> dense, labels;
  std::vector<std::vector<int64_t>> columns;
  std::vector<UniqueIds> unique;  // per column; Prefetch takes them over

  // `dedup`: the batch is one to prefetch (its columns deduplicated here).
  absl::Status Fill(const CtrBatchFill& fill, const TrainOptions& o, int64_t at, bool dedup) {
    const int64_t batch = OptionValue(o.batch_size);
    ids.resize(batch * o.ctr_fields);
    dense.resize(batch * o.ctr_dense);
    labels.resize(batch);
    step = -1;
    if (auto s = fill(at, ids.data(), dense.data(), labels.data()); !s.ok()) return s;
    CtrTableIds(o, ids.data(), batch, &columns);
    unique.resize(dedup ? columns.size() : 0);
    for (size_t c = 0; c < unique.size(); ++c) {
      DedupIds(columns[c].data(), static_cast<int64_t>(columns[c].size()), 1, &unique[c]);
    }
    step = at;
    return absl::OkStatus();
  }
  std::vector<absl::Span<const int64_t>> Spans() const {
    std::vector<absl::Span<const int64_t>> spans;
    for (const auto& c : columns) spans.emplace_back(c);
    return spans;
  }
};

// Where a worker's steps spend their time: wall and this thread's CPU per phase, summed, and one
// log line at the end (bench/ctr_many_workers.py reads it). "push and wait" is the step's call: the
// push, the wait for the ps tasks' answers (sync: the step's quorum and apply) and their reading.
class StepPhases {
 public:
  enum Phase { kData, kLookup, kCompute, kStep, kNumPhases };
  StepPhases() { Restart(); }
  // Ends the phase that began at the last Mark (or Restart) and charges it to `phase`.
  void Mark(Phase phase) {
    const Sample now = Now();
    wall_[phase] += now.wall - last_.wall;
    cpu_[phase] += now.cpu - last_.cpu;
    last_ = now;
  }
  void Restart() { last_ = Now(); }
  // `beside`: the batches filled on FillAhead's thread during the waits (wall, cpu seconds), or nullopt.
  std::string Text(int64_t steps, const std::optional<std::array<double, 2>>& beside) const {
    static constexpr const char* kNames[] = {"data", "lookup", "forward+backward", "push and wait"};
    const double n = static_cast<double>(std::max<int64_t>(1, steps));
    std::string text = absl::StrCat(steps, " steps; ms per step, wall/cpu:");
    for (int p = 0; p < kNumPhases; ++p) {
      absl::StrAppend(&text, absl::StrFormat(" %s %.3f/%.3f", kNames[p], 1e3 * wall_[p] / n, 1e3 * cpu_[p] / n));
    }
    if (beside.has_value()) {
      absl::StrAppend(&text, absl::StrFormat("; data filled beside the wait %.3f/%.3f", 1e3 * (*beside)[0] / n,
                                             1e3 * (*beside)[1] / n));
    }
    return text;
  }

  struct Sample {
    double wall, cpu;
  };
  // Now, by the steady clock and the calling thread's CPU clock.
  static Sample Now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return {std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(),
            static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec)};
  }

 private:
  Sample last_;
  double wall_[kNumPhases] = {}, cpu_[kNumPhases] = {};
};

// Sync: the batch after next is filled on a thread of its own while the step's call waits for its
// quorum (the data step after global step s is s + 1), so a worker answered by the ps tasks goes
// straight to its forward. One fill at a time; Wait() before the next Start and before the batch is read.
class FillAhead {
 public:
  FillAhead() : thread_([this] { Run(); }) {}
  ~FillAhead() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  // Fills `batch` at data step `at` beside the caller.
  void Start(CtrBatch* batch, const CtrBatchFill* fill, const TrainOptions* o, int64_t at) {
    absl::MutexLock lock(&mu_);
    job_ = Job{batch, fill, o, at};
    pending_ = true;
  }
  // Waits for the fill Start began; a failed one leaves its batch unfilled (step -1), to be filled
  // again, and its error met, where it is read.
  void Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &FillAhead::Idle));
  }
  // The fills' wall and CPU seconds so far (after Wait).
  std::array<double, 2> spent() {
    absl::MutexLock lock(&mu_);
    return spent_;
  }

 private:
  struct Job {
    CtrBatch* batch = nullptr;
    const CtrBatchFill* fill = nullptr;
    const TrainOptions* o = nullptr;
    int64_t at = 0;
  };
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !pending_; }
  bool Due() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ || stop_; }
  void Run() {
    FlushDenormalsOnThisThread();  // as on the worker's own thread, where the ops set it
    while (true) {
      Job job;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &FillAhead::Due));
        if (stop_) return;
        job = job_;
      }
      const StepPhases::Sample start = StepPhases::Now();
      (void)job.batch->Fill(*job.fill, *job.o, job.at, /*dedup=*/true);  // step stays -1 on failure
      const StepPhases::Sample end = StepPhases::Now();
      absl::MutexLock lock(&mu_);
      spent_[0] += end.wall - start.wall;
      spent_[1] += end.cpu - start.cpu;
      pending_ = false;
    }
  }

  absl::Mutex mu_;
  Job job_ ABSL_GUARDED_BY(mu_);
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
  std::array<double, 2> spent_ ABSL_GUARDED_BY(mu_) = {};
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is built
};

// The session's table rows as leaves of the graph (their gradients are the unique rows').
std::vector<nn::FieldRows> FieldRowsOf(WorkerSession& session, std::vector<Var>* leaves, bool trainable) {
  std::vector<nn::FieldRows> fields;
  leaves->clear();
  for (int t = 0; t < session.num_tables(); ++t) {
    TableBatch& b = session.table_batch(t);
    Var leaf = trainable ? MakeParameter(nn::CtrModel::TableName(t), std::move(b.rows)) : Constant(std::move(b.rows));
    leaves->push_back(leaf);
    fields.push_back({leaf, b.index});
  }
  return fields;
}

}  // namespace

absl::StatusOr<RunSummary> RunCtrWorker(const TrainOptions& options, const LogSink& log) {
  SetIntraOpThreads(options.intra_op_threads);
  auto generator = MakeCtrGenerator(options);
  if (!generator.ok()) return generator.status();
  auto model_or = MakeCtrModel(options);
  if (!model_or.ok()) return model_or.status();
  nn::CtrModel& model = **model_or;

  std::vector<SessionParameter> params;
  for (const Var& p : model.parameters()) params.push_back({p->name, &p->value, &p->grad, nullptr});
  std::vector<dist::TableSpec> tables;
  for (int f = 0; f < options.ctr_fields; ++f) tables.push_back(CtrTableSpec(options, f));
  WorkerSession::Options session_options;
  session_options.train = options;
  session_options.model_name = options.model;
  session_options.log = log;
  session_options.rebuild_initial_values = [&options]() -> absl::StatusOr<std::vector<Tensor>> {
    auto fresh = MakeCtrModel(options);
    if (!fresh.ok()) return fresh.status();
    std::vector<Tensor> values;
    for (const Var& p : (*fresh)->parameters()) values.push_back(std::move(p->value));
    return values;
  };
  // --eval_every_steps with --checkpoint_dir: the chief evaluates the checkpoint of each multiple of
  // N beside training (train/eval_beside.h), from the file alone as `psflow eval` does.
  if (options.eval_every_steps > 0 && !options.checkpoint_dir.empty()) {
    auto metrics = CtrCheckpointMetrics(options);
    if (!metrics.ok()) return metrics.status();
    session_options.evaluate_checkpoint =
        [metrics = *std::move(metrics)](const std::string& path) -> absl::StatusOr<SessionEval> {
      auto file = ckpt::OpenCheckpointFile(path);
      if (!file.ok()) return file.status();
      auto figures = metrics(*file);
      if (!figures.ok()) return figures.status();
      SessionEval eval;
      eval.scalars = *std::move(figures);
      return eval;
    };
  } else if (options.eval_every_steps > 0) {
    log("--eval_every_steps: the ctr chief evaluates the checkpoints it saves at those steps, beside training: give "
        "--checkpoint_dir (without it there is no evaluation during training)");
  }
  auto session_or = WorkerSession::Create(session_options, std::move(params), std::move(tables));
  if (!session_or.ok()) return session_or.status();
  WorkerSession& session = **session_or;

  auto train = [&]() -> absl::StatusOr<RunSummary> {
    if (auto s = session.Open(); !s.ok()) return s;
    const TrainOptions& o = session.options();  // resolved
    const int64_t worker = session.worker_index();
    if (session.is_chief()) {
      log(absl::StrCat(
          "ctr: ", o.ctr_fields, " fields of dim ", o.ctr_dim, " (",
          o.ctr_vocab > 0 ? absl::StrCat("fixed div tables of ", o.ctr_vocab, " rows") : std::string("dynamic tables"),
          ", ", o.sparse_optimizer, " lr ", OptionValue(o.sparse_learning_rate), " on the ps), ", model.NumParameters(),
          " dense parameters (", o.optimizer, " lr ", OptionValue(o.learning_rate), ")"));
    }
    // The data: the generator's stream, or --train_files (sync: the fixed order, this worker's part
    // of each global batch; async: slices from the work queue on ps task 0, programs/ctr/ctr_files.h).
    // The generator: examples [part·B, (part + 1)·B) of batch `at` of stream 0, the one one process
    // reads (FillBatch(0, at, ...), whose smaller batches are prefixes of larger ones). Sync: part is
    // the worker's index, so R workers × B see one process's R·B; async: 0, batch `at` distinct per push.
    const int64_t part = session.data_worker_index();
    CtrBatchFill fill = [&](int64_t at, int64_t* ids, float* dense, float* labels) {
      const int64_t batch = OptionValue(o.batch_size);
      return generator->FillBatchPart(0, at, part * batch, batch, ids, dense, labels);
    };
    std::unique_ptr<CtrFileBatches> fixed_order;
    std::unique_ptr<CtrSliceReader> queue_reader;
    const bool from_files = !o.train_files.empty();
    if (from_files && session.sync()) {
      auto files = CtrFileBatches::Open(o, worker, session.num_workers());
      if (!files.ok()) return files.status();
      fixed_order = *std::move(files);
      fill = [&](int64_t at, int64_t* ids, float* dense, float* labels) {
        return fixed_order->Fill(at, ids, dense, labels);
      };
    } else if (from_files) {
      auto files = data::ExpandCriteoFiles(o.train_files);
      if (!files.ok()) return files.status();
      auto plan = MakeCtrWorkPlan(*files, int64_t{o.file_slices} * session.num_workers(), o.num_epochs, o.shuffle_files,
                                  o.seed);
      if (!plan.ok()) return plan.status();
      if (o.file_split == "static") plan->split_workers = session.num_workers();  // the usual split, a baseline
      queue_reader = std::make_unique<CtrSliceReader>(
          QueueSlices(session, *std::move(plan), o.init_timeout_secs, o.worker_timeout_secs, log), CtrReaderOptions(o));
      fill = [&](int64_t, int64_t* ids, float* dense, float* labels) -> absl::Status {
        const int64_t batch = OptionValue(o.batch_size), fields = o.ctr_fields;
        int64_t have = 0;
        while (have < batch) {
          auto got = queue_reader->Read(batch - have, ids + have * fields, dense + have * o.ctr_dense, labels + have);
          if (!got.ok()) return got.status();
          if (*got == 0) {
            return absl::OutOfRangeError(
                absl::StrCat("the work queue is at its end (", have, " examples left over, under a batch)"));
          }
          have += *got;
        }
        return absl::OkStatus();
      };
    }
    CtrBatch current, next, ahead;
    // Sync from the generator: the batch after next is filled while the step waits. (Not from files:
    // the fixed order reads forward, and a fill that met the files' end would have it read them again.)
    std::unique_ptr<FillAhead> fill_ahead;
    if (session.sync() && !from_files) fill_ahead = std::make_unique<FillAhead>();
    std::vector<Var> leaves;
    const int64_t batch = OptionValue(o.batch_size);
    int64_t own_step = 0;  // async from files: this worker's batches, in order
    std::string data_end;  // why the training files ended training, or empty
    StepPhases phases;
    int64_t timed_steps = 0;
    while (!session.ShouldStop()) {
      phases.Restart();
      // Sync: this worker's part of the global step's batch; async: the batch its last push claimed
      // (from files: its own consecutive batches of the queue's slices).
      const int64_t at = queue_reader != nullptr ? own_step : session.data_step();
      if (next.step == at) {
        std::swap(current, next);
      } else if (auto s = current.Fill(fill, o, at, /*dedup=*/false); !s.ok()) {
        if (from_files && absl::IsOutOfRange(s)) {
          data_end = std::string(s.message());
          break;
        }
        return s;
      }
      phases.Mark(StepPhases::kData);
      absl::Status looked = session.Lookup(current.Spans());
      if (absl::IsOutOfRange(looked)) break;  // training finished elsewhere
      if (!looked.ok()) return looked;
      std::vector<nn::FieldRows> fields = FieldRowsOf(session, &leaves, /*trainable=*/true);
      phases.Mark(StepPhases::kLookup);
      Var logits = model.Logits(current.dense.data(), batch, fields);
      Var loss = nn::CtrModel::Loss(logits, current.labels);
      const double loss_value = loss->value[0];
      int64_t correct = 0;
      std::vector<float> probabilities(static_cast<size_t>(batch));
      for (int64_t i = 0; i < batch; ++i) {
        correct += (logits->value[i] > 0) == (current.labels[i] > 0.5f);
        probabilities[i] = 1.0f / (1.0f + std::exp(-logits->value[i]));
      }
      // The progress line's running AUC and log-loss (sizes equal by construction).
      (void)session.AddClicks(absl::MakeConstSpan(current.labels.data(), static_cast<size_t>(batch)), probabilities);
      if (std::isfinite(loss_value)) {
        Backward(loss);
        for (int t = 0; t < session.num_tables(); ++t) session.table_batch(t).grads = std::move(leaves[t]->grad);
        phases.Mark(StepPhases::kCompute);
        // The next batch's ids ride on this step's push; its rows come back with the answer.
        absl::Status filled = absl::OkStatus();
        if (ahead.step == at + 1) {
          std::swap(next, ahead);
        } else {
          filled = next.Fill(fill, o, at + 1, /*dedup=*/true);
        }
        phases.Mark(StepPhases::kData);
        if (filled.ok()) {
          if (auto s = session.Prefetch(next.Spans(), &next.unique); !s.ok()) return s;
        } else if (!from_files || !absl::IsOutOfRange(filled)) {
          return filled;  // (the end of the files is met again at the next step, and ends it)
        }
      }
      if (fill_ahead != nullptr && next.step == at + 1) fill_ahead->Start(&ahead, &fill, &o, at + 2);
      absl::Status stepped = session.Step(loss_value, static_cast<double>(correct) / static_cast<double>(batch));
      if (fill_ahead != nullptr) fill_ahead->Wait();
      if (!stepped.ok()) return stepped;
      ZeroGrad(model.parameters());
      phases.Mark(StepPhases::kStep);
      ++timed_steps;
      ++own_step;
    }
    if (queue_reader != nullptr && data_end.empty()) {
      // Training ended by steps, not by the files: the slice this worker was reading goes back to the
      // queue, or a chief waiting at the queue's end for the slices still held would wait for it
      // until --worker_timeout_secs.
      if (absl::Status s = queue_reader->Stop(); !s.ok()) {
        log(absl::StrCat("worker ", worker,
                         ": giving the unfinished slice back to the work queue failed: ", s.message()));
      }
    }
    log(absl::StrCat(
        "worker ", worker, " step timing: ",
        phases.Text(timed_steps, fill_ahead != nullptr ? std::optional(fill_ahead->spent()) : std::nullopt)));
    SessionEval files_eval;
    if (from_files) {
      if (!data_end.empty()) log(absl::StrCat("worker ", worker, ": ", data_end, ": training ends here"));
      const int64_t read = fixed_order ? fixed_order->examples_read() : queue_reader->examples_read();
      const int64_t bad = fixed_order ? fixed_order->bad_lines() : queue_reader->bad_lines();
      const int64_t epochs = fixed_order ? fixed_order->epochs_begun() : queue_reader->epochs_begun();
      log(absl::StrCat("worker ", worker, ": training files: ", read, " examples read",
                       queue_reader ? absl::StrCat(" in ", queue_reader->slices_read(), " slices") : std::string(),
                       ", epoch(s) begun: ", epochs, ", ", bad, " bad lines skipped (--max_bad_lines=", o.max_bad_lines,
                       ")"));
      if (session.is_chief()) {
        // The job's figures: sync, the fixed order's (every worker reads it whole); async, the
        // work queue's (the workers' counts as they reported them with each slice).
        double job_examples = static_cast<double>(read), job_bad = static_cast<double>(bad),
               job_epochs = static_cast<double>(epochs);
        if (queue_reader != nullptr) {
          ps::WorkQueueCall state;
          state.op = ps::WorkQueueCall::Op::kState;
          auto queue = session.CallWorkQueue(state);
          if (queue.ok() && queue->configured) {
            job_examples = static_cast<double>(queue->examples);
            job_bad = static_cast<double>(queue->bad_lines);
            job_epochs = static_cast<double>(queue->epoch_now + 1);
            log(absl::StrCat("work queue: ", queue->handed, " slices handed out (", queue->total, " in ", o.num_epochs,
                             " epoch(s), ", queue->returned, " given back and handed again)"));
          }
        }
        files_eval.scalars = {{"train_file_examples", job_examples},
                              {"train_file_epochs", job_epochs},
                              {"train_file_bad_lines", job_bad}};
      }
    }
    std::optional<data::CtrExamples> test_files;
    if (session.is_chief() && !o.test_files.empty()) {
      auto test = ReadCtrTestFiles(o);
      if (!test.ok()) return test.status();
      test_files = *std::move(test);
    }
    return session.Close([&]() -> absl::StatusOr<SessionEval> {
      const CtrRowSource rows =
          [&](const std::vector<std::vector<int64_t>>& columns) -> absl::StatusOr<std::vector<nn::FieldRows>> {
        std::vector<absl::Span<const int64_t>> spans;
        for (const auto& c : columns) spans.emplace_back(c);
        if (auto s = session.Lookup(spans); !s.ok()) return s;
        return FieldRowsOf(session, &leaves, /*trainable=*/false);
      };
      auto figures = test_files.has_value() ? EvaluateCtrExamples(o, *test_files, model, rows)
                                            : EvaluateCtrModel(o, *generator, model, o.ctr_test_examples, rows);
      if (!figures.ok()) return figures.status();
      SessionEval eval = files_eval;
      eval.test_cross_entropy = figures->test_log_loss;
      eval.ctr = *figures;
      return eval;
    });
  };
  absl::StatusOr<RunSummary> result = train();
  if (!result.ok()) session.Abort(result.status());
  return result;
}

}  // namespace psflow::train
