// Embedding rows end to end (rows per second end to end): one in-process ps task and
// one client, 4096 unique random ids of dim 64 per call on a fixed table of 2^18 rows (64 MiB),
// pulled (PsClient::Pull with a TableStep) or pushed with sgd (PushAndPull), over gRPC and over the
// shared-memory transport, beside a memcpy of the same bytes and a hand-written raw TCP peer doing
// the same exchange (a thread gathering or updating the same table, answering over a loopback
// socket: what a minimal hand-built ps costs) in the same run. items/s = rows/s.
//   build/bench/psflow_table_wire_bench --benchmark_min_time=1
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
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
  table.initializer = dist::TableInitializer::Uniform(-1, 1);
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

bool ReadAll(int fd, void* data, size_t n) {
  for (char* p = static_cast<char*>(data); n > 0;) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool WriteAll(int fd, const void* data, size_t n) {
  for (const char* p = static_cast<const char*>(data); n > 0;) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The raw TCP peer: a thread holding a [kRows, kDim] table. A request is [u8 op][u64 n][n ids]
// and, for a push, [n, kDim] gradient rows; a pull is answered with the n rows, a push (sgd
// applied) with one byte.
class RawTcpPeer {
 public:
  RawTcpPeer() : table_(static_cast<size_t>(kRows * kDim), 0.5f) {
    const int listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(listen_fd, 1);
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
    server_ = std::thread([this, listen_fd] { Serve(listen_fd); });
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawTcpPeer() {
    ::close(fd_);  // the server thread sees EOF
    server_.join();
  }
  bool connected() const { return connected_; }

  // One send per request (op, count, ids and, for a push, the rows), as a competent peer would.
  bool Call(uint8_t op, const std::vector<int64_t>& ids, float* rows) {
    const uint64_t n = ids.size();
    const size_t row_bytes = n * kDim * sizeof(float);
    request_.resize(1 + sizeof(n) + n * sizeof(int64_t) + (op == 0 ? 0 : row_bytes));
    char* p = request_.data();
    *p = static_cast<char>(op);
    std::memcpy(p + 1, &n, sizeof(n));
    std::memcpy(p + 1 + sizeof(n), ids.data(), n * sizeof(int64_t));
    if (op != 0) std::memcpy(p + 1 + sizeof(n) + n * sizeof(int64_t), rows, row_bytes);
    if (!WriteAll(fd_, request_.data(), request_.size())) return false;
    char ack = 0;
    return op == 0 ? ReadAll(fd_, rows, row_bytes) : ReadAll(fd_, &ack, 1);
  }

 private:
  void Serve(int listen_fd) {
    const int fd = ::accept(listen_fd, nullptr, nullptr);
    ::close(listen_fd);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<int64_t> ids;
    std::vector<float> rows;
    for (uint8_t op = 0;;) {
      uint64_t n = 0;
      if (!ReadAll(fd, &op, 1) || !ReadAll(fd, &n, sizeof(n)) || n > static_cast<uint64_t>(kRows)) break;
      ids.resize(n);
      rows.resize(n * kDim);
      if (!ReadAll(fd, ids.data(), n * sizeof(int64_t))) break;
      if (op == 0) {
        for (size_t i = 0; i < n; ++i) std::memcpy(&rows[i * kDim], &table_[ids[i] * kDim], kDim * sizeof(float));
        if (!WriteAll(fd, rows.data(), rows.size() * sizeof(float))) break;
      } else {
        if (!ReadAll(fd, rows.data(), rows.size() * sizeof(float))) break;
        for (size_t i = 0; i < n; ++i) {
          float* w = &table_[ids[i] * kDim];
          for (int64_t d = 0; d < kDim; ++d) w[d] -= 1e-6f * rows[i * kDim + d];
        }
        const char ack = 1;
        if (!WriteAll(fd, &ack, 1)) break;
      }
    }
    ::close(fd);
  }

  std::vector<float> table_;
  std::vector<char> request_;
  std::thread server_;
  int fd_ = -1;
  bool connected_ = false;
};

// range(0): 0 pull, 1 push; the same ids and bytes as BM_TableRowsEndToEnd.
void BM_TableRowsRawTcp(benchmark::State& state) {
  RawTcpPeer peer;
  if (!peer.connected()) {
    state.SkipWithError("could not connect to the raw TCP peer on 127.0.0.1");
    return;
  }
  std::mt19937_64 rng(1);
  std::vector<int64_t> all(static_cast<size_t>(kRows));
  for (int64_t i = 0; i < kRows; ++i) all[static_cast<size_t>(i)] = i;
  std::shuffle(all.begin(), all.end(), rng);
  const std::vector<int64_t> ids(all.begin(), all.begin() + kIds);
  std::vector<float> rows(static_cast<size_t>(kIds * kDim), 0.01f);
  for (auto _ : state) {
    if (!peer.Call(static_cast<uint8_t>(state.range(0)), ids, rows.data())) {
      state.SkipWithError("the raw TCP peer closed the connection");
      return;
    }
  }
  state.SetItemsProcessed(state.iterations() * kIds);
  state.SetBytesProcessed(state.iterations() * kIds * kDim * static_cast<int64_t>(sizeof(float)));
  state.SetLabel(state.range(0) == 0 ? "raw tcp pull" : "raw tcp push");
}
BENCHMARK(BM_TableRowsRawTcp)->Arg(0)->Arg(1)->UseRealTime();

}  // namespace
}  // namespace psflow::ps

BENCHMARK_MAIN();
