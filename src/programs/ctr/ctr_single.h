// programs/ctr/ctr_single.h — single-process training of the ctr model (nn::CtrModel) on the synthetic
// generator's stream (data::CtrGenerator, worker 0), with its embedding tables held in-process by
// the ps's own table blocks (ps/server/table: FixedTableShard / DynamicTableShard and their sparse
// update rules, one shard per table), so single-process and ps training run one implementation of
// the update rules. Dense layers use optim::Optimizer as every other model.
//
// A CtrTrainer owns the generator, the network, the tables and the optimizer states; one thread
// drives it. TrainSingleProcess (programs/programs.cc) calls RunCtrSingleProcess for --model=ctr.
#ifndef PSFLOW_PROGRAMS_CTR_CTR_SINGLE_H_
#define PSFLOW_PROGRAMS_CTR_CTR_SINGLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "programs/ctr/ctr_files.h"
#include "ps/server/table/table_shard.h"
#include "psflow/core/unique_ids.h"
#include "psflow/data/ctr.h"
#include "psflow/dist/partition.h"
#include "psflow/nn/ctr_model.h"
#include "psflow/optim/optimizer.h"
#include "psflow/train/options.h"
#include "psflow/train/summary.h"
#include "psflow/train/train.h"
#include "train/checkpointing.h"

namespace psflow::train {

// The ctr model's pieces shared by the single-process trainer and the distributed worker
// (programs/ctr/ctr_worker.cc), so both train the same model on the same data.
// Field f's table: [--ctr_vocab, --ctr_dim] fixed div (ids taken mod N), or dynamic when
// --ctr_vocab=0; rows N(0, 0.05²) truncated at 2 stddev from (seed, f).
dist::TableSpec CtrTableSpec(const TrainOptions& options, int field);
// The generator (`vocab_sizes` empty: data::DefaultCtrVocabSizes) and the network of the options.
absl::StatusOr<data::CtrGenerator> MakeCtrGenerator(const TrainOptions& options, std::vector<int64_t> vocab_sizes = {});
absl::StatusOr<std::unique_ptr<nn::CtrModel>> MakeCtrModel(const TrainOptions& options);
// The table ids of a batch's field columns (ids [batch, F] row-major): column f of field f,
// taken mod --ctr_vocab for fixed tables, into columns[f].
void CtrTableIds(const TrainOptions& options, const int64_t* ids, int64_t batch,
                 std::vector<std::vector<int64_t>>* columns);

// Each field's rows for a chunk of examples whose table ids are `columns` (one per field): the
// unique rows and each example's index among them (the indices must live until the next call).
using CtrRowSource =
    std::function<absl::StatusOr<std::vector<nn::FieldRows>>(const std::vector<std::vector<int64_t>>& columns)>;
// Test log-loss and AUC of `model` with the rows `rows` gives on the generator's first `n` test
// examples, beside their Bayes values (table_rows left 0).
absl::StatusOr<CtrFigures> EvaluateCtrModel(const TrainOptions& options, const data::CtrGenerator& generator,
                                            const nn::CtrModel& model, int64_t n, const CtrRowSource& rows);
// The same on given test examples; the Bayes figures from their true probabilities, NaN when they
// have none (examples read from files).
absl::StatusOr<CtrFigures> EvaluateCtrExamples(const TrainOptions& options, const data::CtrExamples& test,
                                               const nn::CtrModel& model, const CtrRowSource& rows);

class CtrTrainer {
 public:
  // From resolved options (ResolveTrainOptions): --seed, --ctr_fields, --ctr_dim, --ctr_vocab,
  // --batch_size, --optimizer / --learning_rate for the dense layers, --sparse_optimizer /
  // --sparse_learning_rate / --ftrl_* for the tables.
  // `vocab_sizes` replaces the generator's default V_f (tests use small vocabularies that a short
  // run can learn); empty keeps data::DefaultCtrVocabSizes.
  static absl::StatusOr<std::unique_ptr<CtrTrainer>> Create(const TrainOptions& options,
                                                            std::vector<int64_t> vocab_sizes = {});

