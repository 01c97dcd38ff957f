// A worker task: push this worker's gradients to every ps and get the updated variables back,
// compute the next gradients on this worker's shard of the data, and repeat until the global step
// reaches --train_steps. Worker 0, the chief, also brings the ps tasks up (Chief), checkpoints,
// evaluates the result and ends the job.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "psflow/core/threading.h"
#include "psflow/data/batcher.h"
#include "psflow/train/replicas.h"
#include "psflow/train/train.h"
#include "train/chief.h"
#include "train/cluster_setup.h"
#include "train/progress.h"
#include "train/telemetry.h"

namespace psflow::train {
namespace {

std::vector<ps::Gradient> GradientsOf(const std::vector<Var>& params) {
  std::vector<ps::Gradient> grads;
  for (const Var& p : params) {
    ps::Gradient g{p->name};
    if (!p->grad.empty()) g.dense = &p->grad;
    if (p->sparse_grad) g.sparse = &*p->sparse_grad;
    if (g.dense || g.sparse) grads.push_back(g);
  }
  return grads;
}

// Waits for the chief to initialize every ps, in short slices so that a ps killed and restarted
// meanwhile (its held call broken) is asked again, until `timeout_secs` in all.
absl::Status WaitForChief(ps::PsClient& client, double timeout_secs) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_secs);
  absl::Status s;
  do {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    s = client.WaitForInitialization(std::clamp(left, 0.1, 5.0));
    if (s.ok() || !(absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s))) return s;
    if (absl::IsUnavailable(s)) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (std::chrono::steady_clock::now() < deadline);
  return absl::DeadlineExceededError(absl::StrCat("gave up after ", timeout_secs, " s: ", s.message()));
}

// What a worker has once it is connected to every ps task.
struct ConnectedWorker {
  const TrainOptions& options;
  const LogSink& log;
  const dist::ClusterSpec& cluster;
  int index;
  const dist::PlacementPlan& plan;
  const ps::TrainingConfig& config;
  optim::Optimizer& optimizer;
  const data::MnistData& data;
  ReplicaSet& replicas;
  ps::PsClient& client;
};

absl::StatusOr<RunSummary> Train(const ConnectedWorker& w);

}  // namespace

absl::StatusOr<RunSummary> RunWorker(const TrainOptions& options, const LogSink& log) {
  auto setup = SetUpTask(options);
  if (!setup.ok()) return setup.status();
  const dist::ClusterSpec& cluster = setup->cluster;
  const int index = setup->task.index;
  SetIntraOpThreads(options.intra_op_threads);

  auto data = LoadTrainingData(options);
  if (!data.ok()) return data.status();
  auto replicas = ReplicaSet::Create({options.model, options.hidden_units, options.seed}, options.local_replicas);
  if (!replicas.ok()) return replicas.status();
  auto plan = PlanFor((*replicas)->model(), options, cluster.num_ps());
  if (!plan.ok()) return plan.status();
  auto config = TrainingConfigFor(options, cluster.num_workers());
  if (!config.ok()) return config.status();
  auto optimizer = optim::MakeOptimizer(config->optimizer);
  if (!optimizer.ok()) return optimizer.status();

  ps::PsClient::Options client_options;
  client_options.cluster = cluster;
  client_options.plan = *plan;
  client_options.worker_index = index;
  client_options.security = setup->security;
  client_options.rpc_timeout_secs = options.rpc_timeout_secs;
  client_options.connect_timeout_secs = options.ps_timeout_secs;
  client_options.ps_unavailable_timeout_secs = options.ps_timeout_secs;
  client_options.log = log;
  auto client_or = ps::PsClient::Create(client_options);
  if (!client_or.ok()) return client_or.status();
  ps::PsClient& client = **client_or;
  const absl::Status connected = client.Connect();
  absl::StatusOr<RunSummary> result =
      connected.ok() ? Train({options, log, cluster, index, *plan, *config, **optimizer, *data, **replicas, client})
                     : absl::StatusOr<RunSummary>(connected);
  // The chief giving up ends the job: the ps tasks exit non-zero with its reason rather than
  // waiting for a chief that will not come back. (Aborted means a ps told us the job is over.)
  if (!result.ok() && index == 0 && !absl::IsAborted(result.status())) {
    client.Abort(std::string(result.status().message()));
  }
  // Told the job was aborted: leave, so the ps tasks need not wait for us. Giving up (a ps task
  // silent past --ps_timeout_secs, ...): say why, so no ps task waits --worker_timeout_secs for us.
  if (!result.ok() && index != 0) {
    (void)client.Goodbye(absl::IsAborted(result.status()) ? "" : std::string(result.status().message()));
  }
  return result;
}

