// The evaluator task (programs/eval/evaluator.h): the checkpoint watcher, the metrics of a
// checkpoint, the report, and the loop that ties them.
#include "programs/eval/evaluator.h"

#include <charconv>
#include <cmath>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "programs/ctr/eval_ctr.h"
#include "programs/mnist/mnist.h"
#include "psflow/core/threading.h"

namespace psflow::train {
namespace {

absl::Mutex g_registry_mu;
std::map<std::string, CheckpointMetricsFactory>& Registry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_registry_mu) {
  static auto* registry = new std::map<std::string, CheckpointMetricsFactory>();
  return *registry;
}

// Image models: accuracy and cross-entropy on MNIST's validation and test sets (vgg19: its synthetic
// images), loaded once.
absl::StatusOr<CheckpointMetricsFn> ImageModelMetrics(const TrainOptions& options) {
  auto data = LoadTrainingData(options);
  if (!data.ok()) return data.status();
  auto shared = std::make_shared<data::MnistData>(*std::move(data));
  return CheckpointMetricsFn([options, shared](const ckpt::OpenedCheckpoint& opened) -> absl::StatusOr<Metrics> {
    auto checkpoint = ckpt::ReadCheckpoint(opened.path, options.env);
    if (!checkpoint.ok()) return checkpoint.status();
    auto model = ModelFromCheckpoint(options, *checkpoint);
    if (!model.ok()) return model.status();
    const EvalResult validation = Evaluate(**model, shared->validation);
    const EvalResult test = Evaluate(**model, shared->test);
    return Metrics{{"validation_accuracy", validation.accuracy},
                   {"validation_cross_entropy", validation.cross_entropy},
                   {"test_accuracy", test.accuracy},
                   {"test_cross_entropy", test.cross_entropy}};
  });
}

// "validation_accuracy" -> "accuracy/validation", the chief's tag (train/telemetry.cc).
std::string TagOf(const std::string& metric) {
  for (const char* split : {"validation_", "test_"}) {
    const std::string prefix(split);
    if (metric.starts_with(prefix)) return metric.substr(prefix.size()) + "/" + prefix.substr(0, prefix.size() - 1);
  }
  return metric;
}

}  // namespace

CheckpointWatcher::CheckpointWatcher(WatchOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::optional<ckpt::Checkpoint>> CheckpointWatcher::Next(const LogSink& log) {
  auto opened = NextOpened(log);
  if (!opened.ok()) return opened.status();
  if (!opened->has_value()) return std::optional<ckpt::Checkpoint>();
  auto checkpoint = ckpt::ReadCheckpoint((**opened).path, options_.env);
  if (!checkpoint.ok()) return checkpoint.status();
  return std::optional<ckpt::Checkpoint>(*std::move(checkpoint));
}

absl::StatusOr<std::optional<ckpt::OpenedCheckpoint>> CheckpointWatcher::NextOpened(const LogSink& log) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point last_log = start;
  const std::string& dir = options_.checkpoint_dir;
  while (true) {
    const auto listed = ckpt::ListCheckpoints(dir, options_.env);
    if (!listed.empty() && listed.front().first > last_step_) {
      std::vector<std::string> skipped;
      auto latest = ckpt::OpenLatestCheckpoint(dir, &skipped, options_.env);
      if (!latest.ok()) return latest.status();
      for (const std::string& s : skipped) {
        if (skipped_logged_.insert(s).second) log("evaluator: " + s);
      }
      if (latest->has_value() && (**latest).global_step > last_step_) {
        last_step_ = (**latest).global_step;
        return latest;
      }
    }
    auto end = ReadTrainingEnd(dir, options_.env);
    if (!end.ok()) return end.status();
    if (end->has_value()) {
      const TrainingEnd& e = **end;
      if (e.failed) {
        return absl::AbortedError(
            absl::StrCat("the training job failed: ", e.reason, " (", dir, "/", kTrainingEndFile, ")"));
      }
      const bool earlier_run = options_.final_step.has_value() && e.global_step < *options_.final_step;
      if (!earlier_run && e.global_step <= last_step_) return std::optional<ckpt::OpenedCheckpoint>();
    }
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (waited >= options_.timeout_secs) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "no new checkpoint in %s for %g s and no end-of-training marker (%s): is the chief running and "
          "saving (--save_checkpoint_steps or --save_checkpoint_secs)? Raise --eval_timeout_secs to wait longer",
          dir, options_.timeout_secs, kTrainingEndFile));
    }
    if (std::chrono::duration<double>(Clock::now() - last_log).count() >= options_.log_every_secs) {
      last_log = Clock::now();
      log(absl::StrFormat("evaluator: waiting for %s in %s (%.0f s so far; gives up after --eval_timeout_secs=%g)",
                          last_step_ < 0 ? std::string("a first checkpoint")
                                         : absl::StrCat("a checkpoint newer than global step ", last_step_),
                          dir, waited, options_.timeout_secs));
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_secs));
  }
}

