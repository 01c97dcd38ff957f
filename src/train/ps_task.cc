// A parameter-server task: serve the variables placed on it until the chief reports the end of
// training, then return so the process exits 0 (TF's server.join() never returned).
#include "absl/strings/str_cat.h"
#include "psflow/ps/ps_server.h"
#include "psflow/train/train.h"
#include "train/cluster_setup.h"

namespace psflow::train {

absl::Status RunParameterServer(const TrainOptions& options, const LogSink& log) {
  auto setup = SetUpTask(options);
  if (!setup.ok()) return setup.status();
  ps::PsServer::Options server_options;
  server_options.listen_address = setup->cluster.address(setup->task);
  server_options.task_index = setup->task.index;
  server_options.cluster = setup->cluster;
  server_options.security = setup->security;
  auto server = ps::PsServer::Start(server_options);
  if (!server.ok()) return server.status();
  log(absl::StrCat("ps task ", setup->task.index, " serving on ", server_options.listen_address));
  absl::Status status = (*server)->Wait();
  const ps::PsTaskStats stats = (*server)->Stats();
  log(absl::StrCat("ps task ", setup->task.index, " done at global step ", stats.global_step, ": ",
                   stats.num_params, " params, ", stats.bytes_in, " bytes in, ", stats.bytes_out, " bytes out"));
  return status;
}

}  // namespace psflow::train
