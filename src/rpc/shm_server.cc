// The server side of the shared-memory transport (ShmServer in shm_transport.h).
//
// An acceptor thread takes connections on the abstract socket, refuses other users (SO_PEERCRED),
// and gives each connection a thread that checks the handshake (version, cluster secret) and then
// reads call packets: it maps a request region passed along, decodes the request in place and hands
// it to the Handler. A ServerCall is answered once both the Responder responded (writing the answer
// into the slot's response region, replaced by a larger one when it does not fit) and the handler
// released the request (its IncomingMessage's keepalive): only then may the client reuse the slot.
// Responders may answer from any thread, late, or after the connection closed (then nothing is sent).
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/call_responder.h"
#include "rpc/grpc_options.h"  // SecretsEqual
#include "rpc/shm_transport.h"
#include "rpc/shm_wire.h"

namespace psflow::rpc {

using shm::Packet;
using shm::PacketKind;
using shm::Region;
using shm::WaitReadable;

namespace {

constexpr uint64_t kProtocolVersion = 1;  // ShmConnection's kShmProtocolVersion
constexpr double kHandshakeSecs = 5;
constexpr size_t kMinRegionBytes = 64 << 10;

struct Counters {
  std::atomic<int64_t> bytes_in{0};
  std::atomic<int64_t> bytes_out{0};
  std::atomic<int64_t> calls_unauthenticated{0};
};

struct ServerConfig {
  Handler* handler;
  std::string secret;
  int64_t max_message_bytes;
  std::shared_ptr<Counters> counters;
};

class ServerConnection;

// One call from its arrival to its answer.
class ServerCall {
 public:
  ServerCall(std::shared_ptr<ServerConnection> connection, int slot, Method method)
      : connection_(std::move(connection)), slot_(slot), method_(method) {}
  void Respond(absl::StatusOr<OutgoingMessage> response);
  // Called twice: when the Responder responded and when the request was released.
  void Arrive();

 private:
  std::shared_ptr<ServerConnection> connection_;
  const int slot_;
  const Method method_;
  std::atomic<int> pending_{2};
  Packet reply_;
  std::string text_;
  std::shared_ptr<Region> new_region_;  // sent along when the answer needed a larger region
};

// The keepalive of a request's IncomingMessage.
class RequestLease {
 public:
  RequestLease(std::shared_ptr<ServerCall> call, std::shared_ptr<Region> region)
      : call_(std::move(call)), region_(std::move(region)) {}
  RequestLease(const RequestLease&) = delete;
  RequestLease& operator=(const RequestLease&) = delete;
  ~RequestLease() { call_->Arrive(); }

 private:
  std::shared_ptr<ServerCall> call_;
  std::shared_ptr<Region> region_;
};

class ServerConnection : public std::enable_shared_from_this<ServerConnection> {
 public:
  ServerConnection(int fd, const ServerConfig& config) : fd_(fd), config_(config) {}
  ~ServerConnection() { close(fd_); }

  void Start() {
    thread_ = std::thread([self = shared_from_this()] { self->Run(); });
  }
  // Ends the connection (the client's pending calls fail Unavailable) and waits for its thread.
  void Close() {
    closed_.store(true);
    shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
  }
  bool finished() const { return finished_.load(); }
  int pending_calls() const { return pending_calls_.load(); }

  // The answer's region for `slot`, at least `bytes` large; sets *grown when it had to be made.
  absl::StatusOr<std::shared_ptr<Region>> ResponseRegion(int slot, size_t bytes, bool* grown) {
    // Only the one call in the slot touches it (the client sends the next only after this answer).
    std::shared_ptr<Region>& region = response_regions_[slot];
    *grown = false;
    if (region == nullptr || region->size() < bytes) {
      absl::StatusOr<std::shared_ptr<Region>> made = Region::Create(std::max(kMinRegionBytes, bytes + bytes / 4));
      if (!made.ok()) return made.status();
      region = *std::move(made);
      *grown = true;
    }
    return region;
  }

  void SendReply(int slot, const Packet& reply, const std::string& text, const Region* new_region) {
    busy_[slot].store(false);
    if (!closed_.load()) {
      absl::MutexLock lock(&send_mu_);
      // A failed send means the client is gone; the reading thread notices too.
      (void)shm::SendPacket(fd_, reply, text, new_region != nullptr ? new_region->fd() : -1);
    }
    pending_calls_.fetch_sub(1);
  }

  const ServerConfig& config() const { return config_; }

 private:
  void Run() {
    if (Handshake()) Serve();
    closed_.store(true);
    shutdown(fd_, SHUT_RDWR);
    finished_.store(true);
  }