void RegisterCheckpointMetrics(const std::string& model, CheckpointMetricsFactory factory) {
  absl::MutexLock lock(&g_registry_mu);
  Registry()[model] = std::move(factory);
}

absl::StatusOr<CheckpointMetricsFn> CheckpointMetricsFor(const TrainOptions& options) {
  // --intra_op_threads (default 1) as the training programs apply it: `psflow eval` accepted the
  // flag but computed on every core, and figures at 2 threads may differ from 1's in the last bit.
  SetIntraOpThreads(options.intra_op_threads);
  CheckpointMetricsFactory factory;
  {
    absl::MutexLock lock(&g_registry_mu);
    auto it = Registry().find(options.model);
    if (it != Registry().end()) factory = it->second;
  }
  if (factory) return factory(options);
  if (options.model == "ctr") return CtrCheckpointMetrics(options);
  return ImageModelMetrics(options);
}

std::string MetricText(double value) {
  if (!std::isfinite(value)) return absl::StrCat(value);
  return absl::StrFormat("%.6g", value);
}

absl::StatusOr<std::unique_ptr<EvalReporter>> EvalReporter::Create(const std::string& logdir, const LogSink& log,
                                                                   io::Env* env) {
  std::unique_ptr<tboard::EventWriter> events;
  if (!logdir.empty()) {
    auto writer = tboard::EventWriter::Create(logdir + "/eval", env);
    if (!writer.ok()) return writer.status();
    events = std::move(writer).value();
  }
  return std::unique_ptr<EvalReporter>(new EvalReporter(log, std::move(events)));
}

absl::Status EvalReporter::Report(int64_t global_step, const std::string& checkpoint, const Metrics& metrics) {
  std::string line = absl::StrCat("eval: global_step=", global_step);
  std::vector<std::pair<std::string, float>> scalars;
  for (const auto& [name, value] : metrics) {
    absl::StrAppend(&line, " ", name, "=", MetricText(value));
    scalars.emplace_back(TagOf(name), static_cast<float>(value));
  }
  if (!checkpoint.empty()) absl::StrAppend(&line, " checkpoint=", checkpoint);
  log_(line);
  ++reported_;
  if (events_ == nullptr) return absl::OkStatus();
  if (absl::Status s = events_->AddScalars(scalars, global_step); !s.ok()) return s;
  return events_->Flush();
}

absl::Status RunEvaluator(const TrainOptions& options, const WatchOptions& watch, const LogSink& log) {
  if (options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "the evaluator needs --checkpoint_dir=DIR: the directory the chief saves checkpoints to");
  }
  auto metrics_of = CheckpointMetricsFor(options);
  if (!metrics_of.ok()) return metrics_of.status();
  auto reporter = EvalReporter::Create(options.logdir, log, options.env);
  if (!reporter.ok()) return reporter.status();
  log(absl::StrCat("evaluator: watching ", options.checkpoint_dir,
                   options.logdir.empty() ? "" : absl::StrCat("; summaries in ", options.logdir, "/eval")));
  CheckpointWatcher watcher(watch);
  while (true) {
    auto next = watcher.NextOpened(log);
    if (!next.ok()) return next.status();
    if (!next->has_value()) break;
    auto metrics = (*metrics_of)(**next);
    if (!metrics.ok()) return metrics.status();
    if (auto s = (*reporter)->Report((**next).global_step, (**next).path, *metrics); !s.ok()) return s;
  }
  log(absl::StrCat("evaluator: training ended at global step ", watcher.last_step(), "; evaluated ",
                   (*reporter)->reported(), " checkpoint(s)"));
  return absl::OkStatus();
}

}  // namespace psflow::train
