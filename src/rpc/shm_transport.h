// rpc/shm_transport.h — the shared-memory data plane for tasks on one host (--transport=shm).
//
// A ps started with shm ALSO listens (besides gRPC) on the Unix socket "@psflow-ps-<port>" in
// Linux's abstract namespace. A client connects, both ends check with SO_PEERCRED that the other
// runs as the same user, and the client proves the cluster secret in a handshake. Each connection
// has kSlots call slots; a slot owns a request region (made by the client) and a response region
// (made by the server), sealed memfds mapped by both, created or replaced by a larger one only when
// a message does not fit (the new fd travels with the packet announcing the call or the answer).
// A call: the client writes the request into its slot's region (the one copy), sends a small
// packet on the socket, and its connection's reader thread gets the answer's packet and hands the
// caller an IncomingMessage read in place from the response region. The socket is the doorbell
// (rather than futexes in the region) because it also tells each end at once when the other died:
// a killed ps closes it, and every call waiting on it fails Unavailable.
//
// A slot is reused only when both ends are done with it: the server answers only once the handler
// both responded and released the request (so a request is never overwritten while the ps reads
// it), and the client reuses a slot only once the caller released the answer.
//
// ShmChannel carries every call over shared memory while its shm connection is up, and over its
// gRPC fallback channel when no slot is free or the connection cannot be made (no shm listener,
// refused): while a ps is down its clients get gRPC's Unavailable and its explanations, and a ps
// that restarts is found again by both (shm retries connecting every 100 ms). Thread-safe.
#ifndef PSFLOW_RPC_SHM_TRANSPORT_H_
#define PSFLOW_RPC_SHM_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/transport.h"

namespace psflow::rpc {

// Concurrent calls one shm connection carries; more go over gRPC.
inline constexpr int kShmSlots = 8;

// The abstract socket name (leading NUL) of the ps listening on `port`.
std::string ShmSocketName(int port);

// "127.0.0.1:2222", "localhost:2222", "[::1]:2222": tasks that can share memory with this one.
bool IsLoopbackAddress(const std::string& address);

class ShmConnection;

class ShmChannel final : public ClientChannel {
 public:
  // `fallback` carries what shm does not (see above). `port` is the ps's port.
  ShmChannel(int port, std::string peer_name, TransportOptions security, std::unique_ptr<ClientChannel> fallback);
  ~ShmChannel() override;

  void Call(Method method, OutgoingMessage request, const CallOptions& options,
            std::function<void(absl::StatusOr<IncomingMessage>)> done) override;
  const std::string& peer_name() const override { return peer_name_; }

  // Calls carried over shared memory / over the fallback so far (for tests and benchmarks).
  int64_t shm_calls() const { return shm_calls_.load(); }
  int64_t fallback_calls() const { return fallback_calls_.load(); }
  // Why the last connection attempt failed ("" after a success).
  std::string last_connect_error() const;

 private:
  std::shared_ptr<ShmConnection> Connection();

  const int port_;
  const std::string peer_name_;
  const TransportOptions security_;
  const std::unique_ptr<ClientChannel> fallback_;
  std::atomic<int64_t> shm_calls_{0};
  std::atomic<int64_t> fallback_calls_{0};
  mutable absl::Mutex mu_;
  std::shared_ptr<ShmConnection> connection_ ABSL_GUARDED_BY(mu_);
  absl::Time next_attempt_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string last_connect_error_ ABSL_GUARDED_BY(mu_);
};

// The server side: accepts shm connections for a ps whose gRPC server listens on `port`.
class ShmServer {
 public:
  static absl::StatusOr<std::unique_ptr<ShmServer>> Start(int port, const TransportOptions& security, Handler* handler);
  ~ShmServer();
  // Stops accepting; after `grace_secs` (or when no call is pending) closes every connection,
  // failing their callers' pending calls Unavailable. Idempotent.
  void Shutdown(double grace_secs);
  ServerCounters counters() const;

  class Impl;

 private:
  explicit ShmServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_SHM_TRANSPORT_H_