  struct StepResult {
    double loss = 0;
    double accuracy = 0;  // batch accuracy at threshold 0.5
    // The batch's labels (borrowed from the trainer until its next Step) and predicted click
    // probabilities, for the progress line's running AUC and log-loss.
    absl::Span<const float> labels;
    std::vector<float> probabilities;
  };
  // One step at global step `step`: the generator's batch (worker 0, step), or with --train_files
  // the files' batch `step` (steps in increasing order), forward, backward, the tables' sparse
  // updates and the dense updates. A non-finite loss is returned unapplied. OutOfRange: the
  // training files hold no further whole batch (nothing applied).
  absl::StatusOr<StepResult> Step(int64_t step);

  // Test log-loss and AUC of the model on the generator's first `n` test examples, beside their
  // Bayes values (with --test_files: on the files' test set, Bayes unknown: NaN), and the rows the
  // tables hold.
  absl::StatusOr<CtrFigures> Evaluate(int64_t n) const;

  // Checkpoints (programs/ctr/ctr_single_checkpoint.cc), the cluster's layout: the dense layers with the
  // optimizer's slots, and each field's table (train/table_checkpoint.h) scanned from its shard in
  // parts; a file written by either mode restores in the other. Save writes
  // DIR/model.ckpt-STEP.safetensors (--checkpoint_dir) and returns its path — with
  // --full_checkpoint_every=K > 1 a chain as the chief writes it (train/checkpointing.h SaveChain):
  // a full save, then K - 1 increments DIR/model.ckpt-STEP.increment.safetensors of the rows changed
  // since; Restore loads the newest valid checkpoint of --checkpoint_dir (an increment with its
  // chain) and returns its step (0 when there is none); the next save after it is full.
  absl::StatusOr<std::string> SaveCheckpoint(int64_t step);
  absl::StatusOr<int64_t> RestoreCheckpoint(const LogSink& log);

  const data::CtrGenerator& generator() const { return *generator_; }
  const CtrFileBatches* training_files() const { return files_.get(); }  // null: the generator's stream
  const nn::CtrModel& model() const { return *model_; }
  const std::vector<std::unique_ptr<ps::table::TableShard>>& tables() const { return tables_; }

 private:
  CtrTrainer() = default;
  // Dedups each field's column of ids [batch, F] (fixed tables: ids mod N first) into unique_.
  void DedupFields(const int64_t* ids, int64_t batch, std::vector<UniqueIds>* unique) const;
  // Each field's unique rows gathered from its table as leaves (trainable: gradients wanted).
  absl::StatusOr<std::vector<Var>> GatherRows(const std::vector<UniqueIds>& unique, bool trainable) const;

  TrainOptions options_;
  std::unique_ptr<data::CtrGenerator> generator_;
  std::unique_ptr<CtrFileBatches> files_;        // --train_files, or null
  std::optional<data::CtrExamples> test_files_;  // --test_files, or none
  std::unique_ptr<nn::CtrModel> model_;
  std::vector<std::unique_ptr<ps::table::TableShard>> tables_;  // one per field
  std::unique_ptr<SaveChain> chain_;                            // the saves' numbers and chain
  optim::OptimizerConfig dense_config_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<optim::SlotState> states_;  // per dense parameter
  // Reused per step.
  std::vector<int64_t> ids_;
  std::vector<float> dense_, labels_;
  std::vector<UniqueIds> unique_;
};

// `psflow train --model=ctr` without a cluster: trains, logs progress, evaluates on the test set
// and returns the summary with its ctr figures. With --checkpoint_dir it resumes from the newest
// checkpoint and saves on --save_checkpoint_steps/--save_checkpoint_secs and at the end.
absl::StatusOr<RunSummary> RunCtrSingleProcess(const TrainOptions& options, const LogSink& log);

// `psflow train --model=ctr --job_name=worker`: a worker of a cluster (worker 0 is the chief)
// driving a WorkerSession with the model's dense layers as parameters and its fields' tables as
// session tables (on the ps tasks, whose sparse rules update them), on the generator's stream of
// this worker (programs/ctr/ctr_worker.cc). The chief evaluates the final model on the test set.
absl::StatusOr<RunSummary> RunCtrWorker(const TrainOptions& options, const LogSink& log);

}  // namespace psflow::train

#endif  // PSFLOW_PROGRAMS_CTR_CTR_SINGLE_H_
