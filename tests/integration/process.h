// Test helper: run the psflow binary (or any program) as a child process with a time limit,
// capturing its output. Used by the integration tests that start real clusters on loopback.
#ifndef PSFLOW_TESTS_INTEGRATION_PROCESS_H_
#define PSFLOW_TESTS_INTEGRATION_PROCESS_H_

#include <string>
#include <vector>

namespace psflow::testing {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed; -1 when it had to be killed at the time limit
  bool timed_out = false;
  std::string output;  // stdout and stderr interleaved
};

class Process {
 public:
  // Starts `args[0]` with `args`, extra environment entries "K=V" added to ours.
  Process(const std::vector<std::string>& args, const std::vector<std::string>& env = {});
  ~Process();  // kills the child if it still runs
  // Waits up to `timeout_secs`; kills the child (SIGKILL) when the time is up.
  ProcessResult Wait(double timeout_secs);
  int pid() const { return pid_; }
  // What the child printed so far (stdout and stderr), while it runs.
  std::string OutputSoFar() const;

 private:
  int pid_ = -1;
  std::string output_path_;
  bool waited_ = false;
};

ProcessResult RunProcess(const std::vector<std::string>& args, double timeout_secs,
                         const std::vector<std::string>& env = {});

// The psflow binary under test: the build's own, or $PSFLOW_BINARY when set.
std::string PsflowBinary();
// $PSFLOW_SOURCE_DIR/data/mnist.
std::string MnistDir();
// A fresh empty temporary directory, removed when the test process exits unless a test failed (or
// PSFLOW_KEEP_TEST_DIRS is set).
std::string TempDir(const std::string& name);
// Free TCP ports on 127.0.0.1.
std::vector<int> FreePorts(int count);

}  // namespace psflow::testing

#endif  // PSFLOW_TESTS_INTEGRATION_PROCESS_H_
