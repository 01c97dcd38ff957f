// `psflow eval --model=ctr`: the newest valid checkpoint of --checkpoint_dir evaluated on the
// generator's test set or --test_files' (test log-loss and AUC beside Bayes, NaN for files), without any ps task. The dense layers
// are read whole; each field's table is never read whole: per chunk of test examples, the unique
// ids of each field are looked up in the file, or in a chain's files newest first
// (train/table_checkpoint.h ReadTableRows: a search of each file's sorted ids, the wanted rows
// read, the others skipped); the tables' rows are counted from their ids alone (CountTableRows). A
// dynamic id the file does not hold (never admitted, or evicted) gets the table's initial value for
// it, as a ps's lookup would.
// The evaluator task (programs/eval/evaluator.h) evaluates each new checkpoint the same way
// (CtrCheckpointMetrics), the generator made once.
#include "programs/ctr/eval_ctr.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "programs/ctr/ctr_single.h"
#include "programs/eval/checkpoint_metrics.h"
#include "ps/server/table/row_init.h"
#include "ps/server/table/table_config.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/checkpoint_chain.h"
#include "train/table_checkpoint.h"

namespace psflow::train {

absl::StatusOr<std::shared_ptr<const CtrTestSet>> MakeCtrTestSet(const TrainOptions& options) {
  auto generator = MakeCtrGenerator(options);
  if (!generator.ok()) return generator.status();
  auto test = std::make_shared<CtrTestSet>(CtrTestSet{*std::move(generator), std::nullopt});
  if (!options.test_files.empty()) {
    auto files = ReadCtrTestFiles(options);
    if (!files.ok()) return files.status();
    test->files = *std::move(files);
  }
  return std::shared_ptr<const CtrTestSet>(std::move(test));
}

absl::StatusOr<CtrCheckpointEval> EvaluateCtrFile(const TrainOptions& options, const CtrTestSet& test,
                                                  const ckpt::OpenedCheckpoint& checkpoint) {
  const ckpt::SafetensorsReader& file = *checkpoint.reader;
  const std::string& path = checkpoint.path;
  auto model_name = file.metadata().find("model");
  if (model_name != file.metadata().end() && model_name->second != options.model) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds model '", model_name->second, "', not --model=",
                                                   options.model, "; pass --model=", model_name->second));
  }
  auto model = MakeCtrModel(options);
  if (!model.ok()) return model.status();
  for (const Var& p : (*model)->parameters()) {
    const ckpt::TensorEntry* e = file.Find(p->name);
    if (e == nullptr || e->shape != p->value.shape()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, e == nullptr ? " has no variable " : ": another shape of variable ", p->name,
                       " (check --ctr_fields, --ctr_dense and --ctr_dim against the training job's)"));
    }
    auto value = file.ReadF32(p->name);
    if (!value.ok()) return value.status();
    p->value = *std::move(value);
  }
  std::vector<dist::TableSpec> specs;
  std::vector<ps::table::RowInitializer> initial;
  for (int f = 0; f < options.ctr_fields; ++f) {
    specs.push_back(CtrTableSpec(options, f));
    initial.emplace_back(specs.back().initializer, specs.back().initializer.seed);
  }
  std::vector<std::vector<int64_t>> index(specs.size());
  int64_t missing = 0;
  const CtrRowSource rows =
      [&](const std::vector<std::vector<int64_t>>& columns) -> absl::StatusOr<std::vector<nn::FieldRows>> {
        std::vector<nn::FieldRows> fields;
        for (size_t f = 0; f < specs.size(); ++f) {
          std::vector<int64_t> ids = columns[f];
          std::sort(ids.begin(), ids.end());
          ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
          std::vector<bool> found;
          auto rows = ReadTableRows(checkpoint, specs[f], ids, &found);
          if (!rows.ok()) return rows.status();
          for (size_t q = 0; q < ids.size(); ++q) {
            if (!found[q]) {
              initial[f].Fill(ids[q], rows->data() + q * specs[f].dim, specs[f].dim);
              ++missing;
            }
          }
          index[f].resize(columns[f].size());
          for (size_t i = 0; i < columns[f].size(); ++i) {
            index[f][i] = std::lower_bound(ids.begin(), ids.end(), columns[f][i]) - ids.begin();
          }
          fields.push_back({Constant(*std::move(rows)), index[f]});
        }
        return fields;
      };
  auto figures = test.files.has_value()
                     ? EvaluateCtrExamples(options, *test.files, **model, rows)
                     : EvaluateCtrModel(options, test.generator, **model, options.ctr_test_examples, rows);
  if (!figures.ok()) return figures.status();
  CtrCheckpointEval result;
  result.path = path;
  result.global_step = checkpoint.global_step;
  result.figures = *figures;
  result.rows_not_in_file = missing;
  for (const dist::TableSpec& t : specs) {
    // The rows of the chain merged, counted from their ids alone.
    auto rows = CountTableRows(checkpoint, t);
    if (!rows.ok()) return rows.status();
    result.figures.table_rows += *rows;
  }
  return result;
}

absl::StatusOr<CtrCheckpointEval> EvaluateCtrCheckpoint(const TrainOptions& options, const LogSink& log) {
  if (options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "psflow eval needs --checkpoint_dir=DIR (a directory the chief saved checkpoints to)");
  }
  std::vector<std::string> skipped;
  auto latest = ckpt::OpenLatestCheckpoint(options.checkpoint_dir, &skipped);
  if (!latest.ok()) return latest.status();
  for (const std::string& s : skipped) log(s);
  if (!latest->has_value()) {
    return absl::NotFoundError(absl::StrCat("no valid checkpoint in --checkpoint_dir=", options.checkpoint_dir));
  }
  auto test = MakeCtrTestSet(options);
  if (!test.ok()) return test.status();
  return EvaluateCtrFile(options, **test, **latest);
}

absl::StatusOr<CheckpointMetricsFn> CtrCheckpointMetrics(const TrainOptions& options) {
  auto test = MakeCtrTestSet(options);
  if (!test.ok()) return test.status();
  return CheckpointMetricsFn([options, shared = *std::move(test)](
                                 const ckpt::OpenedCheckpoint& checkpoint) -> absl::StatusOr<Metrics> {
    auto eval = EvaluateCtrFile(options, *shared, checkpoint);
    if (!eval.ok()) return eval.status();
    const CtrFigures& f = eval->figures;
    return Metrics{{"test_log_loss", f.test_log_loss},
                   {"test_auc", f.test_auc},
                   {"bayes_log_loss", f.bayes_log_loss},
                   {"bayes_auc", f.bayes_auc},
                   {"table_rows", static_cast<double>(f.table_rows)}};
  });
}

}  // namespace psflow::train
