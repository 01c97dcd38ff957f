// rpc/transport.h (internal) — how ps tasks and workers exchange messages, independent of gRPC.
//
// A message is a small protobuf header (proto/psflow.proto) plus tensors that travel as raw
// little-endian float bytes: an OutgoingMessage borrows (or shares ownership of) the float memory
// it sends, and an IncomingMessage exposes the received bytes in place so the receiver copies them
// once, straight into its destination. The ps and the ps client only see these interfaces
// (ClientChannel, Handler, Server) and pick an implementation with MakeChannel / StartServer
// (--transport): gRPC (grpc_transport.cc and grpc_server.cc, also made directly by MakeGrpcChannel / StartGrpcServer)
// or, between tasks on one host, shared memory with gRPC beside it (shm_transport.h).
//
// Ownership: a ClientChannel and a Server are owned by their creator (std::unique_ptr). A Server
// borrows its Handler, which must outlive it. All classes here are thread-safe except
// IncomingMessage/OutgoingMessage, which are plain values (concurrent reads are fine).
#ifndef PSFLOW_RPC_TRANSPORT_H_
#define PSFLOW_RPC_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/psflow.pb.h"
#include "psflow/rpc/transport_options.h"
#include "rpc/tuning.h"
#include "rpc/wire_dtype.h"

namespace psflow::rpc {

// The RPCs of the ps service (proto/psflow.proto, service Ps).
enum class Method {
  kHello,
  kInitialize,
  kMarkInitialized,
  kWaitInitialized,
  kPull,
  kPush,
  kGoodbye,
  kShutdown,
  kStats,
  kLoadTable,
  kScanTable,
  kWorkQueue,
};
inline constexpr int kNumMethods = 12;
// "/psflow.wire.Ps/Push"
const std::string& MethodPath(Method method);
// "Push"
const std::string& MethodName(Method method);

// The default element type on the wire (TensorMeta.dtype). Dense tensors may also travel as
// "bfloat16" or "float16" (rpc/wire_dtype.h): the sender names the dtype in TensorMeta.dtype and
// the encoder rounds the floats; an IncomingMessage widens them back as it is read. Received
// tensors of any other dtype are refused.
inline constexpr char kWireDtype[] = "float32";

// One tensor to send. `data` must stay valid and unchanged until the call's completion callback
// runs (clients) or until `owner` is released (servers' responses); `owner` (may be null when the
// caller guarantees the lifetime itself) is kept alive for as long as the transport needs the bytes.
struct OutgoingTensor {
  // name, shape, sparse rows; dtype empty (the encoder writes kWireDtype) or "bfloat16" / "float16"
  // to send `data` rounded to that format (the encoder converts into a buffer of its own).
  wire::TensorMeta meta;
  const float* data = nullptr;
  int64_t num_floats = 0;
  std::shared_ptr<const void> owner;
};

// The bytes a tensor travels as: its own floats, or (dtype "bfloat16" / "float16") a converted copy
// that `owner` holds. Shared by the encoders of both transports.
struct WireBytes {
  const void* data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<const void> owner;  // the converted copy, or null (the tensor's own memory)
};
WireBytes ToWireBytes(const OutgoingTensor& tensor);

struct OutgoingMessage {
  std::string header;  // the serialized request or response proto of the method
  std::vector<OutgoingTensor> tensors;
  // Requests of a client of delta pulls (rpc/delta_pull.h) only: travels in the tensor list.
  wire::DeltaAnnouncement delta;

  // Convenience: serializes `header` into a message without tensors.
  static OutgoingMessage Of(const google::protobuf::MessageLite& header);
};

// A received message: the header and the tensors' bytes in place (e.g. in gRPC slices, which this
// object keeps referenced). Tensors are validated on construction: the dtype is float32 (or unset),
// sizes match shapes and rows, and the payload has exactly the announced number of bytes.
class IncomingMessage {
 public:
  // One piece of the payload: bytes that are contiguous in memory.
  struct Segment {
    const char* data;
    size_t size;
  };

  IncomingMessage() = default;
  // Validates and indexes a message whose header and payload are given as parsed parts (used by the
  // transports' decoders). `keepalive` owns the memory `payload` points into.
  static absl::StatusOr<IncomingMessage> Make(std::string header, wire::TensorList tensors,
                                              std::vector<Segment> payload, std::shared_ptr<const void> keepalive,
                                              int64_t wire_bytes);

  // Where a tensor lies in a message's payload.
  struct TensorPlace {
    WireDtype dtype = WireDtype::kFloat32;
    int64_t num_floats = 0;
    int64_t offset = 0;  // bytes from the payload's start
    int64_t end() const { return offset + num_floats * static_cast<int64_t>(WireDtypeBytes(dtype)); }
  };
  // The places of `tensors`' tensors, one after the other, each validated as Make validates them
  // (its dtype, dimensions and rows; with payload_bytes >= 0 also that it fits in that many bytes:
  // -1 for a payload still arriving). Unnamed dtypes are set to float32. InvalidArgument naming the
  // first defect.
  static absl::StatusOr<std::vector<TensorPlace>> PlaceTensors(wire::TensorList* tensors, int64_t payload_bytes);

