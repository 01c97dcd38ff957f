// `psflow local`: starts N ps and M worker tasks as child processes on 127.0.0.1 with free ports,
// merges their output line by line with a task prefix ("[ps0] ", "[worker1] "), and waits. If a
// task fails (non-zero exit or a signal) it says which and how and stops the others; Ctrl-C (or
// SIGTERM) stops every task and says the run was interrupted. Returns the worst exit status (a
// signal counts as 128 + its number).
//
// The ps tasks are always this binary's `psflow train --job_name=ps`. The workers are either the
// same (`psflow local [flags]`) or, after `--`, any command (`psflow local [flags] -- python3
// train.py`), started with TF_CONFIG naming its task and PSFLOW_FLAGS (a JSON array of the train
// flags) that the psflow Python package applies as defaults. With `evaluator`, one more task
// ("[evaluator] ") evaluates the chief's checkpoints; it talks to no other task. Any earlier
// end-of-training marker in --checkpoint_dir is removed before the tasks start (a new run).
//
// Every child runs in its own process group with PR_SET_PDEATHSIG=SIGKILL, so none outlives the
// launcher, even when the launcher is killed with SIGKILL. RunLocalCluster is called once per
// process, from the main thread (the death signal follows the thread that forked).
#ifndef PSFLOW_CLI_LOCAL_CLUSTER_H_
#define PSFLOW_CLI_LOCAL_CLUSTER_H_

#include <string>
#include <vector>

namespace psflow::cli {

struct LocalClusterOptions {
  int num_ps = 1;
  int num_workers = 2;
  std::string binary;                    // path of the psflow binary to start
  std::vector<std::string> train_flags;  // forwarded to every task's `psflow train` (and PSFLOW_FLAGS)
  int metrics_port = 0;                  // > 0: task k (ps first, then workers) serves on metrics_port + k
  // Every task's compute threads (--intra_op_threads): also set as OMP_NUM_THREADS,
  // OPENBLAS_NUM_THREADS and MKL_NUM_THREADS in each child's environment, so that the libraries a
  // worker command computes with (torch's OpenMP pool, OpenBLAS) start with that many.
  int intra_op_threads = 1;
  // Non-empty: the workers run this command (argv[0] looked up in PATH) instead of `psflow train`.
  std::vector<std::string> worker_command;
  // Also start an evaluator task (programs/eval/evaluator.h) reading `checkpoint_dir`: `psflow train
  // --job_name=evaluator`, or the worker command with TF_CONFIG's task type "evaluator".
  bool evaluator = false;
  std::string checkpoint_dir;
};

int RunLocalCluster(const LocalClusterOptions& options);

// The TF_CONFIG of worker `index` of a cluster: {"cluster": {"ps": [...], "worker": [...]},
// "task": {"type": "worker", "index": index}}.
// `type` "evaluator" (index 0) names the evaluator task of that cluster instead.
std::string WorkerTfConfig(const std::vector<std::string>& ps, const std::vector<std::string>& workers, int index,
                           const std::string& type = "worker");

}  // namespace psflow::cli

#endif  // PSFLOW_CLI_LOCAL_CLUSTER_H_