namespace {

absl::StatusOr<RunSummary> Train(const ConnectedWorker& w) {
  const TrainOptions& options = w.options;
  const LogSink& log = w.log;
  const dist::ClusterSpec& cluster = w.cluster;
  const dist::PlacementPlan& plan = w.plan;
  const ps::TrainingConfig& config = w.config;
  ps::PsClient& client = w.client;
  const data::MnistData& data = w.data;
  ReplicaSet& replicas = w.replicas;
  const int index = w.index;
  const bool is_chief = index == 0;

  const auto& params = replicas.parameters();
  Chief chief(options, client, params, config, w.optimizer, log);
  if (is_chief || options.log_device_placement) log("variable placement:\n" + plan.Format());
  if (is_chief) {
    if (auto s = chief.InitializeCluster(); !s.ok()) return s;
  } else {
    log("waiting for the chief (worker 0) to initialize the variables");
    if (auto s = WaitForChief(client, options.init_timeout_secs); !s.ok()) return s;
  }

  std::vector<std::pair<std::string, Tensor*>> pull_into;
  for (const Var& p : params) pull_into.emplace_back(p->name, &p->value);
  // A ps task that restarted empty: the chief restores it, the others wait until it has.
  auto recover = [&](const absl::Status& status) -> absl::Status {
    if (!ps::IsPsRestarted(status)) return status;
    if (is_chief) return chief.RestorePs(ps::RestartedPsTask(status));
    log(absl::StrCat(status.message(), "; waiting for the chief to restore it"));
    return WaitForChief(client, options.init_timeout_secs);
  };

  const data::Dataset& train = data.train;
  data::BatchSampler sampler(train.num_examples, options.batch_size, index, cluster.num_workers(), options.seed);
  std::vector<int64_t> indices;
  std::vector<float> images(options.batch_size * train.example_size);
  std::vector<int32_t> labels(options.batch_size);
  const int64_t examples_per_global_step = options.batch_size * (config.sync ? config.replicas_to_aggregate : 1);
  auto telemetry = Telemetry::Create(options, /*write_events=*/is_chief, "", log);
  if (!telemetry.ok()) return telemetry.status();
  ProgressLog progress(log, "", options.train_steps, options.batch_size);

  // The variables as they stand (after a restore too): a ps task still being restored means
  // waiting for the chief again. OutOfRange: training finished elsewhere.
  auto pull_current = [&]() -> absl::StatusOr<int64_t> {
    for (;;) {
      auto step = client.Pull(pull_into);
      if (step.ok() || !ps::IsPsRestarted(step.status())) return step;
      if (auto s = recover(step.status()); !s.ok()) return s;
    }
  };
  int64_t global_step = 0;
  auto first = pull_current();
  const bool finished = absl::IsOutOfRange(first.status());
  if (!first.ok() && !finished) return first.status();
  if (first.ok()) global_step = *first;
  const int64_t start_step = global_step;
  int64_t stale = 0;
  for (int64_t local_step = 0; !finished && global_step < options.train_steps; ++local_step) {
    // Sync: worker i takes slice i of global batch `global_step` (the data order contract).
    // Async: each worker walks its own slices of consecutive global batches.
    sampler.BatchAt(config.sync ? global_step : local_step, &indices);
    data::Gather(train, indices, images.data(), labels.data());
    StepStats stats = replicas.ComputeGradients(images.data(), labels.data(), options.batch_size,
                                                Rng::Mix(options.seed, (uint64_t(index) << 40) + local_step));
    // A diverged step is not pushed (the ps would refuse its NaN gradients anyway).
    if (!std::isfinite(stats.loss)) return DivergedError(global_step, stats.loss, options.learning_rate);
    // One call per ps: the gradients go in, the variables as they stand after the update come back.
    auto pushed = client.PushAndPull(GradientsOf(params), global_step, pull_into);
    if (absl::IsOutOfRange(pushed.status())) break;  // training finished elsewhere
    if (!pushed.ok()) {
      if (auto s = recover(pushed.status()); !s.ok()) return s;
      auto step = pull_current();  // continue from the restored state
      if (absl::IsOutOfRange(step.status())) break;
      if (!step.ok()) return step.status();
      global_step = *step;
      continue;
    }
    stale += pushed->stale;
    global_step = pushed->global_step;
    progress.Step(global_step, stats.loss, stats.accuracy, options.log_every);
    (*telemetry)->OnStep(global_step, stats.loss, stats.accuracy,
                         optim::DecayedLearningRate(config.optimizer, global_step), examples_per_global_step);
    if (is_chief) {
      if (auto s = chief.MaybeCheckpoint(global_step); !s.ok()) log(absl::StrCat("checkpoint failed: ", s.message()));
    }
  }
  const double train_seconds = progress.ElapsedSeconds();

  RunSummary summary;
  summary.model = options.model;
  summary.mode = config.sync ? "sync" : "async";
  summary.workers = cluster.num_workers();
  summary.ps = cluster.num_ps();
  summary.stale_gradients_dropped = stale;
  summary.global_step = global_step;
  if (!is_chief) {
    log(absl::StrCat("worker ", index, ": done after ", progress.local_steps(), " local steps"));
    (void)client.Goodbye();
    return summary;
  }

  // The chief checkpoints and evaluates the final parameters, then ends the job.
  auto step = client.Pull(pull_into);
  if (!step.ok()) return step.status();
  if (auto s = chief.SaveCheckpoint(); !s.ok()) return s;
  summary.global_step = *step;
  summary.train_seconds = train_seconds;
  summary.examples_per_sec = (*step - start_step) * examples_per_global_step / std::max(train_seconds, 1e-9);
  EvalResult validation = Evaluate(replicas.model(), data.validation);
  EvalResult test = Evaluate(replicas.model(), data.test);
  summary.validation_accuracy = validation.accuracy;
  summary.validation_cross_entropy = validation.cross_entropy;
  summary.test_accuracy = test.accuracy;
  summary.test_cross_entropy = test.cross_entropy;
  (*telemetry)->OnFinal(summary.global_step, validation.accuracy, test.accuracy);
  if (auto stats = client.Stats(); stats.ok()) {
    for (const ps::PsTaskStats& s : *stats) {
      summary.ps_traffic.push_back({s.task, s.bytes_in, s.bytes_out, s.num_params});
      // Every ps drops the same stale push; count it once, where the global step lives.
      if (s.task == plan.global_step_ps) summary.stale_gradients_dropped = s.stale_gradients_dropped;
    }
  }
  if (auto s = client.Shutdown(); !s.ok()) return s;
  return summary;
}

}  // namespace
}  // namespace psflow::train
