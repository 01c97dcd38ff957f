// psflow/dist/slurm.h — the cluster of a Slurm job step, read from the step's environment with
// TensorFlow's SlurmClusterResolver semantics (docs/cluster.md#slurm).
//
// `srun -n4 psflow train --slurm_jobs=ps:1,worker:3` starts four tasks; each reads its step's node
// list (SLURM_STEP_NODELIST, Slurm's hostlist syntax "n[01-03,7],m5"), its tasks per node
// (SLURM_STEP_TASKS_PER_NODE, "2(x3),1") and its rank (SLURM_PROCID). The step's tasks, in rank
// order (node by node, Slurm's default block distribution), fill the jobs in the order listed:
// ranks 0 .. ps-1 are the ps tasks, the next ones the workers. A task's address is its node's name
// and port --slurm_port_base plus its rank on that node. Pure functions over plain values; the
// only process state read is the environment, by SlurmStep::FromEnvironment.
#ifndef PSFLOW_DIST_SLURM_H_
#define PSFLOW_DIST_SLURM_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/dist/cluster.h"

namespace psflow::dist {

// The port of each node's first task when --slurm_port_base is not given (TF's SlurmClusterResolver's).
inline constexpr int kDefaultSlurmPortBase = 8888;

// Slurm's hostlist syntax to host names, in order, as `scontrol show hostnames` prints them:
// "n[01-03,7],m5" -> n01 n02 n03 n7 m5. A range's numbers are zero-padded to its first number's
// width ("n[08-10]" -> n08 n09 n10); "rack[1-2]-n[1-2]" -> rack1-n1 rack1-n2 rack2-n1 rack2-n2.
// Errors (one line naming the piece): unbalanced brackets, a range that is not N or N-M with
// N <= M, text after the last range, three or more ranges in one name, more than 65536 hosts.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view hostlist);

// Slurm's tasks-per-node syntax to one count per node: "2(x3),1" -> 2 2 2 1.
absl::StatusOr<std::vector<int>> ExpandTasksPerNode(std::string_view tasks_per_node);

// One job's share of a step's tasks: --slurm_jobs=ps:2,worker:6 is {{"ps", 2}, {"worker", 6}}.
struct SlurmJob {
  std::string name;  // "ps" or "worker"
  int num_tasks = 0;

  bool operator==(const SlurmJob&) const = default;
};

// Parses "ps:2,worker:6" (either order, each job once, at least one ps and one worker).
absl::StatusOr<std::vector<SlurmJob>> ParseSlurmJobs(std::string_view jobs);

// The Slurm variables of one task of a job step, as text ("" when unset).
struct SlurmStep {
  std::string nodelist;        // SLURM_STEP_NODELIST
  std::string tasks_per_node;  // SLURM_STEP_TASKS_PER_NODE
  std::string num_tasks;       // SLURM_STEP_NUM_TASKS (checked against tasks_per_node when set)
  std::string procid;          // SLURM_PROCID: this task's rank in the step
  std::string localid;         // SLURM_LOCALID: its rank on its node (checked when set)
  std::string nodename;        // SLURMD_NODENAME: its node (checked when set)

  // This process's step, or nullopt when it is not a task of a Slurm job step (SLURM_PROCID or
  // SLURM_STEP_NODELIST unset; an sbatch script itself has no SLURM_STEP_NODELIST).
  static std::optional<SlurmStep> FromEnvironment();

  // The step's task count (the sum of tasks_per_node), or nullopt when that does not parse.
  std::optional<int> TotalTasks() const;
};

// The cluster of a step and this task. `jobs` is --slurm_jobs ("" = the default: ps:1 and every
// other task a worker); `port_base` is --slurm_port_base. Errors are one line, e.g.
// "--slurm_jobs=ps:1,worker:2 needs 3 tasks but this Slurm step has 4 (SLURM_STEP_TASKS_PER_NODE=4):
// start it with srun -n3, or change --slurm_jobs". A task that SLURM_LOCALID / SLURMD_NODENAME place
// elsewhere than block order does (srun --distribution=cyclic) is an error too.
absl::StatusOr<std::pair<ClusterSpec, TaskSpec>> ClusterFromSlurm(const SlurmStep& step, std::string_view jobs,
                                                                  int port_base);

}  // namespace psflow::dist

#endif  // PSFLOW_DIST_SLURM_H_
