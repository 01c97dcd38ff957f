// A worker task of `psflow train` on one of the seed models: computes the gradients of this
// worker's shard of the data and drives a WorkerSession (psflow/train/session.h), which pushes
// them, pulls the updated variables back, and does the chief's duties on worker 0, until the
// global step reaches --train_steps. The chief evaluates the final parameters on MNIST.
#include <cmath>
#include <unordered_map>

#include "programs/mnist/local_replicas.h"
#include "programs/mnist/mnist.h"
#include "psflow/core/random.h"
#include "psflow/core/threading.h"
#include "psflow/data/batcher.h"
#include "psflow/nn/model.h"
#include "psflow/train/session.h"
#include "psflow/train/train.h"
#include "train/option_value.h"

namespace psflow::train {
namespace {

// The built-in models, each one nn::Sequential (src/nn/model.cc).
bool IsSeedModel(const std::string& name) {
  return name == "softmax" || name == "mlp" || name == "cnn" || name == "vgg19";
}

}  // namespace

absl::StatusOr<RunSummary> RunImageWorker(const TrainOptions& options, const LogSink& log) {
  SetIntraOpThreads(options.intra_op_threads);
  auto replicas = LocalReplicas::Create(ModelConfigFrom(options), options.local_replicas);
  if (!replicas.ok()) return replicas.status();

  // The master copy of the parameters is pulled into and pushed from in place.
  std::vector<SessionParameter> params;
  for (const Var& p : (*replicas)->parameters()) params.push_back({p->name, &p->value, &p->grad, &p->sparse_grad});
  WorkerSession::Options session_options;
  session_options.train = options;
  session_options.model_name = options.model;
  session_options.log = log;
  // A ps restart before the first checkpoint goes back to the initial values: the chief rebuilds
  // them from the seed rather than keeping a copy of the whole model.
  session_options.rebuild_initial_values = [&options]() -> absl::StatusOr<std::vector<Tensor>> {
    auto fresh = nn::BuildModel(ModelConfigFrom(options));
    if (!fresh.ok()) return fresh.status();
    std::vector<Tensor> values;
    for (const Var& p : (*fresh)->parameters()) values.push_back(std::move(p->value));
    return values;
  };
  // Filled below, once the data is loaded (the session calls it only after Open).
  std::function<absl::StatusOr<SessionEval>()> evaluate;
  session_options.evaluate = [&evaluate] { return evaluate(); };
  // Each layer's forward waits for its own values (--overlap=push_pull): see the hooks below.
  session_options.waits_for_values = true;
  auto session_or = WorkerSession::Create(session_options, std::move(params));
  if (!session_or.ok()) return session_or.status();
  WorkerSession& session = **session_or;
  auto data = LoadTrainingData(options);
  if (!data.ok()) return data.status();
  evaluate = [&]() -> absl::StatusOr<SessionEval> {
    EvalResult validation = Evaluate((*replicas)->model(), data->validation);
    EvalResult test = Evaluate((*replicas)->model(), data->test);
    SessionEval eval;
    eval.validation_accuracy = validation.accuracy;
    eval.validation_cross_entropy = validation.cross_entropy;
    eval.test_accuracy = test.accuracy;
    eval.test_cross_entropy = test.cross_entropy;
    eval.scalars = {{"validation_accuracy", validation.accuracy},
                    {"validation_cross_entropy", validation.cross_entropy},
                    {"test_accuracy", test.accuracy},
                    {"test_cross_entropy", test.cross_entropy}};
    return eval;
  };

  auto train = [&]() -> absl::StatusOr<RunSummary> {
    if (auto s = session.Open(); !s.ok()) return s;
    const data::Dataset& train = data->train;
    const TrainOptions& o = session.options();  // resolved
    const int batch_size = OptionValue(o.batch_size);
    data::BatchSampler sampler(train.num_examples, batch_size, session.data_worker_index(), session.data_num_workers(),
                               o.seed);
    std::vector<int64_t> indices;
    std::vector<float> images(batch_size * train.example_size);
    std::vector<int32_t> labels(batch_size);
    // Overlap (--overlap): each gradient handed to the session as backward finishes it, and each
    // layer's forward waiting only for its own values. The seed models are one Sequential, whose
    // layers call before_layer; a registered model may not be, so it waits for all its values
    // first, as do K > 1 local replicas (they copy every value before computing).
    const std::vector<Var>& master = (*replicas)->parameters();
    std::unordered_map<const Node*, int> index_of;
    for (size_t i = 0; i < master.size(); ++i) index_of.emplace(master[i].get(), static_cast<int>(i));
    const bool per_layer = (*replicas)->size() == 1 && IsSeedModel(o.model);
    absl::Status handed = absl::OkStatus();
    StepHooks hooks;
    hooks.gradient_ready = [&](int i) {
      if (handed.ok()) handed = session.GradientReady(i);
    };
    if (per_layer) {
      hooks.before_layer = [&](const std::vector<Var>& layer_params) {
        for (const Var& p : layer_params) {
          if (auto it = index_of.find(p.get()); it != index_of.end()) session.WaitForValues(it->second);
        }
      };
    }
    while (!session.ShouldStop()) {
      if (!per_layer) session.WaitForValues();
      // Sync: worker i takes slice i of global batch `global_step` (the data order contract).
      // Async: the batch after the step this worker's last push claimed (session.h's data_step).
      sampler.BatchAt(session.data_step(), &indices);
      data::Gather(train, indices, images.data(), labels.data());
      StepStats stats = (*replicas)->ComputeGradients(
          images.data(), labels.data(), batch_size,
          Rng::Mix(o.seed, (uint64_t(session.worker_index()) << 40) + session.local_step()), hooks);
      if (!handed.ok()) return handed;
      if (auto s = session.Step(stats.loss, stats.accuracy); !s.ok()) return s;
    }
    return session.Close(evaluate);
  };
  absl::StatusOr<RunSummary> result = train();
  if (!result.ok()) session.Abort(result.status());
  return result;
}

}  // namespace psflow::train
