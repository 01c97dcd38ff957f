// Single-process training: the whole model, the optimizer and the data in one process, with the
// same optimizer code the parameter servers run.
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "programs/mnist/local_replicas.h"
#include "programs/mnist/mnist.h"
#include "psflow/core/threading.h"
#include "psflow/data/batcher.h"
#include "psflow/optim/optimizer.h"
#include "psflow/train/train.h"
#include "train/checkpointing.h"
#include "train/cluster_setup.h"
#include "train/progress.h"
#include "train/telemetry.h"
#include "train/training_end.h"

namespace psflow::train {

namespace {

// Applies each parameter's gradient (dense or row-sparse) with the optimizer.
void ApplyGradients(const optim::Optimizer& optimizer, const std::vector<Var>& params,
                    std::vector<optim::SlotState>& states, float lr) {
  for (size_t i = 0; i < params.size(); ++i) {
    Node& p = *params[i];
    if (p.sparse_grad && p.grad.empty()) {
      const int64_t row_size = p.value.size() / p.value.dim(0);
      optimizer.ApplySparse(p.value.data(), p.sparse_grad->rows, p.sparse_grad->values.data(), row_size, states[i], lr);
      continue;
    }
    if (p.sparse_grad) {  // both kinds: fold the sparse rows into the dense gradient
      Tensor& g = p.MutableGrad();
      const int64_t row_size = p.value.size() / p.value.dim(0);
      for (size_t r = 0; r < p.sparse_grad->rows.size(); ++r) {
        float* dst = g.data() + p.sparse_grad->rows[r] * row_size;
        const float* src = p.sparse_grad->values.data() + r * row_size;
        for (int64_t j = 0; j < row_size; ++j) dst[j] += src[j];
      }
    }
    if (p.grad.empty()) continue;  // parameter unused by this step's graph
    optimizer.ApplyDense(p.value.data(), p.grad.data(), p.value.size(), states[i], lr);
  }
}

// One single-process run of an image model, as a few steps: Prepare, Restore, Train, Summarize,
// FinishCheckpoint. Owns the data, the replicas, the optimizer and its slot states.
class SingleProcessRun {
 public:
  SingleProcessRun(const TrainOptions& options, const LogSink& log) : options_(options), log_(log) {}

  // The data, the replicas, the optimizer and one slot state per parameter.
  absl::Status Prepare() {
    auto data = LoadTrainingData(options_);
    if (!data.ok()) return data.status();
    data_ = *std::move(data);
    auto replicas = LocalReplicas::Create(ModelConfigFrom(options_), options_.local_replicas);
    if (!replicas.ok()) return replicas.status();
    replicas_ = *std::move(replicas);
    opt_config_ = OptimizerConfigFrom(options_);
    auto optimizer = optim::MakeOptimizer(opt_config_);
    if (!optimizer.ok()) return optimizer.status();
    optimizer_ = *std::move(optimizer);
    for (const Var& p : params()) states_.push_back(optimizer_->NewState(p->value.size()));
    return absl::OkStatus();
  }

  // --checkpoint_dir: the directory made, an earlier run's end marker cleared, and the newest
  // checkpoint's values and slots loaded (training resumes at its step).
  absl::Status Restore() {
    if (options_.checkpoint_dir.empty()) return absl::OkStatus();
    if (auto s = PrepareCheckpointDir(options_.checkpoint_dir, options_.env); !s.ok()) return s;
    if (auto s = ClearTrainingEnd(options_.checkpoint_dir, options_.env); !s.ok()) return s;
    auto restored = LoadTrainingState(options_.checkpoint_dir, options_.model, VariableSpecsOf(params()), *optimizer_,
                                      log_, options_.env);
    if (!restored.ok()) return restored.status();
    if (!restored->has_value()) return absl::OkStatus();
    start_step_ = (*restored)->global_step;
    for (size_t i = 0; i < params().size(); ++i) {
      VariableState& v = (*restored)->variables.at(params()[i]->name);
      params()[i]->value = std::move(v.value);
      for (size_t s = 0; s < v.slots.size(); ++s) {
        states_[i].slots[s].assign(v.slots[s].data(), v.slots[s].data() + v.slots[s].size());
      }
      states_[i].updates = v.updates;
    }
    return absl::OkStatus();
  }

