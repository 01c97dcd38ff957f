// Single-process training of the ctr model with in-process tables (programs/ctr/ctr_single.h).
#include "programs/ctr/ctr_single.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check.h"
#include "psflow/core/threading.h"
#include "psflow/data/ctr_metrics.h"
#include "train/checkpointing.h"
#include "train/progress.h"
#include "train/sparse_rule_config.h"
#include "train/telemetry.h"

namespace psflow::train {
namespace {

// Test examples are scored this many at a time.
constexpr int64_t kEvalChunk = 8192;

}  // namespace

dist::TableSpec CtrTableSpec(const TrainOptions& options, int field) {
  dist::TableSpec spec;
  spec.name = nn::CtrModel::TableName(field);
  spec.dim = options.ctr_dim;
  spec.kind = options.ctr_vocab == 0 ? dist::TableKind::kDynamic : dist::TableKind::kFixed;
  spec.num_embeddings = options.ctr_vocab;
  // The ctr tables' template: a truncated normal of stddev 0.05, each field's own seed.
  spec.initializer = dist::TableInitializer::TruncatedNormal(0.0f, 0.05f, Rng::Mix(options.seed, 0x7ab1e000 + field));
  // Then the --table_<field> flags given (checked by ResolveTrainOptions: CHECKed here).
  for (const auto& [name, text] : options.table_options) {
    const absl::Status set = dist::SetTableField(&spec, name, text);
    CHECK(set.ok()) << set.message();
  }
  return spec;
}

absl::StatusOr<data::CtrGenerator> MakeCtrGenerator(const TrainOptions& options, std::vector<int64_t> vocab_sizes) {
  data::CtrConfig data_config;
  data_config.seed = options.seed;
  data_config.num_fields = options.ctr_fields;
  data_config.num_dense = options.ctr_dense;
  if (absl::Status s = data::ApplyCtrPreset(options.ctr_preset, &data_config); !s.ok()) return s;
  if (!vocab_sizes.empty()) data_config.vocab_sizes = std::move(vocab_sizes);
  return data::CtrGenerator::Create(data_config);
}

absl::StatusOr<std::unique_ptr<nn::CtrModel>> MakeCtrModel(const TrainOptions& options) {
  nn::CtrModelConfig model_config;
  model_config.num_dense = options.ctr_dense;
  model_config.num_fields = options.ctr_fields;
  model_config.dim = options.ctr_dim;
  model_config.seed = options.seed;
  return nn::CtrModel::Create(model_config);
}

void CtrTableIds(const TrainOptions& options, const int64_t* ids, int64_t batch,
                 std::vector<std::vector<int64_t>>* columns) {
  const int fields = options.ctr_fields;
  columns->resize(fields);
  for (int f = 0; f < fields; ++f) {
    std::vector<int64_t>& column = (*columns)[f];
    column.resize(batch);
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t id = ids[i * fields + f];
      column[i] = options.ctr_vocab > 0 ? id % options.ctr_vocab : id;  // the hashing trick for fixed tables
    }
  }
}

absl::StatusOr<std::unique_ptr<CtrTrainer>> CtrTrainer::Create(const TrainOptions& options,
                                                               std::vector<int64_t> vocab_sizes) {
  std::unique_ptr<CtrTrainer> t(new CtrTrainer());
  t->options_ = options;
  auto generator = MakeCtrGenerator(options, std::move(vocab_sizes));
  if (!generator.ok()) return generator.status();
  t->generator_ = std::make_unique<data::CtrGenerator>(*std::move(generator));
  auto model = MakeCtrModel(options);
  if (!model.ok()) return model.status();
  t->model_ = *std::move(model);
  if (!options.train_files.empty()) {
    auto files = CtrFileBatches::Open(options);
    if (!files.ok()) return files.status();
    t->files_ = *std::move(files);
  }
  if (!options.test_files.empty()) {
    auto test = ReadCtrTestFiles(options);
    if (!test.ok()) return test.status();
    t->test_files_ = *std::move(test);
  }

  const ps::table::SparseRuleConfig rule = SparseRuleConfigFrom(options);
  for (int f = 0; f < options.ctr_fields; ++f) {
    const dist::TableSpec spec = CtrTableSpec(options, f);
    auto shard = ps::table::MakeTableShard({spec, 1}, ps::table::RuleForTable(rule, spec), /*shard=*/0, /*num_ps=*/1);
    if (!shard.ok()) return shard.status();
    t->tables_.push_back(*std::move(shard));
  }

  t->dense_config_ = OptimizerConfigFrom(options);
  auto optimizer = optim::MakeOptimizer(t->dense_config_);
  if (!optimizer.ok()) return optimizer.status();
  t->optimizer_ = *std::move(optimizer);
  for (const Var& p : t->model_->parameters()) t->states_.push_back(t->optimizer_->NewState(p->value.size()));
  const int64_t batch = *options.batch_size;
  t->ids_.resize(batch * options.ctr_fields);
  t->dense_.resize(batch * options.ctr_dense);
  t->labels_.resize(batch);
  t->unique_.resize(options.ctr_fields);
  return t;
}

