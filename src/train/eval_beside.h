// train/eval_beside.h — the chief's --eval_every_steps evaluation beside training: the chief saves
// the checkpoint of each multiple of N (a save beside training, train/chief.h) and hands the file
// here; one evaluation thread evaluates it from the file alone (as `psflow eval` does) while the
// chief trains on, and the training thread takes the finished results at its next step (to log
// them and write their scalars). So the figures at step S are those of the checkpoint of step S.
//
// The evaluation thread runs at niceness 10, so that on a busy machine training keeps the CPU.
// Submit may be called from any thread (the chief's save thread); TakeResults and Finish from the
// training thread. When evaluations fall behind, a waiting checkpoint is replaced by a newer one
// (as TF's checkpoints_iterator skips to the newest): Finish evaluates the last one submitted.
#ifndef PSFLOW_TRAIN_EVAL_BESIDE_H_
#define PSFLOW_TRAIN_EVAL_BESIDE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "psflow/train/session.h"

namespace psflow::train {

class EvalBeside {
 public:
  // Evaluates one checkpoint file (its scalars; the file's own step is the figures' step).
  using EvaluateFile = std::function<absl::StatusOr<SessionEval>(const std::string& path)>;
  explicit EvalBeside(EvaluateFile evaluate);
  ~EvalBeside();  // drops a waiting checkpoint, waits for the evaluation under way
  EvalBeside(const EvalBeside&) = delete;
  EvalBeside& operator=(const EvalBeside&) = delete;

  // The checkpoint of `global_step` at `path`, to evaluate next (replacing one still waiting).
  void Submit(int64_t global_step, const std::string& path);

  struct Result {
    int64_t global_step = 0;
    std::string path;
    absl::StatusOr<SessionEval> eval;
    double seconds = 0;  // the evaluation's own time, on its thread
    int64_t replaced = 0;  // checkpoints submitted before it and never evaluated (evaluation fell behind)
  };
  // The evaluations finished since the last call, in order.
  std::vector<Result> TakeResults();
  // Waits until the checkpoint submitted last has been evaluated.
  void Finish();

 private:
  void Run();
  static constexpr int kNiceness = 10;  // the evaluation thread's, above the process's 0

  const EvaluateFile evaluate_;
  absl::Mutex mu_;
  std::optional<std::pair<int64_t, std::string>> waiting_ ABSL_GUARDED_BY(mu_);
  int64_t replaced_ ABSL_GUARDED_BY(mu_) = 0;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Result> done_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_EVAL_BESIDE_H_