  bool Handshake() {
    if (!WaitReadable(fd_, kHandshakeSecs)) return false;
    absl::StatusOr<shm::ReceivedPacket> hello = shm::ReceivePacket(fd_);
    if (!hello.ok()) return false;
    if (hello->fd >= 0) close(hello->fd);
    Packet welcome;
    welcome.kind = PacketKind::kWelcome;
    std::string refusal;
    if (hello->packet.kind != PacketKind::kHello || hello->packet.size != kProtocolVersion) {
      welcome.code = static_cast<int32_t>(absl::StatusCode::kFailedPrecondition);
      refusal = "refused shared-memory connection: another psflow version (use the same build on every task)";
    } else if (!config_.secret.empty() && !SecretsEqual(hello->text, config_.secret)) {
      config_.counters->calls_unauthenticated.fetch_add(1);
      welcome.code = static_cast<int32_t>(absl::StatusCode::kUnauthenticated);
      refusal = absl::StrCat("refused shared-memory connection: ", hello->text.empty() ? "no" : "wrong",
                             " cluster secret (start every task with the same --cluster_secret_file)");
    }
    return shm::SendPacket(fd_, welcome, refusal, -1).ok() && welcome.code == 0;
  }

  void Serve() {
    for (;;) {
      absl::StatusOr<shm::ReceivedPacket> packet = shm::ReceivePacket(fd_);
      if (!packet.ok()) return;
      const Packet& p = packet->packet;
      if (p.kind != PacketKind::kCall || p.slot >= kShmSlots || p.method >= kNumMethods) {
        if (packet->fd >= 0) close(packet->fd);
        return;  // not our protocol: drop the connection
      }
      const int slot = static_cast<int>(p.slot);
      if (packet->fd >= 0) {
        absl::StatusOr<std::shared_ptr<Region>> region = Region::Adopt(packet->fd);
        if (!region.ok()) return;
        request_regions_[slot] = *std::move(region);
      }
      const std::shared_ptr<Region>& region = request_regions_[slot];
      if (region == nullptr || p.size > region->size() || busy_[slot].exchange(true)) return;
      pending_calls_.fetch_add(1);
      config_.counters->bytes_in.fetch_add(static_cast<int64_t>(p.size), std::memory_order_relaxed);
      const Method method = static_cast<Method>(p.method);
      auto call = std::make_shared<ServerCall>(shared_from_this(), slot, method);
      Responder responder(std::make_unique<CallResponder<ServerCall>>(call));
      if (static_cast<int64_t>(p.size) > config_.max_message_bytes) {
        call->Arrive();  // no request to release
        responder.Respond(absl::ResourceExhaustedError(absl::StrCat(
            "refused ", MethodName(method), ": request of ", p.size, " bytes exceeds this task's limit of ",
            config_.max_message_bytes, " bytes (raise --max_message_mb on every task)")));
        continue;
      }
      absl::StatusOr<IncomingMessage> request =
          shm::ReadMessage(region->data(), p.size, std::make_shared<RequestLease>(call, region));
      if (!request.ok()) {
        responder.Respond(absl::Status(request.status().code(),
                                       absl::StrCat("refused ", MethodName(method), ": ", request.status().message())));
        continue;
      }
      config_.handler->Handle(method, *std::move(request), std::move(responder));
    }
  }

  const int fd_;
  const ServerConfig config_;
  std::thread thread_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> finished_{false};
  std::atomic<int> pending_calls_{0};
  std::atomic<bool> busy_[kShmSlots] = {};
  absl::Mutex send_mu_;                                  // one sender at a time keeps a packet and its fd together
  std::shared_ptr<Region> request_regions_[kShmSlots];   // the connection's thread only
  std::shared_ptr<Region> response_regions_[kShmSlots];  // the slot's current call only
};

void ServerCall::Respond(absl::StatusOr<OutgoingMessage> response) {
  reply_.kind = PacketKind::kReply;
  reply_.slot = static_cast<uint32_t>(slot_);
  reply_.method = static_cast<uint32_t>(method_);
  if (response.ok()) {
    const shm::PreparedMessage prepared = shm::Prepare(*response);
    const int64_t limit = connection_->config().max_message_bytes;
    if (static_cast<int64_t>(prepared.total_bytes) > limit) {
      response = absl::ResourceExhaustedError(absl::StrCat(MethodName(method_), " answer of ", prepared.total_bytes,
                                                           " bytes exceeds the limit of ", limit,
                                                           " bytes (raise --max_message_mb on every task)"));
    } else {
      bool grown = false;
      absl::StatusOr<std::shared_ptr<Region>> region = connection_->ResponseRegion(slot_, prepared.total_bytes, &grown);
      if (!region.ok()) {
        response = region.status();
      } else {
        shm::WriteMessage(prepared, (*region)->data());
        if (grown) new_region_ = *region;
        reply_.size = prepared.total_bytes;
        connection_->config().counters->bytes_out.fetch_add(static_cast<int64_t>(prepared.total_bytes),
                                                            std::memory_order_relaxed);
      }
    }
  }
  if (!response.ok()) {
    reply_.code = static_cast<int32_t>(response.status().code());
    text_ = std::string(response.status().message());
    reply_.size = 0;
  }
  Arrive();
}

void ServerCall::Arrive() {
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  connection_->SendReply(slot_, reply_, text_, new_region_.get());
}

}  // namespace

class ShmServer::Impl {
 public:
  Impl(const TransportOptions& security, Handler* handler)
      : config_{handler, security.secret, security.max_message_bytes, std::make_shared<Counters>()} {}