void CtrTrainer::DedupFields(const int64_t* ids, int64_t batch, std::vector<UniqueIds>* unique) const {
  const int fields = options_.ctr_fields;
  if (options_.ctr_vocab > 0) {  // the hashing trick: a fixed table of N rows takes id mod N
    std::vector<int64_t> column(batch);
    for (int f = 0; f < fields; ++f) {
      for (int64_t i = 0; i < batch; ++i) column[i] = ids[i * fields + f] % options_.ctr_vocab;
      DedupIds(column.data(), batch, 1, &(*unique)[f]);
    }
    return;
  }
  for (int f = 0; f < fields; ++f) DedupIds(ids + f, batch, fields, &(*unique)[f]);
}

absl::StatusOr<std::vector<Var>> CtrTrainer::GatherRows(const std::vector<UniqueIds>& unique, bool trainable) const {
  std::vector<Var> rows;
  for (size_t f = 0; f < tables_.size(); ++f) {
    const auto count = static_cast<int64_t>(unique[f].ids.size());
    Tensor value = Tensor::Uninitialized({count, static_cast<int64_t>(options_.ctr_dim)});
    if (auto s = tables_[f]->Gather(unique[f].ids, absl::Span<float>(value.data(), value.size())); !s.ok()) return s;
    rows.push_back(trainable ? MakeParameter(tables_[f]->config().spec.name, std::move(value))
                             : Constant(std::move(value)));
  }
  return rows;
}

absl::StatusOr<CtrTrainer::StepResult> CtrTrainer::Step(int64_t step) {
  const int64_t batch = *options_.batch_size;
  if (auto s = files_ != nullptr ? files_->Fill(step, ids_.data(), dense_.data(), labels_.data())
                                 : generator_->FillBatch(0, step, batch, ids_.data(), dense_.data(), labels_.data());
      !s.ok()) {
    return s;
  }
  DedupFields(ids_.data(), batch, &unique_);
  auto rows = GatherRows(unique_, /*trainable=*/true);
  if (!rows.ok()) return rows.status();
  std::vector<nn::FieldRows> fields;
  for (size_t f = 0; f < rows->size(); ++f) fields.push_back({(*rows)[f], unique_[f].index});
  Var logits = model_->Logits(dense_.data(), batch, fields);
  Var loss = nn::CtrModel::Loss(logits, labels_);
  StepResult result;
  result.loss = loss->value[0];
  int64_t correct = 0;
  for (int64_t i = 0; i < batch; ++i) correct += (logits->value[i] > 0) == (labels_[i] > 0.5f);
  result.accuracy = static_cast<double>(correct) / static_cast<double>(batch);
  result.labels = absl::MakeConstSpan(labels_.data(), static_cast<size_t>(batch));
  result.probabilities.resize(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) result.probabilities[i] = 1.0f / (1.0f + std::exp(-logits->value[i]));
  if (!std::isfinite(result.loss)) return result;  // the caller stops; nothing applied
  Backward(loss);
  for (size_t f = 0; f < tables_.size(); ++f) {
    const Node& leaf = *(*rows)[f];
    if (auto s = tables_[f]->Apply(unique_[f].ids, absl::Span<const float>(leaf.grad.data(), leaf.grad.size()), step);
        !s.ok()) {
      return s;
    }
    tables_[f]->MaybeRemove(step);
  }
  const float lr = optim::LearningRateAt(dense_config_, step);
  const std::vector<Var>& params = model_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Node& p = *params[i];
    if (!p.grad.empty()) optimizer_->ApplyDense(p.value.data(), p.grad.data(), p.value.size(), states_[i], lr);
  }
  ZeroGrad(params);
  return result;
}

