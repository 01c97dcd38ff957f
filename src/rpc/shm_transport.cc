// The client side of the shared-memory transport (ShmChannel, ShmConnection) and the transport
// factories MakeChannel / StartServer (shm_transport.h, transport.h).
//
// Client call lifecycle: Call() claims a free slot of the channel's connection, writes the request
// into the slot's request region, stores `done` in the slot and sends the call's packet. The
// connection's reader thread (one per connection, detached, holding the connection alive) waits
// for answer packets, and at most 100 ms at a time so it also fails calls past their deadline
// (the slot stays reserved until the late answer comes, then is freed unread). An answer is
// handed to `done` as an IncomingMessage whose keepalive frees the slot when the caller drops it.
// When the socket ends (the ps died or shut down) every pending call fails Unavailable and the
// connection is dead: the next call connects anew, or goes over gRPC while no ps listens.
#include "rpc/shm_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "rpc/delta_pull.h"
#include "rpc/shm_wire.h"
#include "rpc/tensor_coding.h"

namespace psflow::rpc {

using shm::Packet;
using shm::PacketKind;
using shm::Region;
using shm::WaitReadable;

inline constexpr uint64_t kShmProtocolVersion = 1;

namespace {

thread_local bool t_shm_reader = false;

constexpr double kHandshakeSecs = 2;
constexpr int kReaderTickMs = 100;  // deadline checks while waiting for answers
constexpr size_t kMinRegionBytes = 64 << 10;

}  // namespace

std::string ShmSocketName(int port) { return absl::StrCat(std::string(1, '\0'), "psflow-ps-", port); }

bool IsLoopbackAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string host = address.substr(0, colon);
  return host == "localhost" || host == "[::1]" || host == "::1" || absl::StartsWith(host, "127.");
}

// One shm connection to a ps: the socket, the slots, and the reader thread.
class ShmConnection : public std::enable_shared_from_this<ShmConnection> {
 public:
  enum class Outcome { kStarted, kNoSlot, kDead };