  ~Impl() { Shutdown(1.0); }

  absl::Status Listen(int port) {
    const std::string name = ShmSocketName(port);
    listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    wake_fd_ = eventfd(0, EFD_CLOEXEC);
    if (listen_fd_ < 0 || wake_fd_ < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, name.data(), name.size());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    if (bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), len) != 0 || listen(listen_fd_, 64) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on the shared-memory socket @", name.substr(1), ": ", std::strerror(errno),
                       errno == EADDRINUSE ? " (another ps on this host serves shared memory for this port)" : ""));
    }
    acceptor_ = std::thread([this] { AcceptLoop(); });
    return absl::OkStatus();
  }

  void Shutdown(double grace_secs) {
    absl::MutexLock lock(&shutdown_mu_);
    if (acceptor_.joinable()) {
      const uint64_t one = 1;
      (void)write(wake_fd_, &one, sizeof(one));
      acceptor_.join();
    }
    std::vector<std::shared_ptr<ServerConnection>> connections;
    {
      absl::MutexLock lock(&mu_);
      connections.swap(connections_);
    }
    const auto give_up = std::chrono::steady_clock::now() +
                         std::chrono::microseconds(static_cast<int64_t>(std::max(grace_secs, 0.0) * 1e6));
    for (const auto& c : connections) {
      while (c->pending_calls() > 0 && !c->finished() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    for (const auto& c : connections) c->Close();
    if (listen_fd_ >= 0) close(listen_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    listen_fd_ = wake_fd_ = -1;
  }

  ServerCounters counters() const {
    ServerCounters c;
    c.bytes_in = config_.counters->bytes_in.load();
    c.bytes_out = config_.counters->bytes_out.load();
    c.calls_unauthenticated = config_.counters->calls_unauthenticated.load();
    return c;
  }

 private:
  void AcceptLoop() {
    for (;;) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ucred peer{};
      socklen_t peer_len = sizeof(peer);
      if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 || peer.uid != geteuid()) {
        config_.counters->calls_unauthenticated.fetch_add(1);
        Packet refusal;
        refusal.kind = PacketKind::kWelcome;
        refusal.code = static_cast<int32_t>(absl::StatusCode::kPermissionDenied);
        (void)shm::SendPacket(fd, refusal, "refused shared-memory connection from another user", -1);
        close(fd);
        continue;
      }
      auto connection = std::make_shared<ServerConnection>(fd, config_);
      connection->Start();
      absl::MutexLock lock(&mu_);
      // Forget connections whose client left (restarted workers reconnect).
      std::vector<std::shared_ptr<ServerConnection>> live;
      for (auto& c : connections_) {
        if (c->finished()) {
          c->Close();
        } else {
          live.push_back(std::move(c));
        }
      }
      live.push_back(std::move(connection));
      connections_.swap(live);
    }
  }

  const ServerConfig config_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread acceptor_;
  absl::Mutex shutdown_mu_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<ServerConnection>> connections_ ABSL_GUARDED_BY(mu_);
};

ShmServer::ShmServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShmServer::~ShmServer() = default;

absl::StatusOr<std::unique_ptr<ShmServer>> ShmServer::Start(int port, const TransportOptions& security,
                                                            Handler* handler) {
  auto impl = std::make_unique<Impl>(security, handler);
  if (absl::Status s = impl->Listen(port); !s.ok()) return s;
  return std::unique_ptr<ShmServer>(new ShmServer(std::move(impl)));
}

void ShmServer::Shutdown(double grace_secs) { impl_->Shutdown(grace_secs); }
ServerCounters ShmServer::counters() const { return impl_->counters(); }

}  // namespace psflow::rpc