absl::StatusOr<CtrFigures> EvaluateCtrModel(const TrainOptions& options, const data::CtrGenerator& generator,
                                            const nn::CtrModel& model, int64_t n, const CtrRowSource& rows) {
  auto test = generator.TestSet(n);
  if (!test.ok()) return test.status();
  return EvaluateCtrExamples(options, *test, model, rows);
}

absl::StatusOr<CtrFigures> EvaluateCtrExamples(const TrainOptions& options, const data::CtrExamples& examples,
                                               const nn::CtrModel& model, const CtrRowSource& rows) {
  const data::CtrExamples* test = &examples;
  const int64_t n = test->num_examples;
  data::CtrBayesMetrics bayes;
  bayes.log_loss = bayes.auc = std::numeric_limits<double>::quiet_NaN();
  if (!test->probabilities.empty()) {
    auto metrics = data::BayesMetrics(*test);
    if (!metrics.ok()) return metrics.status();
    bayes = *metrics;
  }
  std::vector<double> probabilities(n);
  std::vector<std::vector<int64_t>> columns;
  const int fields = options.ctr_fields;
  for (int64_t first = 0; first < n; first += kEvalChunk) {
    const int64_t count = std::min(kEvalChunk, n - first);
    CtrTableIds(options, test->ids.data() + first * fields, count, &columns);
    auto field_rows = rows(columns);
    if (!field_rows.ok()) return field_rows.status();
    Var logits = model.Logits(test->dense.data() + first * test->num_dense, count, *field_rows);
    for (int64_t i = 0; i < count; ++i) probabilities[first + i] = 1.0 / (1.0 + std::exp(-double{logits->value[i]}));
  }
  auto log_loss = data::LogLoss(test->labels, probabilities);
  if (!log_loss.ok()) return log_loss.status();
  auto auc = data::Auc(test->labels, probabilities);
  if (!auc.ok()) return auc.status();
  CtrFigures figures;
  figures.test_examples = n;
  figures.test_log_loss = *log_loss;
  figures.test_auc = *auc;
  figures.bayes_log_loss = bayes.log_loss;
  figures.bayes_auc = bayes.auc;
  return figures;
}

absl::StatusOr<CtrFigures> CtrTrainer::Evaluate(int64_t n) const {
  std::vector<UniqueIds> unique(tables_.size());
  const CtrRowSource rows =
      [&](const std::vector<std::vector<int64_t>>& columns) -> absl::StatusOr<std::vector<nn::FieldRows>> {
    for (size_t f = 0; f < tables_.size(); ++f) {
      DedupIds(columns[f].data(), static_cast<int64_t>(columns[f].size()), 1, &unique[f]);
    }
    auto rows = GatherRows(unique, /*trainable=*/false);
    if (!rows.ok()) return rows.status();
    std::vector<nn::FieldRows> field_rows;
    for (size_t f = 0; f < rows->size(); ++f) field_rows.push_back({(*rows)[f], unique[f].index});
    return field_rows;
  };
  auto figures = test_files_.has_value() ? EvaluateCtrExamples(options_, *test_files_, *model_, rows)
                                         : EvaluateCtrModel(options_, *generator_, *model_, n, rows);
  if (!figures.ok()) return figures.status();
  for (const auto& table : tables_) figures->table_rows += table->stats().rows;
  return figures;
}