  static absl::StatusOr<std::shared_ptr<ShmConnection>> Connect(int port, const std::string& peer_name,
                                                                const TransportOptions& security) {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
    auto connection = std::shared_ptr<ShmConnection>(new ShmConnection(fd, peer_name, security.max_message_bytes));
    const std::string name = ShmSocketName(port);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, name.data(), name.size());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
      return absl::UnavailableError(
          absl::StrCat("no shared-memory listener @", name.substr(1), ": ", std::strerror(errno)));
    }
    // Whoever took the name first gets the secret: make sure it is one of ours.
    ucred peer{};
    socklen_t peer_len = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 || peer.uid != geteuid()) {
      return absl::PermissionDeniedError(absl::StrCat("shared-memory listener @", name.substr(1), " runs as uid ",
                                                      peer.uid, ", not this task's uid ", geteuid()));
    }
    Packet hello;
    hello.kind = PacketKind::kHello;
    hello.size = kShmProtocolVersion;
    if (absl::Status s = shm::SendPacket(fd, hello, security.secret, -1); !s.ok()) return s;
    if (!WaitReadable(fd, kHandshakeSecs)) {
      return absl::UnavailableError(
          absl::StrCat("shared-memory handshake got no answer within ", kHandshakeSecs, " s"));
    }
    absl::StatusOr<shm::ReceivedPacket> welcome = shm::ReceivePacket(fd);
    if (!welcome.ok()) return welcome.status();
    if (welcome->fd >= 0) close(welcome->fd);
    if (welcome->packet.kind != PacketKind::kWelcome) {
      return absl::InternalError("shared-memory handshake: unexpected packet");
    }
    if (welcome->packet.code != 0) {
      return absl::Status(static_cast<absl::StatusCode>(welcome->packet.code), welcome->text);
    }
    std::thread([connection] {
      t_shm_reader = true;
      MarkTransportThread();
      connection->ReaderLoop();
    }).detach();
    return connection;
  }

  ~ShmConnection() { close(fd_); }

  // Starts `request` in a free slot. kNoSlot / kDead leave `request` and `done` untouched.
  Outcome TryCall(Method method, OutgoingMessage& request, const CallOptions& options,
                  std::function<void(absl::StatusOr<IncomingMessage>)>& done) {
    int s = -1;
    {
      absl::MutexLock lock(&mu_);
      if (dead_) return Outcome::kDead;
      for (int i = 0; i < kShmSlots && s < 0; ++i) {
        if (slots_[i].state == State::kFree) s = i;
      }
      if (s < 0) return Outcome::kNoSlot;
      slots_[s].state = State::kBusy;  // reserved: its request region is this thread's now
    }
    const shm::PreparedMessage prepared = shm::Prepare(request);
    if (static_cast<int64_t>(prepared.total_bytes) > max_message_bytes_) {
      Free(s);
      return Outcome::kNoSlot;  // gRPC refuses it with its usual message
    }
    std::shared_ptr<Region>& region = request_regions_[s];
    int new_fd = -1;
    if (region == nullptr || region->size() < prepared.total_bytes) {
      absl::StatusOr<std::shared_ptr<Region>> grown =
          Region::Create(std::max(kMinRegionBytes, prepared.total_bytes + prepared.total_bytes / 4));
      if (!grown.ok()) {
        Free(s);
        return Outcome::kNoSlot;
      }
      region = *std::move(grown);
      new_fd = region->fd();
    }
    shm::WriteMessage(prepared, region->data());
    request = OutgoingMessage();  // the caller's tensor memory is released before `done` can run
    {
      absl::MutexLock lock(&mu_);
      if (dead_) {  // the reader failed every call before this one was registered
        slots_[s].state = State::kFree;
        return Outcome::kDead;
      }
      Slot& slot = slots_[s];
      slot.method = method;
      slot.timeout_secs = options.timeout_secs;
      slot.deadline = absl::Now() + absl::Seconds(std::min(std::max(options.timeout_secs, 0.0), 1e7));
      slot.done = std::move(done);
    }
    Packet call;
    call.kind = PacketKind::kCall;
    call.slot = static_cast<uint32_t>(s);
    call.method = static_cast<uint32_t>(method);
    call.size = prepared.total_bytes;
    absl::Status sent;
    {
      absl::MutexLock lock(&send_mu_);
      sent = shm::SendPacket(fd_, call, "", new_fd);
    }
    // The reader sees the socket end and fails this call with the others.
    if (!sent.ok()) shutdown(fd_, SHUT_RDWR);
    return Outcome::kStarted;
  }

  bool dead() const {
    absl::MutexLock lock(&mu_);
    return dead_;
  }

  // Ends the connection (pending calls fail Unavailable) and waits for the reader to finish.
  void Close() {
    shutdown(fd_, SHUT_RDWR);
    if (!t_shm_reader) reader_done_.WaitForNotification();
  }

 private:
  enum class State { kFree, kBusy, kAbandoned, kHeld };
  struct Slot {
    State state = State::kFree;
    Method method = Method::kHello;
    double timeout_secs = 0;
    absl::Time deadline;
    std::function<void(absl::StatusOr<IncomingMessage>)> done;
  };

  // Keeps an answer's slot (and its region) until the caller drops the IncomingMessage.
  class AnswerLease {
   public:
    AnswerLease(std::shared_ptr<ShmConnection> connection, std::shared_ptr<Region> region, int slot)
        : connection_(std::move(connection)), region_(std::move(region)), slot_(slot) {}
    AnswerLease(const AnswerLease&) = delete;
    AnswerLease& operator=(const AnswerLease&) = delete;
    ~AnswerLease() { connection_->Free(slot_); }

   private:
    std::shared_ptr<ShmConnection> connection_;
    std::shared_ptr<Region> region_;
    int slot_;
  };

  ShmConnection(int fd, std::string peer_name, int64_t max_message_bytes)
      : fd_(fd), peer_name_(std::move(peer_name)), max_message_bytes_(max_message_bytes) {}

  void Free(int s) {
    absl::MutexLock lock(&mu_);
    slots_[s].state = State::kFree;
  }

  void ReaderLoop() {
    absl::Status ended;
    for (;;) {
      if (WaitReadable(fd_, kReaderTickMs / 1000.0)) {
        absl::StatusOr<shm::ReceivedPacket> packet = shm::ReceivePacket(fd_);
        if (!packet.ok()) {
          ended = packet.status();
          break;
        }
        if (absl::Status s = OnAnswer(*std::move(packet)); !s.ok()) {
          ended = s;
          break;
        }
      }
      FailExpired();
    }
    std::vector<std::pair<Method, std::function<void(absl::StatusOr<IncomingMessage>)>>> failed;
    {
      absl::MutexLock lock(&mu_);
      dead_ = true;
      for (Slot& slot : slots_) {
        if (slot.state == State::kBusy && slot.done) failed.emplace_back(slot.method, std::move(slot.done));
        slot.done = nullptr;
      }
    }
    for (auto& [method, done] : failed) {
      done(absl::UnavailableError(absl::StrCat(peer_name_, ": ", MethodName(method), " could not reach the task: ",
                                               ended.message(), " (did the task exit or restart?)")));
    }
    reader_done_.Notify();
  }

  absl::Status OnAnswer(shm::ReceivedPacket packet) {
    const Packet& p = packet.packet;
    if (p.kind != PacketKind::kReply || p.slot >= kShmSlots) {
      if (packet.fd >= 0) close(packet.fd);
      return absl::InternalError("unexpected packet from the ps");
    }
    const int s = static_cast<int>(p.slot);
    if (packet.fd >= 0) {
      absl::StatusOr<std::shared_ptr<Region>> region = Region::Adopt(packet.fd);
      if (!region.ok()) return region.status();
      response_regions_[s] = *std::move(region);  // only this thread touches response regions
    }
    std::function<void(absl::StatusOr<IncomingMessage>)> done;
    Method method;
    {
      absl::MutexLock lock(&mu_);
      Slot& slot = slots_[s];
      if (slot.state == State::kAbandoned) {
        slot.state = State::kFree;
        return absl::OkStatus();
      }
      if (slot.state != State::kBusy) return absl::InternalError("answer for a slot without a call");
      done = std::move(slot.done);
      slot.done = nullptr;
      method = slot.method;
      slot.state = p.code == 0 ? State::kHeld : State::kFree;
    }
    if (p.code != 0) {
      done(absl::Status(static_cast<absl::StatusCode>(p.code), absl::StrCat(peer_name_, ": ", packet.text)));
      return absl::OkStatus();
    }
    const std::shared_ptr<Region>& region = response_regions_[s];
    if (region == nullptr || p.size > region->size()) {
      Free(s);
      done(absl::InternalError(absl::StrCat(peer_name_, ": ", MethodName(method), " answer overruns its region")));
      return absl::InternalError("answer overruns its region");
    }
    auto lease = std::make_shared<AnswerLease>(shared_from_this(), region, s);
    absl::StatusOr<IncomingMessage> answer = shm::ReadMessage(region->data(), p.size, std::move(lease));
    if (!answer.ok()) {
      answer = absl::Status(answer.status().code(), absl::StrCat(peer_name_, ": ", answer.status().message()));
    }
    done(std::move(answer));
    return absl::OkStatus();
  }

  void FailExpired() {
    struct Expired {
      Method method;
      double timeout_secs;
      std::function<void(absl::StatusOr<IncomingMessage>)> done;
    };
    std::vector<Expired> expired;
    const absl::Time now = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      for (Slot& slot : slots_) {
        if (slot.state != State::kBusy || !slot.done || slot.deadline > now) continue;
        slot.state = State::kAbandoned;  // until the late answer frees it
        expired.push_back({slot.method, slot.timeout_secs, std::move(slot.done)});
        slot.done = nullptr;
      }
    }
    for (Expired& e : expired) {
      e.done(absl::DeadlineExceededError(absl::StrCat(peer_name_, ": ", MethodName(e.method), " got no answer within ",
                                                      absl::SixDigits(e.timeout_secs),
                                                      " s (--rpc_timeout_secs + its size; shared memory)")));
    }
  }

  const int fd_;
  const std::string peer_name_;
  const int64_t max_message_bytes_;
  absl::Mutex send_mu_;  // one sender at a time keeps a packet and its fd together
  mutable absl::Mutex mu_;
  Slot slots_[kShmSlots] ABSL_GUARDED_BY(mu_);
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  // A slot's request region is touched only by the thread that reserved the slot; response
  // regions only by the reader thread (and read by callers through their leases).
  std::shared_ptr<Region> request_regions_[kShmSlots];
  std::shared_ptr<Region> response_regions_[kShmSlots];
  absl::Notification reader_done_;
};

