#include "train/cluster_setup.h"

#include <cstdlib>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "psflow/dist/slurm.h"
#include "psflow/io/env.h"

namespace psflow::train {

absl::StatusOr<std::pair<dist::ClusterSpec, dist::TaskSpec>> ResolveTaskCluster(
    const TrainOptions& options, const std::optional<std::string>& tf_config_override) {
  const char* env_tf_config = std::getenv("TF_CONFIG");
  const std::string tf_config =
      tf_config_override.has_value() ? *tf_config_override : (env_tf_config ? env_tf_config : "");
  const std::optional<dist::SlurmStep> slurm =
      tf_config_override.has_value() ? std::nullopt : dist::SlurmStep::FromEnvironment();
  dist::ClusterSources sources;
  sources.ps_hosts = options.ps_hosts;
  sources.worker_hosts = options.worker_hosts;
  sources.job_name = options.job_name;
  sources.task_index = options.task_index;
  sources.tf_config = tf_config;  // a named string: a view of a temporary would dangle
  sources.slurm = slurm ? &*slurm : nullptr;
  sources.slurm_jobs = options.slurm_jobs;
  sources.slurm_port_base = options.slurm_port_base;
  return dist::ResolveCluster(sources);
}

absl::StatusOr<TaskSetup> SetUpTask(const TrainOptions& options, const std::optional<std::string>& tf_config_override) {
  auto resolved = ResolveTaskCluster(options, tf_config_override);
  if (!resolved.ok()) return resolved.status();
  TaskSetup setup{resolved->first, resolved->second, {}};
  if (auto status = setup.cluster.Validate(setup.task); !status.ok()) return status;

  if (!options.cluster_secret_file.empty()) {
    io::Env* env = options.env != nullptr ? options.env : io::Env::Default();
    absl::StatusOr<std::string> text = env->ReadFileToString(options.cluster_secret_file);
    if (!text.ok()) {
      return absl::Status(text.status().code(),
                          absl::StrCat("--cluster_secret_file=", options.cluster_secret_file, " cannot be read (",
                                       text.status().message(),
                                       "); create it with a shared secret (e.g. `openssl rand -hex 32 > FILE`)"));
    }
    setup.security.secret = std::string(absl::StripAsciiWhitespace(*text));
    if (setup.security.secret.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cluster_secret_file=", options.cluster_secret_file, " is empty"));
    }
  }
  setup.security.tls_cert = options.tls_cert;
  setup.security.tls_key = options.tls_key;
  setup.security.tls_ca = options.tls_ca;
  setup.security.max_message_bytes = options.max_message_mb << 20;
  setup.security.transport = options.transport;

  // A task listening beyond loopback without a secret would accept anyone's pushes.
  const std::string& own = setup.cluster.address(setup.task);
  if (setup.task.job == "ps" && !dist::IsLoopbackHost(own) && setup.security.secret.empty() && !options.insecure) {
    return absl::FailedPreconditionError(
        absl::StrCat("refusing to listen on non-loopback address ", own,
                     " without authentication: pass --cluster_secret_file=FILE (same file on every task), or "
                     "--insecure to accept unauthenticated peers"));
  }
  return setup;
}

std::vector<dist::VariableSpec> VariableSpecsOf(const std::vector<Var>& params) {
  std::vector<dist::VariableSpec> variables;
  for (const Var& p : params) variables.push_back({p->name, p->value.shape()});
  return variables;
}

absl::StatusOr<dist::PlacementPlan> PlanFor(const nn::Model& model, const TrainOptions& options, int num_ps) {
  return PlanFor(VariableSpecsOf(model.parameters()), options, num_ps);
}

absl::StatusOr<dist::PlacementPlan> PlanFor(const std::vector<dist::VariableSpec>& variables,
                                            const TrainOptions& options, int num_ps) {
  auto partitioner = dist::ParsePartitioner(options.partitioner);
  if (!partitioner.ok()) return partitioner.status();
  auto placement = dist::ParsePlacement(options.placement);
  if (!placement.ok()) return placement.status();
  return dist::PlanPlacement(variables, *partitioner, *placement, num_ps);
}

absl::StatusOr<dist::PlacementPlan> PlanFor(const std::vector<dist::VariableSpec>& variables,
                                            const std::vector<dist::TableSpec>& tables, const TrainOptions& options,
                                            int num_ps) {
  auto plan = PlanFor(variables, options, num_ps);
  if (!plan.ok() || tables.empty()) return plan;
  auto partitioner = dist::ParsePartitioner(options.partitioner);
  auto placement = dist::ParsePlacement(options.placement);
  if (absl::Status s = dist::PlanTables(tables, *partitioner, *placement, &*plan); !s.ok()) return s;
  return plan;
}

absl::StatusOr<ps::TrainingConfig> TrainingConfigFor(const TrainOptions& options, int num_workers) {
  ps::TrainingConfig config;
  config.optimizer = OptimizerConfigFrom(options);
  config.sync = options.sync_replicas;
  config.total_num_replicas = options.total_num_replicas > 0 ? options.total_num_replicas : num_workers;
  config.replicas_to_aggregate =
      options.replicas_to_aggregate > 0 ? options.replicas_to_aggregate : config.total_num_replicas;
  config.train_steps = *options.train_steps;
  config.sync_timeout_secs = options.sync_timeout_secs;
  config.sparse_optimizer = options.sparse_optimizer;
  config.ftrl_l1 = static_cast<float>(options.ftrl_l1);
  config.ftrl_l2 = static_cast<float>(options.ftrl_l2);
  config.sparse_sync_mean = options.sparse_sync_mean;
  config.sparse_learning_rate = options.sparse_learning_rate.value_or(0.0f);
  config.wire_dtype = options.wire_dtype;
  config.table_sync = options.table_sync;
  config.staleness_aware_lr = options.staleness_aware_lr;
  if (config.sync && config.replicas_to_aggregate > config.total_num_replicas) {
    return absl::InvalidArgumentError(absl::StrCat("--replicas_to_aggregate=", config.replicas_to_aggregate,
                                                   " exceeds --total_num_replicas=", config.total_num_replicas));
  }
  if (config.sync && config.total_num_replicas > num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("--total_num_replicas=", config.total_num_replicas, " exceeds the ",
                                                   num_workers, " workers of the cluster"));
  }
  return config;
}

}  // namespace psflow::train
