// Progress log lines shared by single-process and worker training loops:
// "step 1200/10000 loss 0.1234 accuracy 0.9700 worker examples/s 51234 elapsed 3.1s" (this
// worker's examples per second; the final summary's global_examples_per_sec is the job's), with
// " auc 0.7012 log_loss 0.5123" over the window's examples when a ctr job adds its predicted click
// probabilities (AddClicks), and the error that stops a diverged run. Not thread-safe.
#ifndef PSFLOW_TRAIN_PROGRESS_H_
#define PSFLOW_TRAIN_PROGRESS_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "psflow/data/ctr_metrics.h"
#include "psflow/train/train.h"

namespace psflow::train {

// The loss of the step from `step` is not finite: the step is not applied, the run stops.
inline absl::Status DivergedError(int64_t step, double loss, double learning_rate) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "training diverged: the loss of step %d is %f; the step was not applied and the checkpoints are intact "
      "(lower --learning_rate=%g, or use a decay)",
      step, loss, learning_rate));
}

class ProgressLog {
 public:
  ProgressLog(const LogSink& log, std::string prefix, int64_t target_steps, int64_t examples_per_step)
      : log_(log),
        prefix_(std::move(prefix)),
        target_(target_steps),
        examples_per_step_(examples_per_step),
        start_(Clock::now()),
        last_time_(start_) {}

  // Adds a batch's labels (0 or 1) and predicted click probabilities to the window the next line's
  // running AUC and log-loss are computed over. InvalidArgument when the sizes differ.
  absl::Status AddClicks(absl::Span<const float> labels, absl::Span<const float> probabilities) {
    if (labels.size() != probabilities.size()) {
      return absl::InvalidArgumentError(absl::StrFormat("%d labels for %d predicted probabilities; give one each",
                                                        labels.size(), probabilities.size()));
    }
    labels_.insert(labels_.end(), labels.begin(), labels.end());
    probabilities_.insert(probabilities_.end(), probabilities.begin(), probabilities.end());
    return absl::OkStatus();
  }

  // Records one step of this task (reaching `global_step`) and logs every `every` local steps.
  void Step(int64_t global_step, double loss, double accuracy, int64_t every) {
    ++local_steps_;
    loss_sum_ += loss;
    // A step without an accuracy (NaN: a regression's) leaves it out of the line.
    if (!std::isnan(accuracy)) {
      acc_sum_ += accuracy;
      ++acc_steps_;
    }
    if (local_steps_ % every != 0) return;
    const auto now = Clock::now();
    const double window = std::chrono::duration<double>(now - last_time_).count();
    const double examples_per_sec = window > 0 ? every * examples_per_step_ / window : 0.0;
    if (first_step_ < 0) first_step_ = global_step - local_steps_;
    const double elapsed = ElapsedSeconds();
    const double per_step = global_step > first_step_ ? elapsed / (global_step - first_step_) : 0;
    std::string accuracy_text = acc_steps_ > 0 ? absl::StrFormat(" accuracy %.4f", acc_sum_ / acc_steps_) : "";
    if (!labels_.empty()) {
      const absl::StatusOr<double> auc = data::Auc(labels_, probabilities_);
      const absl::StatusOr<double> log_loss = data::LogLoss(labels_, probabilities_);
      if (auc.ok()) absl::StrAppendFormat(&accuracy_text, " auc %.4f", *auc);  // (one class only: no AUC)
      if (log_loss.ok()) absl::StrAppendFormat(&accuracy_text, " log_loss %.4f", *log_loss);
      labels_.clear();
      probabilities_.clear();
    }
    if (target_ == kUntilTheDataEnds) {  // --train_files without --train_steps: no target to count down to
      log_(absl::StrFormat("%sstep %d loss %.4f%s worker examples/s %.0f elapsed %.1fs", prefix_, global_step,
                           loss_sum_ / every, accuracy_text, examples_per_sec, elapsed));
    } else {
      log_(absl::StrFormat("%sstep %d/%d loss %.4f%s worker examples/s %.0f elapsed %.1fs remaining %.1fs", prefix_,
                           global_step, target_, loss_sum_ / every, accuracy_text, examples_per_sec, elapsed,
                           std::max<double>(0, per_step * (target_ - global_step))));
    }
    loss_sum_ = acc_sum_ = 0;
    acc_steps_ = 0;
    last_time_ = now;
  }
  double ElapsedSeconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  int64_t local_steps() const { return local_steps_; }

 private:
  using Clock = std::chrono::steady_clock;
  const LogSink& log_;
  std::string prefix_;
  int64_t target_, examples_per_step_;
  Clock::time_point start_, last_time_;
  int64_t local_steps_ = 0;
  int64_t first_step_ = -1;  // global step when this task started, for the remaining-time estimate
  double loss_sum_ = 0, acc_sum_ = 0;
  int64_t acc_steps_ = 0;                      // steps of the window that had an accuracy
  std::vector<float> labels_, probabilities_;  // the window's clicks (AddClicks)
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_PROGRESS_H_
