// psflow/dist/cluster.h — the cluster description: which ps and worker tasks exist, at which
// addresses, and which one this process is.
//
// A ClusterSpec is a plain value (two lists of "host:port" strings) built from the --ps_hosts /
// --worker_hosts flags, from the TF_CONFIG environment variable (Kubeflow TFJob convention) or
// from a Slurm job step's environment (psflow/dist/slurm.h). It
// owns its strings; copies are independent. Pure logic, no networking. Immutable after construction,
// so concurrent reads from many threads are safe.
#ifndef PSFLOW_DIST_CLUSTER_H_
#define PSFLOW_DIST_CLUSTER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace psflow::dist {

// One task of the cluster. job is "ps" or "worker"; worker 0 is the chief.
struct TaskSpec {
  std::string job;
  int index = 0;

  bool operator==(const TaskSpec&) const = default;
};

class ClusterSpec {
 public:
  ClusterSpec() = default;  // the empty cluster: single-process training

  // Parses comma-separated "host:port" lists (IPv6 hosts in brackets: "[::1]:2222"); spaces around
  // items are ignored and an empty string is an empty list. Errors (one line naming the flag, the item
  // and the fix): malformed host:port (missing port, port not 1..65535, empty host), an empty item
  // (",,"), the same address twice anywhere in the cluster, workers given without any ps.
  static absl::StatusOr<ClusterSpec> FromHostLists(std::string_view ps_hosts, std::string_view worker_hosts);

  // Parses TF_CONFIG JSON:
  //   {"cluster": {"chief": ["h:p"], "worker": [...], "ps": [...]}, "task": {"type": "worker", "index": 1}}
  // A chief entry (at most one address) becomes worker 0 and the worker list follows it. Task type
  // "chief" (index 0) -> worker 0; "worker" index i -> worker i+1 when a chief exists, else worker i;
  // "ps" index i -> ps i. An "evaluator" list in the cluster is ignored (it is not part of the training
  // cluster); task type "evaluator" (index 0) gives an empty cluster and task {"evaluator", 0}
  // (the evaluator reads checkpoints, it joins no cluster); any other job is an error.
  static absl::StatusOr<std::pair<ClusterSpec, TaskSpec>> FromTfConfig(std::string_view json);

  const std::vector<std::string>& ps() const { return ps_; }
  const std::vector<std::string>& workers() const { return workers_; }
  int num_ps() const { return static_cast<int>(ps_.size()); }
  int num_workers() const { return static_cast<int>(workers_.size()); }

  // Address of a task. The task must pass Validate (CHECKed: calling this on an unchecked task is a
  // programmer error).
  const std::string& address(const TaskSpec& task) const;

  // The job must be "ps" or "worker" and the index in range; else an error such as
  // "--task_index=3 is out of range: --worker_hosts lists 2 workers (indices 0..1)".
  absl::Status Validate(const TaskSpec& task) const;

  // Canonical text "ps=a:1,b:2;worker=c:3" and its 64-bit FNV-1a fingerprint. Tasks compare
  // fingerprints on connect to check that every peer runs the same cluster description.
  std::string ToString() const;
  uint64_t Fingerprint() const;

  bool empty() const { return ps_.empty() && workers_.empty(); }

  bool operator==(const ClusterSpec&) const = default;

 private:
  std::vector<std::string> ps_;
  std::vector<std::string> workers_;
};

struct SlurmStep;  // psflow/dist/slurm.h

// Everything a task's cluster may come from: its flags and its environment.
struct ClusterSources {
  std::string_view ps_hosts, worker_hosts;  // --ps_hosts, --worker_hosts
  std::string_view job_name;                // --job_name ("" when not given)
  int task_index = 0;                       // --task_index
  std::string_view tf_config;               // $TF_CONFIG ("" when unset)
  const SlurmStep* slurm = nullptr;         // the Slurm step this process is a task of, if any
  std::string_view slurm_jobs;              // --slurm_jobs ("" = the default, ps:1 and the rest workers)
  int slurm_port_base = 8888;               // --slurm_port_base (kDefaultSlurmPortBase)
};

// Resolves the cluster and this task. Sources, in order:
//  - flags (ps_hosts / worker_hosts non-empty): job_name is then required and the task is validated;
//  - else the TF_CONFIG text (tf_config non-empty); job_name / task_index may be left at their
//    defaults ("" / 0) and, if given, must agree with TF_CONFIG's task;
//  - else the Slurm step (slurm non-null), when --slurm_jobs is given or the step has more than one
//    task (a one-task step, e.g. `srun --pty bash`, trains in one process); job_name / task_index
//    as for TF_CONFIG (ClusterFromSlurm, psflow/dist/slurm.h);
//  - else the empty cluster (single-process training); job_name must be "" or "worker" with index 0.
// Two sources given (flags and TF_CONFIG, or --slurm_jobs and either) is an error naming both;
// --slurm_jobs outside a Slurm step is an error. job_name "evaluator" (index 0) resolves to the
// empty cluster and task {"evaluator", 0} whatever the host flags say.
absl::StatusOr<std::pair<ClusterSpec, TaskSpec>> ResolveCluster(const ClusterSources& sources);
// The same without Slurm.
absl::StatusOr<std::pair<ClusterSpec, TaskSpec>> ResolveCluster(std::string_view ps_hosts,
                                                                std::string_view worker_hosts,
                                                                std::string_view job_name, int task_index,
                                                                std::string_view tf_config_env);

// True when the host part of "host:port" (or a bare host) is loopback: 127.0.0.0/8, "localhost",
// "::1" (also written "[::1]:port") or an IPv4-mapped 127.x address. Used to refuse listening on a
// non-loopback address without a cluster secret.
bool IsLoopbackHost(std::string_view host_port);

// Stable 64-bit FNV-1a hash of text (the same on every build and process, unlike absl::Hash).
uint64_t Fnv1a64(std::string_view text);

}  // namespace psflow::dist

#endif  // PSFLOW_DIST_CLUSTER_H_