absl::StatusOr<RunSummary> RunCtrSingleProcess(const TrainOptions& options, const LogSink& log) {
  SetIntraOpThreads(options.intra_op_threads);
  auto trainer = CtrTrainer::Create(options);
  if (!trainer.ok()) return trainer.status();
  int64_t start_step = 0;
  if (!options.checkpoint_dir.empty()) {
    if (auto s = PrepareCheckpointDir(options.checkpoint_dir, options.env); !s.ok()) return s;
    auto restored = (*trainer)->RestoreCheckpoint(log);
    if (!restored.ok()) return restored.status();
    start_step = *restored;
  }
  CheckpointSchedule schedule(options.save_checkpoint_steps, options.save_checkpoint_secs, start_step);
  int64_t saved_step = start_step;
  auto save = [&](int64_t step) -> absl::Status {
    auto path = (*trainer)->SaveCheckpoint(step);
    if (!path.ok()) return path.status();
    log("saved checkpoint " + *path);
    schedule.Saved(step);
    saved_step = step;
    return absl::OkStatus();
  };
  const int64_t steps = *options.train_steps, batch = *options.batch_size;
  log(absl::StrCat("training ctr in one process: ", options.ctr_fields, " fields of dim ", options.ctr_dim, " (",
                   options.ctr_vocab > 0 ? absl::StrCat("fixed div tables of ", options.ctr_vocab, " rows")
                                         : std::string("dynamic tables"),
                   ", ", options.sparse_optimizer, " lr ", *options.sparse_learning_rate, "), ",
                   (*trainer)->model().NumParameters(), " dense parameters (", options.optimizer, " lr ",
                   *options.learning_rate, "), ", steps, " steps of batch ", batch));
  auto telemetry = Telemetry::Create(options, /*write_events=*/true, "", log);
  if (!telemetry.ok()) return telemetry.status();
  const optim::OptimizerConfig dense_config = OptimizerConfigFrom(options);
  ProgressLog progress(log, "", steps, batch);
  int64_t step = start_step;
  for (; step < steps; ++step) {
    auto result = (*trainer)->Step(step);
    if (absl::IsOutOfRange(result.status())) {  // the end of --train_files ends training here
      log(absl::StrCat(result.status().message(), ": training ends at step ", step,
                       steps == kUntilTheDataEnds ? std::string(" (no --train_steps)") : absl::StrCat(" of ", steps)));
      break;
    }
    if (!result.ok()) return result.status();
    if (!std::isfinite(result->loss)) return DivergedError(step, result->loss, *options.learning_rate);
    (void)progress.AddClicks(result->labels, result->probabilities);  // sizes equal by construction
    progress.Step(step + 1, result->loss, result->accuracy, options.log_every);
    (*telemetry)->OnStep(step + 1, result->loss, result->accuracy, optim::LearningRateAt(dense_config, step), batch);
    if (options.eval_every_steps > 0 && (step + 1) % options.eval_every_steps == 0 && step + 1 < steps) {
      // The curve of test figures against steps (bench/ctr_presets_curve.py reads these lines).
      auto f = (*trainer)->Evaluate(options.ctr_test_examples);
      if (!f.ok()) return f.status();
      log(absl::StrFormat("eval at step %d: test_log_loss=%.5f (bayes %.5f) test_auc=%.5f (bayes %.5f)", step + 1,
                          f->test_log_loss, f->bayes_log_loss, f->test_auc, f->bayes_auc));
    }
    if (!options.checkpoint_dir.empty() && step + 1 < steps && schedule.Due(step + 1)) {
      // As on the chief: a periodic save that fails (a full disk) is logged and training goes on.
      if (auto s = save(step + 1); !s.ok()) log(absl::StrCat("checkpoint failed: ", s.message()));
      schedule.Saved(step + 1);
    }
  }
  const int64_t end_step = step;  // `steps`, or where the training files ended
  if (const CtrFileBatches* files = (*trainer)->training_files(); files != nullptr) {
    log(absl::StrCat("training files: ", files->examples_read(), " examples read in ", files->epochs_begun(),
                     " epoch(s), ", files->bad_lines(), " bad lines skipped (--max_bad_lines=", options.max_bad_lines,
                     ")"));
  }
  if (!options.checkpoint_dir.empty() && saved_step != end_step) {
    if (auto s = save(end_step); !s.ok()) return s;
  }
  RunSummary summary;
  summary.model = options.model;
  summary.mode = "single";
  summary.global_step = end_step;
  summary.train_seconds = progress.ElapsedSeconds();
  summary.examples_per_sec = (end_step - start_step) * batch / std::max(summary.train_seconds, 1e-9);
  auto figures = (*trainer)->Evaluate(options.ctr_test_examples);
  if (!figures.ok()) return figures.status();
  summary.ctr = *figures;
  summary.test_cross_entropy = figures->test_log_loss;
  (*telemetry)->OnFinal(end_step, 0, 0);
  return summary;
}

}  // namespace psflow::train