ShmChannel::ShmChannel(int port, std::string peer_name, TransportOptions security,
                       std::unique_ptr<ClientChannel> fallback)
    : port_(port), peer_name_(std::move(peer_name)), security_(std::move(security)), fallback_(std::move(fallback)) {}

ShmChannel::~ShmChannel() {
  std::shared_ptr<ShmConnection> connection;
  {
    absl::MutexLock lock(&mu_);
    connection = std::move(connection_);
  }
  if (connection != nullptr) connection->Close();
}

std::string ShmChannel::last_connect_error() const {
  absl::MutexLock lock(&mu_);
  return last_connect_error_;
}

std::shared_ptr<ShmConnection> ShmChannel::Connection() {
  absl::MutexLock lock(&mu_);
  if (connection_ != nullptr && !connection_->dead()) return connection_;
  connection_ = nullptr;  // its reader already failed its calls and exits on its own
  const absl::Time now = absl::Now();
  if (now < next_attempt_) return nullptr;
  absl::StatusOr<std::shared_ptr<ShmConnection>> connected = ShmConnection::Connect(port_, peer_name_, security_);
  if (!connected.ok()) {
    // Nothing listening costs one failed connect(): retry soon. A refusal (secret, user) would
    // be refused again: retry rarely (gRPC then reports it on every call).
    next_attempt_ = now + (absl::IsUnavailable(connected.status()) ? absl::Milliseconds(100) : absl::Seconds(5));
    last_connect_error_ = std::string(connected.status().message());
    return nullptr;
  }
  last_connect_error_.clear();
  connection_ = *std::move(connected);
  return connection_;
}