  // The steps from the restored one to --train_steps, checkpointing on schedule.
  absl::Status Train() {
    const data::Dataset& train = data_.train;
    const int batch_size = *options_.batch_size;
    data::BatchSampler sampler(train.num_examples, batch_size, 0, 1, options_.seed);
    std::vector<int64_t> indices;
    std::vector<float> images(batch_size * train.example_size);
    std::vector<int32_t> labels(batch_size);
    log_(absl::StrCat("training ", options_.model, " in one process: ", replicas_->model().NumParameters(),
                      " parameters, ", *options_.train_steps, " steps of batch ", batch_size, ", ", options_.optimizer,
                      " lr ", *options_.learning_rate));
    auto telemetry = Telemetry::Create(options_, /*write_events=*/true, "", log_);
    if (!telemetry.ok()) return telemetry.status();
    telemetry_ = *std::move(telemetry);
    progress_ = std::make_unique<ProgressLog>(log_, "", *options_.train_steps, batch_size);
    CheckpointSchedule schedule(options_.save_checkpoint_steps, options_.save_checkpoint_secs, start_step_);
    for (int64_t step = start_step_; step < *options_.train_steps; ++step) {
      sampler.BatchAt(step, &indices);
      data::Gather(train, indices, images.data(), labels.data());
      StepStats stats =
          replicas_->ComputeGradients(images.data(), labels.data(), batch_size, Rng::Mix(options_.seed, step));
      // A diverged step is never applied: the model and the checkpoints on disk stay finite.
      if (!std::isfinite(stats.loss)) return DivergedError(step, stats.loss, *options_.learning_rate);
      const float lr = optim::LearningRateAt(opt_config_, step);
      ApplyGradients(*optimizer_, params(), states_, lr);
      progress_->Step(step + 1, stats.loss, stats.accuracy, options_.log_every);
      telemetry_->OnStep(step + 1, stats.loss, stats.accuracy, lr, batch_size);
      if (!options_.checkpoint_dir.empty() && schedule.Due(step + 1) && step + 1 < *options_.train_steps) {
        // As on the chief: a periodic save that fails (a full disk) is logged and training goes on;
        // the earlier checkpoints stay, and the final save below reports a lasting failure.
        if (auto s = Save(step + 1); !s.ok()) log_(absl::StrCat("checkpoint failed: ", s.message()));
        schedule.Saved(step + 1);
      }
    }
    return absl::OkStatus();
  }

  // The run's summary, with the final model's validation and test figures.
  RunSummary Summarize() {
    const double train_seconds = progress_->ElapsedSeconds();
    RunSummary summary;
    summary.model = options_.model;
    summary.mode = "single";
    summary.global_step = *options_.train_steps;
    summary.train_seconds = train_seconds;
    summary.examples_per_sec =
        (*options_.train_steps - start_step_) * *options_.batch_size / std::max(train_seconds, 1e-9);
    EvalResult validation = Evaluate(replicas_->model(), data_.validation);
    EvalResult test = Evaluate(replicas_->model(), data_.test);
    summary.validation_accuracy = validation.accuracy;
    summary.validation_cross_entropy = validation.cross_entropy;
    summary.test_accuracy = test.accuracy;
    summary.test_cross_entropy = test.cross_entropy;
    telemetry_->OnFinal(summary.global_step, validation.accuracy, test.accuracy);
    return summary;
  }

  // --checkpoint_dir: the final checkpoint, then the end marker an evaluator watching the
  // directory (programs/eval/evaluator.h) ends after.
  absl::Status FinishCheckpoint() {
    if (options_.checkpoint_dir.empty()) return absl::OkStatus();
    if (auto s = Save(*options_.train_steps); !s.ok()) return s;
    if (auto s = WriteTrainingEnd(options_.checkpoint_dir,
                                  {.failed = false, .global_step = *options_.train_steps, .reason = ""}, options_.env);
        !s.ok()) {
      log_(std::string(s.message()));  // training succeeded; an evaluator will wait for --eval_timeout_secs
    }
    return absl::OkStatus();
  }

 private:
  const std::vector<Var>& params() const { return replicas_->parameters(); }

  absl::Status Save(int64_t step) {
    TrainingState state{step, options_.model, optimizer_->name(), {}, {}};
    for (size_t i = 0; i < params().size(); ++i) {
      VariableState v{params()[i]->value, {}, states_[i].updates};
      for (const FloatBuffer& slot : states_[i].slots) {
        v.slots.emplace_back(params()[i]->value.shape(), std::vector<float>(slot.begin(), slot.end()));
      }
      state.variables.emplace(params()[i]->name, std::move(v));
    }
    auto path = SaveTrainingState(options_.checkpoint_dir, state, optimizer_->slot_names(), 5, options_.env);
    if (!path.ok()) return path.status();
    log_("saved checkpoint " + *path);
    return absl::OkStatus();
  }

  const TrainOptions& options_;
  const LogSink& log_;
  data::MnistData data_;
  std::unique_ptr<LocalReplicas> replicas_;
  optim::OptimizerConfig opt_config_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<optim::SlotState> states_;
  int64_t start_step_ = 0;
  std::unique_ptr<Telemetry> telemetry_;
  std::unique_ptr<ProgressLog> progress_;
};

}  // namespace

absl::StatusOr<RunSummary> TrainImageSingleProcess(const TrainOptions& options, const LogSink& log) {
  SetIntraOpThreads(options.intra_op_threads);
  SingleProcessRun run(options, log);
  if (auto s = run.Prepare(); !s.ok()) return s;
  if (auto s = run.Restore(); !s.ok()) return s;
  if (auto s = run.Train(); !s.ok()) return s;
  RunSummary summary = run.Summarize();
  if (auto s = run.FinishCheckpoint(); !s.ok()) return s;
  return summary;
}

}  // namespace psflow::train