  const std::string& header() const { return header_; }
  // Parses the header into `message`; InvalidArgument naming the type when it does not parse.
  absl::Status ParseHeader(google::protobuf::MessageLite* message) const;

  int num_tensors() const { return tensors_.tensors_size(); }
  const wire::TensorMeta& meta(int i) const { return tensors_.tensors(i); }
  int64_t num_floats(int i) const { return num_floats_[i]; }
  // The dtype tensor i travelled in (its values are read as float32 whatever it is).
  WireDtype dtype(int i) const { return dtypes_[i]; }
  // Bytes of the whole message on the wire (headers and payload).
  int64_t wire_bytes() const { return wire_bytes_; }
  // The sender's announcement as a client of delta pulls (client 0: none; rpc/delta_pull.h).
  const wire::DeltaAnnouncement& delta_announcement() const { return tensors_.delta(); }

  // This message with tensor k's values replaced, for each (k, values) of `replaced` (k
  // ascending, values->size() == num_floats(k)): those tensors read as float32 from `values`
  // (kept alive by the result), with dtype "float32" in their meta.
  IncomingMessage WithTensorsReplaced(
      const std::vector<std::pair<int, std::shared_ptr<const std::vector<float>>>>& replaced) const;

  // Copies tensor i's floats to dst[0, num_floats(i)).
  void CopyTo(int i, float* dst) const;
  // Copies tensor i's floats [first, first + count) to dst[0, count).
  void CopyRange(int i, int64_t first, int64_t count, float* dst) const;
  // Copies tensor i in consecutive blocks of `block` floats; block k goes to dst + k * stride
  // (assembles a shard split along an inner axis into the full tensor). block must divide
  // num_floats(i).
  void CopyStrided(int i, float* dst, int64_t block, int64_t stride) const;
  // dst[j] += tensor i's float j.
  void AddTo(int i, float* dst) const;
  // The index (from the tensor's start) of the first Inf or NaN among tensor i's floats
  // [first, first + count), or -1. Reads float32 bytes where they were received, whatever their
  // alignment (no bounce copy: the check is one pass over the bytes).
  int64_t FirstNonFinite(int i, int64_t first, int64_t count) const;
  // Records that tensor i's floats [0, n) are finite, found so by the transport while the message
  // arrived in chunks (rpc/chunked_message.h): FirstNonFinite then reads only the floats after them.
  void MarkFinitePrefix(int i, int64_t n);
  // Calls fn(run, first, n) over the tensor's floats [first, first + n) in order, with `run` a
  // properly aligned pointer valid only during the call (in place when the bytes are aligned and
  // contiguous, else through a small bounce buffer). Stops early and returns false when fn does.
  bool ForEachRun(int i, const std::function<bool(const float* run, int64_t first, int64_t n)>& fn) const;
  // The same over the tensor's floats [first, first + count) only (`first` in the callback still
  // counts from the start of the tensor), so ranges can be walked by several threads at once.
  bool ForEachRunInRange(int i, int64_t first, int64_t count,
                         const std::function<bool(const float* run, int64_t first, int64_t n)>& fn) const;
  // The same, but `run` points at n floats stored at any byte address (read them with memcpy or
  // a kernel that loads unaligned, e.g. Optimizer::ApplyFromBytes): float32 bytes are handed out
  // where they were received, with no bounce copy; only a float split across two received pieces
  // comes alone from a 4-byte copy. (16-bit tensors come widened, as from ForEachRunInRange.)
  bool ForEachByteRunInRange(int i, int64_t first, int64_t count,
                             const std::function<bool(const void* run, int64_t first, int64_t n)>& fn) const;

 private:
  template <typename Fn>
  void ForEachByteRange(int64_t begin, int64_t size, Fn&& fn) const;
  // ForEachRunInRange of a 16-bit tensor.
  bool ForEachWidenedRun(int i, int64_t first, int64_t count,
                         const std::function<bool(const float* run, int64_t first, int64_t n)>& fn) const;

