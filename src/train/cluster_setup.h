// What a distributed task derives from its options before it talks to anyone: the cluster and its
// own role, the placement plan of the model's variables, and the security settings. Shared by the
// worker and ps task runners; pure functions.
#ifndef PSFLOW_TRAIN_CLUSTER_SETUP_H_
#define PSFLOW_TRAIN_CLUSTER_SETUP_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/dist/cluster.h"
#include "psflow/dist/partition.h"
#include "psflow/nn/model.h"
#include "psflow/ps/ps_client.h"
#include "psflow/train/options.h"

namespace psflow::train {

struct TaskSetup {
  dist::ClusterSpec cluster;
  dist::TaskSpec task;
  rpc::TransportOptions security;
};

// The cluster and this task from the flags, $TF_CONFIG or the Slurm step this process is a task of
// (dist::ResolveCluster's order). `tf_config`, when given, replaces the environment: $TF_CONFIG and
// Slurm's variables are not read ("" = the flags alone).
absl::StatusOr<std::pair<dist::ClusterSpec, dist::TaskSpec>> ResolveTaskCluster(
    const TrainOptions& options, const std::optional<std::string>& tf_config = std::nullopt);

// Resolves the cluster (ResolveTaskCluster), validates this task's role, reads the secret file
// through options.env (an error naming --cluster_secret_file and the cause), and refuses a
// non-loopback listen address without a secret unless --insecure.
absl::StatusOr<TaskSetup> SetUpTask(const TrainOptions& options,
                                    const std::optional<std::string>& tf_config = std::nullopt);

// The placement of `model`'s variables (or of `variables`, in that order) under the options'
// partitioner and placement strategy.
absl::StatusOr<dist::PlacementPlan> PlanFor(const nn::Model& model, const TrainOptions& options, int num_ps);
absl::StatusOr<dist::PlacementPlan> PlanFor(const std::vector<dist::VariableSpec>& variables,
                                            const TrainOptions& options, int num_ps);
// The same with embedding tables placed after the variables (dist::PlanTables).
absl::StatusOr<dist::PlacementPlan> PlanFor(const std::vector<dist::VariableSpec>& variables,
                                            const std::vector<dist::TableSpec>& tables, const TrainOptions& options,
                                            int num_ps);
// Names and shapes of parameters.
std::vector<dist::VariableSpec> VariableSpecsOf(const std::vector<Var>& params);

// Sync-mode quorum: R and T resolved against the number of workers, validated (1 <= R <= T).
absl::StatusOr<ps::TrainingConfig> TrainingConfigFor(const TrainOptions& options, int num_workers);

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_CLUSTER_SETUP_H_