void ShmChannel::Call(Method method, OutgoingMessage request, const CallOptions& options,
                      std::function<void(absl::StatusOr<IncomingMessage>)> done) {
  // Every method goes over shm while connected: after a ps restarts, the shm connection is back
  // within 100 ms while gRPC's channel may still wait out its reconnect back-off, and a control
  // call (the chief's Initialize) failing there would end the job.
  for (int attempt = 0; attempt < 2; ++attempt) {  // a dead connection is replaced once
    std::shared_ptr<ShmConnection> connection = Connection();
    if (connection == nullptr) break;
    const ShmConnection::Outcome outcome = connection->TryCall(method, request, options, done);
    if (outcome == ShmConnection::Outcome::kStarted) {
      shm_calls_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (outcome == ShmConnection::Outcome::kNoSlot) break;
  }
  fallback_calls_.fetch_add(1, std::memory_order_relaxed);
  fallback_->Call(method, std::move(request), options, std::move(done));
}

// ---------------------------------------------------------------------------------------------
// Factories

namespace {

absl::Status CheckTransport(const std::string& transport) {
  if (transport == "grpc" || transport == "shm") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--transport=", transport, " is not a transport: use grpc or shm"));
}

// The gRPC server, and the shm server beside it on the same port.
class CombinedServer final : public Server {
 public:
  CombinedServer(std::unique_ptr<Server> grpc, std::unique_ptr<ShmServer> shm)
      : grpc_(std::move(grpc)), shm_(std::move(shm)) {}
  ~CombinedServer() override { Shutdown(1.0); }

  int port() const override { return grpc_->port(); }
  ServerCounters counters() const override {
    ServerCounters a = grpc_->counters();
    const ServerCounters b = shm_->counters();
    a.bytes_in += b.bytes_in;
    a.bytes_out += b.bytes_out;
    a.calls_unauthenticated += b.calls_unauthenticated;
    return a;
  }
  void Shutdown(double grace_secs) override {
    // Both graces run at once.
    std::thread shm_shutdown([this, grace_secs] { shm_->Shutdown(grace_secs); });
    grpc_->Shutdown(grace_secs);
    shm_shutdown.join();
  }

 private:
  std::unique_ptr<Server> grpc_;
  std::unique_ptr<ShmServer> shm_;
};

// A server and the handler (delta pulls around the caller's) it answers with: the server goes first.
class HandlerOwningServer final : public Server {
 public:
  HandlerOwningServer(std::unique_ptr<Handler> handler, std::unique_ptr<Server> server)
      : handler_(std::move(handler)), server_(std::move(server)) {}
  int port() const override { return server_->port(); }
  ServerCounters counters() const override { return server_->counters(); }
  void Shutdown(double grace_secs) override { server_->Shutdown(grace_secs); }

 private:
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<Server> server_;  // declared last: destroyed (shut down) first
};

absl::StatusOr<std::unique_ptr<ClientChannel>> MakeTransportChannel(const std::string& address,
                                                                    const std::string& peer_name,
                                                                    const TransportOptions& security) {
  absl::StatusOr<std::unique_ptr<ClientChannel>> grpc = MakeGrpcChannel(address, peer_name, security);
  if (!grpc.ok() || security.transport != "shm" || !IsLoopbackAddress(address)) return grpc;
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) return grpc;
  return std::unique_ptr<ClientChannel>(new ShmChannel(port, peer_name, security, *std::move(grpc)));
}

absl::StatusOr<std::unique_ptr<Server>> StartTransportServer(const std::string& address,
                                                             const TransportOptions& security, Handler* handler) {
  absl::StatusOr<std::unique_ptr<Server>> grpc = StartGrpcServer(address, security, handler);
  if (!grpc.ok() || security.transport != "shm") return grpc;
  absl::StatusOr<std::unique_ptr<ShmServer>> shm = ShmServer::Start((*grpc)->port(), security, handler);
  if (!shm.ok()) return shm.status();
  return std::unique_ptr<Server>(new CombinedServer(*std::move(grpc), *std::move(shm)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClientChannel>> MakeChannel(const std::string& address, const std::string& peer_name,
                                                           const TransportOptions& security, WireDtype wire_dtype) {
  if (absl::Status s = CheckTransport(security.transport); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<ClientChannel>> channel = MakeTransportChannel(address, peer_name, security);
  if (!channel.ok() || wire_dtype == WireDtype::kFloat32) return channel;
  return std::unique_ptr<ClientChannel>(new DeltaChannel(*std::move(channel)));
}

absl::StatusOr<std::unique_ptr<Server>> StartServer(const std::string& address, const TransportOptions& security,
                                                    Handler* handler) {
  if (absl::Status s = CheckTransport(security.transport); !s.ok()) return s;
  auto delta = std::make_unique<DeltaHandler>(handler);
  absl::StatusOr<std::unique_ptr<Server>> server = StartTransportServer(address, security, delta.get());
  if (!server.ok()) return server.status();
  return std::unique_ptr<Server>(new HandlerOwningServer(std::move(delta), *std::move(server)));
}

}  // namespace psflow::rpc