  std::string header_;
  wire::TensorList tensors_;
  std::vector<int64_t> num_floats_;
  std::vector<int64_t> tensor_offsets_;  // byte offset of each tensor in the payload
  std::vector<WireDtype> dtypes_;
  std::vector<int64_t> finite_prefix_;  // per tensor, when known (MarkFinitePrefix); else empty
  std::vector<Segment> segments_;
  std::vector<int64_t> segment_starts_;  // payload offset of each segment
  std::shared_ptr<const void> keepalive_;
  int64_t wire_bytes_ = 0;
};

struct CallOptions {
  double timeout_secs = 30;
  // Data calls from worker to ps ("push" direction) and from ps to worker ("pull" direction) use
  // separate connections so the two directions do not queue behind each other.
  bool pull_direction = false;
  // Wait for the connection to come up instead of failing at once (used while connecting).
  bool wait_for_ready = false;
};

// A worker's connection to one ps task.
class ClientChannel {
 public:
  virtual ~ClientChannel() = default;
  // Starts a call; `done` runs exactly once, on a transport thread (the one completion thread
  // shared by all calls, or a helper thread: keep `done` short; inside a CompletionsHere, the
  // calling thread when the scope closes), after the response arrived (or
  // the call failed) AND the transport released the request's tensor memory. Errors name the peer
  // ("ps task 1 (127.0.0.1:2223): ..."), keep the transport's code and add the method.
  virtual void Call(Method method, OutgoingMessage request, const CallOptions& options,
                    std::function<void(absl::StatusOr<IncomingMessage>)> done) = 0;
  // Blocking convenience over Call.
  absl::StatusOr<IncomingMessage> CallBlocking(Method method, OutgoingMessage request, const CallOptions& options);
  virtual const std::string& peer_name() const = 0;
};

// Answers one call exactly once. Movable, not copyable; safe to keep past the call's cancellation
// (responding then does nothing). Destroying it without responding answers Internal.
class Responder {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual void Respond(absl::StatusOr<OutgoingMessage> response) = 0;
  };
  Responder() = default;
  explicit Responder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Responder(Responder&&) = default;
  Responder& operator=(Responder&&);
  ~Responder();

  void Respond(absl::StatusOr<OutgoingMessage> response);
  bool responded() const { return impl_ == nullptr; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The server side's application: the ps. Handle may respond inline or keep the Responder and
// respond later from any thread (long polls, sync quorums); it must not block for long.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual void Handle(Method method, IncomingMessage request, Responder responder) = 0;
};

struct ServerCounters {
  int64_t bytes_in = 0;   // request bytes received (headers and payload)
  int64_t bytes_out = 0;  // response bytes sent
  int64_t calls_unauthenticated = 0;
  int64_t calls_in_chunks = 0;  // calls whose request came in chunks (rpc/chunked_message.h)
};

class Server {
 public:
  virtual ~Server() = default;  // shuts down (cancelling pending calls after a short grace)
  virtual int port() const = 0;
  virtual ServerCounters counters() const = 0;
  // Stops accepting calls and cancels those still pending after `grace_secs`. Idempotent.
  virtual void Shutdown(double grace_secs) = 0;
};

// True on the transport's own threads, where completion callbacks run: blocking there on another
// call would wait for the very thread that must deliver its completion.
bool OnTransportThread();

// For a thread about to wait for the calls it starts. While a CompletionsHere is alive, the gRPC
// calls this thread starts (ClientChannel::Call) are completed on this thread: the destructor
// polls gRPC for them until every one has completed, running their `done` here (as on a transport
// thread: OnTransportThread() is true meanwhile), including calls that those callbacks start on
// this thread. The answers are then read by the thread that waits for them instead of by the
// transport's completion thread, which would have to wake the waiter: one thread wake-up less
// per round trip. Calls of other transports (shared memory) and calls started by other threads
// are not affected. Nestable (an inner scope's end completes the outer's calls too); not
// movable. Use it only where the thread would wait anyway: the destructor returns when the calls
// completed (each within its deadline). Never wait inside the scope for a call started in it: its
// answer is read only once the scope closes.
class CompletionsHere {
 public:
  CompletionsHere();
  ~CompletionsHere();
  CompletionsHere(const CompletionsHere&) = delete;
  CompletionsHere& operator=(const CompletionsHere&) = delete;
};

// gRPC client channel to `address` ("host:port"); `peer_name` prefixes error messages, e.g.
// "ps task 1 (127.0.0.1:2223)". Errors reading TLS files are returned here.
absl::StatusOr<std::unique_ptr<ClientChannel>> MakeGrpcChannel(const std::string& address, const std::string& peer_name,
                                                               const TransportOptions& security);

// gRPC server listening on `address` (port 0 = any free port) answering with `handler`
// (borrowed). Error naming the address when it cannot listen.
absl::StatusOr<std::unique_ptr<Server>> StartGrpcServer(const std::string& address, const TransportOptions& security,
                                                        Handler* handler);

// The transport `security.transport` asks for: MakeGrpcChannel / StartGrpcServer for "grpc"; for
// "shm", a channel to a loopback address that carries calls over shared memory when the ps serves
// it (else over gRPC), and a gRPC server that also serves shared memory. InvalidArgument naming --transport for another
// value. A channel for a 16-bit `wire_dtype` (--wire_dtype) is a client of delta pulls
// (rpc/delta_pull.h); a float32 one calls the transport directly. A server answers delta pulls to
// the clients that announce themselves, plainly to the others.
absl::StatusOr<std::unique_ptr<ClientChannel>> MakeChannel(const std::string& address, const std::string& peer_name,
                                                           const TransportOptions& security,
                                                           WireDtype wire_dtype = WireDtype::kFloat32);
absl::StatusOr<std::unique_ptr<Server>> StartServer(const std::string& address, const TransportOptions& security,
                                                    Handler* handler);

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_TRANSPORT_H_
