// Embedding rows end to end (rows per second end to end): one in-process ps task and
// one client, 4096 unique random ids of dim 64 per call on a fixed table of 2^18 rows (64 MiB),
// pulled (PsClient::Pull with a TableStep) or pushed with sgd (PushAndPull), over gRPC and over the
// shared-memory transport, beside a memcpy of the same bytes in the same run. items/s = rows/s.
//   build/bench/psflow_table_wire_bench --benchmark_min_time=1
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "psflow/dist/partition.h"
#include "psflow/ps/ps_client.h"
#include "psflow/ps/ps_server.h"

namespace psflow::ps {
namespace {

constexpr int64_t kRows = int64_t{1} << 18;
constexpr int64_t kDim = 64;
constexpr int64_t kIds = 4096;

struct Rig {
  std::unique_ptr<PsServer> server;
  std::unique_ptr<PsClient> client;
  std::vector<int64_t> ids;
};

std::unique_ptr<Rig> StartRig(const std::string& transport) {
  auto rig = std::make_unique<Rig>();
  rpc::TransportOptions options;
  options.transport = transport;
  PsServer::Options so;
  so.listen_address = "127.0.0.1:0";
  so.security = options;
  so.log = [](const std::string&) {};
  auto server = PsServer::Start(so);
  if (!server.ok()) return nullptr;
  rig->server = *std::move(server);
  auto cluster = dist::ClusterSpec::FromHostLists(absl::StrCat("127.0.0.1:", rig->server->port()), "127.0.0.1:1");
  if (!cluster.ok()) return nullptr;
  dist::PlacementPlan plan = dist::PlanPlacement({{"w", {1}}}, {}, dist::PlacementStrategy::kRoundRobin, 1);
  dist::TableSpec table;
  table.name = "emb";
  table.dim = kDim;
  table.num_embeddings = kRows;
  table.initializer = "uniform:-1:1";
  if (!dist::PlanTables({table}, {}, dist::PlacementStrategy::kRoundRobin, &plan).ok()) return nullptr;
  PsClient::Options co;
  co.cluster = *cluster;
  co.plan = plan;
  co.security = options;
  co.log = [](const std::string&) {};
  auto client = PsClient::Create(co);
  if (!client.ok() || !(*client)->Connect().ok()) return nullptr;
  rig->client = *std::move(client);
  TrainingConfig config;
  config.optimizer.name = "sgd";
  config.optimizer.learning_rate = 1e-6f;
  const Tensor w({1}, 0.0f);
  if (!rig->client->Initialize({{"w", &w}}, config).ok()) return nullptr;
  std::mt19937_64 rng(1);
  std::vector<int64_t> all(static_cast<size_t>(kRows));
  for (int64_t i = 0; i < kRows; ++i) all[static_cast<size_t>(i)] = i;
  std::shuffle(all.begin(), all.end(), rng);
  rig->ids.assign(all.begin(), all.begin() + kIds);
  return rig;
}

// range(0): 0 gRPC, 1 shared memory; range(1): 0 pull, 1 push.
void BM_TableRowsEndToEnd(benchmark::State& state) {
  const std::string transport = state.range(0) == 0 ? "grpc" : "shm";
  auto rig = StartRig(transport);
  if (rig == nullptr) {
    state.SkipWithError("could not start the ps and client");
    return;
  }
  Tensor rows({kIds, kDim}, 0.01f);
  TableStep step;
  if (state.range(1) == 0) {
    step.pulls.push_back({"emb", &rig->ids, &rows, nullptr});
  } else {
    step.pushes.push_back({"emb", &rig->ids, nullptr, &rows});
  }
  int64_t tag = 0;
  for (auto _ : state) {
    absl::Status s = state.range(1) == 0 ? rig->client->Pull({}, step).status()
                                         : rig->client->PushAndPull({}, tag++, {}, step).status();
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
  }
  state.SetItemsProcessed(state.iterations() * kIds);
  state.SetBytesProcessed(state.iterations() * kIds * kDim * static_cast<int64_t>(sizeof(float)));
  state.SetLabel(absl::StrCat(transport, state.range(1) == 0 ? " pull" : " push"));
}
BENCHMARK(BM_TableRowsEndToEnd)->ArgsProduct({{0, 1}, {0, 1}})->UseRealTime();

// The same rows' bytes copied once (a contiguous block).
void BM_TableRowsMemcpy(benchmark::State& state) {
  std::vector<float> from(static_cast<size_t>(kIds * kDim), 1.0f), to(from.size());
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), from.size() * sizeof(float));
    benchmark::DoNotOptimize(to.data());
  }
  state.SetItemsProcessed(state.iterations() * kIds);
  state.SetBytesProcessed(state.iterations() * kIds * kDim * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_TableRowsMemcpy)->UseRealTime();

}  // namespace
}  // namespace psflow::ps

BENCHMARK_MAIN();
