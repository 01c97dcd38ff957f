// `psflow local`: starts N ps and M worker tasks of this same binary as child processes on
// 127.0.0.1 with free ports, merges their output line by line with a task prefix ("[ps0] ",
// "[worker1] "), and waits. If a task fails (non-zero exit or a signal) it says which and how and
// stops the others. Returns the worst exit status (a signal counts as 128 + its number).
#ifndef PSFLOW_CLI_LOCAL_CLUSTER_H_
#define PSFLOW_CLI_LOCAL_CLUSTER_H_

#include <string>
#include <vector>

namespace psflow::cli {

struct LocalClusterOptions {
  int num_ps = 1;
  int num_workers = 2;
  std::string binary;                    // path of the psflow binary to start
  std::vector<std::string> train_flags;  // forwarded to every task's `psflow train`
  int metrics_port = 0;                  // > 0: task k (ps first, then workers) serves on metrics_port + k
};

int RunLocalCluster(const LocalClusterOptions& options);

}  // namespace psflow::cli

#endif  // PSFLOW_CLI_LOCAL_CLUSTER_H_
