// A worker task of `psflow train --model=ctr` (programs/ctr/ctr_single.h, RunCtrWorker): the ctr model's
// dense layers are the session's parameters and its fields' embedding tables the session's tables,
// which live on the ps tasks (the update rules run there, one implementation for every mode).
// Per step the worker takes its part of the one-process stream's batch at the session's data step
// (docs/design.md#data-order: sync, part w of global batch s of R·B examples, so R workers × B see
// one process's R·B; async, batch s of B, distinct per push), looks its ids up (deduplicated; the
// rows usually came back with the previous step's answer), computes, hands back each unique id's
// gradient and the next batch's ids (prefetch), and steps: one round trip per step. The chief
// evaluates the final model on the generator's test set (log-loss and AUC beside Bayes).
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "programs/ctr/ctr_single.h"
#include "psflow/core/threading.h"
#include "psflow/train/session.h"
#include "train/option_value.h"

namespace psflow::train {
namespace {

// One batch (or this worker's part of one) and its table ids per field.
struct CtrBatch {
  int64_t step = -1;
  std::vector<int64_t> ids;
  std::vector<float> dense, labels;
  std::vector<std::vector<int64_t>> columns;

  // Examples [part·B, (part + 1)·B) of batch `at` of the generator's stream 0 (the one one process
  // reads: FillBatch(0, at, ...), whose smaller batches are prefixes of larger ones).
  absl::Status Fill(const data::CtrGenerator& generator, const TrainOptions& o, int64_t part, int64_t at) {
    const int64_t batch = OptionValue(o.batch_size);
    ids.resize(batch * o.ctr_fields);
    dense.resize(batch * kCtrNumDense);
    labels.resize(batch);
    if (auto s = generator.FillBatchPart(0, at, part * batch, batch, ids.data(), dense.data(), labels.data());
        !s.ok()) {
      return s;
    }
    CtrTableIds(o, ids.data(), batch, &columns);
    step = at;
    return absl::OkStatus();
  }
  std::vector<absl::Span<const int64_t>> Spans() const {
    std::vector<absl::Span<const int64_t>> spans;
    for (const auto& c : columns) spans.emplace_back(c);
    return spans;
  }
};

// The session's table rows as leaves of the graph (their gradients are the unique rows').
std::vector<nn::FieldRows> FieldRowsOf(WorkerSession& session, std::vector<Var>* leaves, bool trainable) {
  std::vector<nn::FieldRows> fields;
  leaves->clear();
  for (int t = 0; t < session.num_tables(); ++t) {
    TableBatch& b = session.table_batch(t);
    Var leaf = trainable ? MakeParameter(nn::CtrModel::TableName(t), std::move(b.rows)) : Constant(std::move(b.rows));
    leaves->push_back(leaf);
    fields.push_back({leaf, b.index});
  }
  return fields;
}

}  // namespace

absl::StatusOr<RunSummary> RunCtrWorker(const TrainOptions& options, const LogSink& log) {
  if (!options.train_files.empty() || !options.test_files.empty()) {
    return absl::UnimplementedError(
        "--train_files/--test_files train in one process so far (psflow train without --job_name): the work "
        "queue that hands file slices to a cluster's workers is not built yet");
  }
  SetIntraOpThreads(options.intra_op_threads);
  auto generator = MakeCtrGenerator(options);
  if (!generator.ok()) return generator.status();
  auto model_or = MakeCtrModel(options);
  if (!model_or.ok()) return model_or.status();
  nn::CtrModel& model = **model_or;

  std::vector<SessionParameter> params;
  for (const Var& p : model.parameters()) params.push_back({p->name, &p->value, &p->grad, nullptr});
  std::vector<dist::TableSpec> tables;
  for (int f = 0; f < options.ctr_fields; ++f) tables.push_back(CtrTableSpec(options, f));
  WorkerSession::Options session_options;
  session_options.train = options;
  session_options.model_name = options.model;
  session_options.log = log;
  session_options.rebuild_initial_values = [&options]() -> absl::StatusOr<std::vector<Tensor>> {
    auto fresh = MakeCtrModel(options);
    if (!fresh.ok()) return fresh.status();
    std::vector<Tensor> values;
    for (const Var& p : (*fresh)->parameters()) values.push_back(std::move(p->value));
    return values;
  };
  auto session_or = WorkerSession::Create(session_options, std::move(params), std::move(tables));
  if (!session_or.ok()) return session_or.status();
  WorkerSession& session = **session_or;

  auto train = [&]() -> absl::StatusOr<RunSummary> {
    if (auto s = session.Open(); !s.ok()) return s;
    const TrainOptions& o = session.options();  // resolved
    const int64_t part = session.data_worker_index();  // sync: the worker's index; async: 0
    if (session.is_chief()) {
      log(absl::StrCat(
          "ctr: ", o.ctr_fields, " fields of dim ", o.ctr_dim, " (",
          o.ctr_vocab > 0 ? absl::StrCat("fixed div tables of ", o.ctr_vocab, " rows") : std::string("dynamic tables"),
          ", ", o.sparse_optimizer, " lr ", OptionValue(o.sparse_learning_rate), " on the ps), ", model.NumParameters(),
          " dense parameters (", o.optimizer, " lr ", OptionValue(o.learning_rate), ")"));
    }
    CtrBatch current, next;
    std::vector<Var> leaves;
    const int64_t batch = OptionValue(o.batch_size);
    while (!session.ShouldStop()) {
      // Sync: this worker's part of the global step's batch; async: the batch its last push claimed.
      const int64_t at = session.data_step();
      if (next.step == at) {
        std::swap(current, next);
      } else if (auto s = current.Fill(*generator, o, part, at); !s.ok()) {
        return s;
      }
      absl::Status looked = session.Lookup(current.Spans());
      if (absl::IsOutOfRange(looked)) break;  // training finished elsewhere
      if (!looked.ok()) return looked;
      std::vector<nn::FieldRows> fields = FieldRowsOf(session, &leaves, /*trainable=*/true);
      Var logits = model.Logits(current.dense.data(), batch, fields);
      Var loss = nn::CtrModel::Loss(logits, current.labels);
      const double loss_value = loss->value[0];
      int64_t correct = 0;
      for (int64_t i = 0; i < batch; ++i) correct += (logits->value[i] > 0) == (current.labels[i] > 0.5f);
      if (std::isfinite(loss_value)) {
        Backward(loss);
        for (int t = 0; t < session.num_tables(); ++t) session.table_batch(t).grads = std::move(leaves[t]->grad);
        // The next batch's ids ride on this step's push; its rows come back with the answer.
        if (auto s = next.Fill(*generator, o, part, at + 1); !s.ok()) return s;
        if (auto s = session.Prefetch(next.Spans()); !s.ok()) return s;
      }
      if (auto s = session.Step(loss_value, static_cast<double>(correct) / static_cast<double>(batch)); !s.ok()) {
        return s;
      }
      ZeroGrad(model.parameters());
    }
    return session.Close([&]() -> absl::StatusOr<SessionEval> {
      auto figures = EvaluateCtrModel(
          o, *generator, model, o.ctr_test_examples,
          [&](const std::vector<std::vector<int64_t>>& columns) -> absl::StatusOr<std::vector<nn::FieldRows>> {
            std::vector<absl::Span<const int64_t>> spans;
            for (const auto& c : columns) spans.emplace_back(c);
            if (auto s = session.Lookup(spans); !s.ok()) return s;
            return FieldRowsOf(session, &leaves, /*trainable=*/false);
          });
      if (!figures.ok()) return figures.status();
      SessionEval eval;
      eval.test_cross_entropy = figures->test_log_loss;
      eval.ctr = *figures;
      return eval;
    });
  };
  absl::StatusOr<RunSummary> result = train();
  if (!result.ok()) session.Abort(result.status());
  return result;
}

}  // namespace psflow::train
