// Single-process training: the whole model, the optimizer and the data in one process, with the
// same optimizer code the parameter servers run.
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "psflow/core/threading.h"
#include "psflow/data/batcher.h"
#include "psflow/optim/optimizer.h"
#include "programs/mnist/local_replicas.h"
#include "programs/mnist/mnist.h"
#include "psflow/train/train.h"
#include "train/checkpointing.h"
#include "train/cluster_setup.h"
#include "train/training_end.h"
#include "train/progress.h"
#include "train/telemetry.h"

namespace psflow::train {

namespace {

// Applies each parameter's gradient (dense or row-sparse) with the optimizer.
void ApplyGradients(const optim::Optimizer& optimizer, const std::vector<Var>& params,
                    std::vector<optim::SlotState>& states, float lr) {
  for (size_t i = 0; i < params.size(); ++i) {
    Node& p = *params[i];
    if (p.sparse_grad && p.grad.empty()) {
      const int64_t row_size = p.value.size() / p.value.dim(0);
      optimizer.ApplySparse(p.value.data(), p.sparse_grad->rows, p.sparse_grad->values.data(), row_size,
                            states[i], lr);
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

}  // namespace

absl::StatusOr<RunSummary> TrainImageSingleProcess(const TrainOptions& options, const LogSink& log) {
  SetIntraOpThreads(options.intra_op_threads);
  auto data = LoadTrainingData(options);
  if (!data.ok()) return data.status();
  auto replicas = LocalReplicas::Create(ModelConfigFrom(options), options.local_replicas);
  if (!replicas.ok()) return replicas.status();
  const optim::OptimizerConfig opt_config = OptimizerConfigFrom(options);
  auto optimizer = optim::MakeOptimizer(opt_config);
  if (!optimizer.ok()) return optimizer.status();

  const auto& params = (*replicas)->parameters();
  std::vector<optim::SlotState> states;
  for (const Var& p : params) states.push_back((*optimizer)->NewState(p->value.size()));
  int64_t start_step = 0;
  if (!options.checkpoint_dir.empty()) {
    if (auto s = PrepareCheckpointDir(options.checkpoint_dir, options.env); !s.ok()) return s;
    if (auto s = ClearTrainingEnd(options.checkpoint_dir, options.env); !s.ok()) return s;
    auto restored = LoadTrainingState(options.checkpoint_dir, options.model, VariableSpecsOf(params), **optimizer, log,
                                      options.env);
    if (!restored.ok()) return restored.status();
    if (restored->has_value()) {
      start_step = (*restored)->global_step;
      for (size_t i = 0; i < params.size(); ++i) {
        VariableState& v = (*restored)->variables.at(params[i]->name);
        params[i]->value = std::move(v.value);
        for (size_t s = 0; s < v.slots.size(); ++s) {
          states[i].slots[s].assign(v.slots[s].data(), v.slots[s].data() + v.slots[s].size());
        }
        states[i].updates = v.updates;
      }
    }
  }
  auto save = [&](int64_t step) -> absl::Status {
    TrainingState state{step, options.model, (*optimizer)->name(), {}};
    for (size_t i = 0; i < params.size(); ++i) {
      VariableState v{params[i]->value, {}, states[i].updates};
      for (const FloatBuffer& slot : states[i].slots) {
        v.slots.emplace_back(params[i]->value.shape(), std::vector<float>(slot.begin(), slot.end()));
      }
      state.variables.emplace(params[i]->name, std::move(v));
    }
    auto path = SaveTrainingState(options.checkpoint_dir, state, (*optimizer)->slot_names(), 5, options.env);
    if (!path.ok()) return path.status();
    log("saved checkpoint " + *path);
    return absl::OkStatus();
  };
  CheckpointSchedule schedule(options.save_checkpoint_steps, options.save_checkpoint_secs, start_step);

  const data::Dataset& train = data->train;
  data::BatchSampler sampler(train.num_examples, *options.batch_size, 0, 1, options.seed);
  std::vector<int64_t> indices;
  std::vector<float> images(*options.batch_size * train.example_size);
  std::vector<int32_t> labels(*options.batch_size);
  log(absl::StrCat("training ", options.model, " in one process: ", (*replicas)->model().NumParameters(),
                   " parameters, ", *options.train_steps, " steps of batch ", *options.batch_size, ", ",
                   options.optimizer, " lr ", *options.learning_rate));

  auto telemetry = Telemetry::Create(options, /*write_events=*/true, "", log);
  if (!telemetry.ok()) return telemetry.status();
  ProgressLog progress(log, "", *options.train_steps, *options.batch_size);
  for (int64_t step = start_step; step < *options.train_steps; ++step) {
    sampler.BatchAt(step, &indices);
    data::Gather(train, indices, images.data(), labels.data());
    StepStats stats = (*replicas)->ComputeGradients(images.data(), labels.data(), *options.batch_size,
                                                    Rng::Mix(options.seed, step));
    // A diverged step is never applied: the model and the checkpoints on disk stay finite.
    if (!std::isfinite(stats.loss)) return DivergedError(step, stats.loss, *options.learning_rate);
    const float lr = optim::LearningRateAt(opt_config, step);
    ApplyGradients(**optimizer, params, states, lr);
    progress.Step(step + 1, stats.loss, stats.accuracy, options.log_every);
    (*telemetry)->OnStep(step + 1, stats.loss, stats.accuracy, lr, *options.batch_size);
    if (!options.checkpoint_dir.empty() && schedule.Due(step + 1) && step + 1 < *options.train_steps) {
      // As on the chief: a periodic save that fails (a full disk) is logged and training goes on;
      // the earlier checkpoints stay, and the final save below reports a lasting failure.
      if (auto s = save(step + 1); !s.ok()) log(absl::StrCat("checkpoint failed: ", s.message()));
      schedule.Saved(step + 1);
    }
  }
  const double train_seconds = progress.ElapsedSeconds();

  RunSummary summary;
  summary.model = options.model;
  summary.mode = "single";
  summary.global_step = *options.train_steps;
  summary.train_seconds = train_seconds;
  summary.examples_per_sec = (*options.train_steps - start_step) * *options.batch_size / std::max(train_seconds, 1e-9);
  EvalResult validation = Evaluate((*replicas)->model(), data->validation);
  EvalResult test = Evaluate((*replicas)->model(), data->test);
  summary.validation_accuracy = validation.accuracy;
  summary.validation_cross_entropy = validation.cross_entropy;
  summary.test_accuracy = test.accuracy;
  summary.test_cross_entropy = test.cross_entropy;
  (*telemetry)->OnFinal(summary.global_step, validation.accuracy, test.accuracy);
  if (!options.checkpoint_dir.empty()) {
    if (auto s = save(*options.train_steps); !s.ok()) return s;
    // An evaluator watching the directory (programs/eval/evaluator.h) ends after this checkpoint.
    if (auto s = WriteTrainingEnd(options.checkpoint_dir, {.failed = false, .global_step = *options.train_steps,
                                                           .reason = ""}, options.env);
        !s.ok()) {
      log(std::string(s.message()));  // training succeeded; an evaluator will wait for --eval_timeout_secs
    }
  }
  return summary;
}

}  // namespace psflow::train
