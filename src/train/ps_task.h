// train/ps_task.h (internal) — a parameter-server task run by a program that embeds it (the Python
// binding's psflow.Server): RunParameterServer of psflow/train/train.h, with a way to stop it from
// another thread (Ctrl-C) and a cluster description that replaces $TF_CONFIG. Not a public header:
// a C++ program runs a ps task with psflow/train/train.h's RunParameterServer.
#ifndef PSFLOW_TRAIN_PS_TASK_H_
#define PSFLOW_TRAIN_PS_TASK_H_

#include <atomic>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "psflow/train/options.h"
#include "psflow/train/train.h"

namespace psflow::train {

struct PsTaskControl {
  // Set from any thread: the task stops serving within ~0.1 s and RunParameterServer returns
  // Cancelled("interrupted").
  std::atomic<bool> stop{false};
  // When set, used instead of $TF_CONFIG ("" = the cluster comes from the flags alone).
  std::optional<std::string> tf_config;
  // Set by the task once it serves (its server started and listening).
  std::atomic<bool> serving{false};
};

// As RunParameterServer(options, log); `control` (borrowed, may be null) as above.
absl::Status RunParameterServer(const TrainOptions& options, const LogSink& log, PsTaskControl* control);

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_PS_TASK_H_
