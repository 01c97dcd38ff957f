// programs/ctr/eval_ctr.h — `psflow eval --model=ctr`: a ctr checkpoint (dense layers and embedding tables,
// train/table_checkpoint.h) evaluated from the file alone, no ps task (see eval_ctr.cc).
#ifndef PSFLOW_PROGRAMS_CTR_EVAL_CTR_H_
#define PSFLOW_PROGRAMS_CTR_EVAL_CTR_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "programs/eval/checkpoint_metrics.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/data/ctr.h"
#include "psflow/train/options.h"
#include "psflow/train/summary.h"
#include "psflow/train/train.h"

namespace psflow::train {

struct CtrCheckpointEval {
  std::string path;
  int64_t global_step = 0;
  CtrFigures figures;            // test log-loss and AUC beside Bayes; table_rows: rows in the file
  int64_t rows_not_in_file = 0;  // looked-up dynamic ids the file lacks (initial values used)
};

// The test set a ctr checkpoint is evaluated on: --test_files' first --ctr_test_examples examples,
// or (no --test_files) the generator's.
struct CtrTestSet {
  data::CtrGenerator generator;
  std::optional<data::CtrExamples> files;
};
absl::StatusOr<std::shared_ptr<const CtrTestSet>> MakeCtrTestSet(const TrainOptions& options);

// The newest valid checkpoint of options.checkpoint_dir (resolved options: --ctr_fields,
// --ctr_dense, --ctr_dim, --ctr_vocab, --seed, --ctr_test_examples, --test_files as in training).
absl::StatusOr<CtrCheckpointEval> EvaluateCtrCheckpoint(const TrainOptions& options, const LogSink& log);
// One opened checkpoint file (the dense layers read whole, the tables' rows of the test set's ids
// only), on the test set.
absl::StatusOr<CtrCheckpointEval> EvaluateCtrFile(const TrainOptions& options, const CtrTestSet& test,
                                                  const ckpt::OpenedCheckpoint& checkpoint);

// The evaluator task's metrics of --model=ctr (programs/eval/evaluator.h): test_log_loss, test_auc,
// bayes_log_loss, bayes_auc and table_rows (rows saved in the file) of each checkpoint on the
// test set (MakeCtrTestSet, made once), its tables' rows read for the test set's ids only. Also the
// ctr chief's --eval_every_steps evaluation beside training (programs/ctr/ctr_worker.cc).
absl::StatusOr<CheckpointMetricsFn> CtrCheckpointMetrics(const TrainOptions& options);

}  // namespace psflow::train

#endif  // PSFLOW_PROGRAMS_CTR_EVAL_CTR_H_
