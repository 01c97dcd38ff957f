// The gRPC implementation of ClientChannel and Server, on gRPC's generic asynchronous
// (completion-queue) API, so requests and responses are raw byte buffers (tensor_coding.h) and
// psflow's own threads poll the queues: a request is read, handled and answered on the thread that
// polled it, with no hand-off to another executor. (The callback API costs thread hops: measured
// on loopback with 4 KiB calls, a callback server switches threads about 7 times per call against
// 1.2 here, a callback client 4.3-5.5 times against 3.2, and each round trip takes 45-64 us against
// 42 us; gRPC 1.51's callback machinery can also crash when every channel is destroyed and a new
// one created, which tests and the benchmark do.)
//
// Who polls on the client. gRPC 1.51 (epoll1) has one epoll set per process, polled by one thread
// at a time among all threads waiting in any completion queue; an answer read by one thread for
// another's queue costs a wake-up of the other. So a thread that will wait for its calls polls for
// them itself (CompletionsHere: a queue of its own), and the shared completion thread polls only
// while calls started outside such a scope are in flight (otherwise it would hold the epoll set and
// wake the waiting thread on every answer). When idle it looks at the connections once a second,
// without blocking, so that keepalive pings' answers are read between calls.
//
// Client call lifecycle: Call() creates a ClientCall that owns the context and the response
// buffer and keeps itself alive until its completion tag comes back on the process-wide client
// queue. Every zero-copy slice of the request holds a ReleaseGuard; the user's `done` runs only
// when both the response arrived and the guard is gone (gRPC no longer reads the caller's
// memory). When the guard goes last — inside gRPC's write path — `done` is handed to a small
// thread of our own rather than run there. The gRPC call itself (context and reader) is destroyed
// as soon as its completion arrives, before waiting for the guard: the call holds its stream, the
// stream keeps a broken transport alive, and that transport holds the request's slices, so keeping
// the call until the guard goes would wait forever once a peer is killed mid-call.
//
// A large Push goes as chunks on one stream (rpc/chunked_message.h, kChunkedPushPath): the client
// writes chunk k + 1 when chunk k's write completed (so they stay in order, each handed to the
// transport whole), the server reads and checks each as it arrives and hands the handler the
// reassembled message once the stream ends, as if it had come in one piece.
//
// The server: grpc_server.cc.
#include <grpc/support/time.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/check.h"
#include "rpc/chunked_message.h"
#include "rpc/grpc_common.h"
#include "rpc/grpc_options.h"
#include "rpc/spin_wait.h"
#include "rpc/tensor_coding.h"

namespace psflow::rpc {
namespace grpc_internal {

// The next event of `cq` (false: the queue is shut down and drained). The thread first polls
// without blocking for a while (rpc/spin_wait.h), then parks.
thread_local SpinWait t_spin;
bool NextEvent(grpc::CompletionQueue* cq, void** tag, bool* ok) {
  grpc::CompletionQueue::NextStatus status = grpc::CompletionQueue::TIMEOUT;
  const bool polled = t_spin.Spin(
      [&] {
        status = cq->AsyncNext(tag, ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
        return status != grpc::CompletionQueue::TIMEOUT;
      },
      [] { return absl::Now(); });
  if (polled) return status == grpc::CompletionQueue::GOT_EVENT;
  return cq->Next(tag, ok);
}

std::chrono::system_clock::time_point DeadlineAfter(double secs) {
  // Clamp so "effectively forever" timeouts do not overflow the clock.
  const double clamped = std::min(std::max(secs, 0.0), 1e7);
  return std::chrono::system_clock::now() + std::chrono::microseconds(static_cast<int64_t>(clamped * 1e6));
}

}  // namespace grpc_internal

namespace {

using grpc_internal::DeadlineAfter;
using grpc_internal::kChunkedPushPath;
using grpc_internal::NextEvent;

// How often the idle completion thread reads what arrived on the connections (pings' answers).
constexpr absl::Duration kIdleLookEvery = absl::Seconds(1);

// Runs closures on a thread of its own. Process-wide and never destroyed: closures may be posted
// from gRPC threads until the process exits.
class DeferredRunner {
 public:
  static DeferredRunner& Get() {
    static DeferredRunner* runner = new DeferredRunner();
    return *runner;
  }
  void Post(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }

 private:
  DeferredRunner() {
    std::thread([this] {
      MarkTransportThread();
      for (;;) {
        std::function<void()> fn;
        {
          absl::MutexLock lock(&mu_);
          mu_.Await(absl::Condition(this, &DeferredRunner::HasWork));
          fn = std::move(queue_.front());
          queue_.pop_front();
        }
        fn();
      }
    }).detach();
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty(); }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------------
// Client

// The completion queue of the client calls started outside a CompletionsHere, polled by one
// thread that runs their completions while any is in flight. Never destroyed (calls may complete
// until the process exits).
class ClientQueue {
 public:
  static ClientQueue& Get() {
    static ClientQueue* queue = new ClientQueue();
    return *queue;
  }
  // For a call about to be started on the queue: its completion thread polls until it completes.
  grpc::CompletionQueue* StartCall() {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    return &cq_;
  }
  grpc::CompletionQueue* queue() { return &cq_; }
  // A call found `channel` not connected: poll, blocking, until it is (or until its owner lets it
  // go), even with no call in flight. gRPC makes a connection's progress (TCP connect, TLS
  // handshake, HTTP/2 settings, reconnects between a caller's retries) only while some thread
  // polls, and its own backup poller looks every 5 s: idle, a refused TLS handshake ended as "tcp
  // handshaker shutdown" or "timed out before receiving SETTINGS frame" instead of its cause. Once
  // every channel is connected the thread stays out again (a second poller costs each call a
  // wake-up: CompletionsHere).
  void PollWhileConnecting(const std::shared_ptr<grpc::Channel>& channel) {
    absl::MutexLock lock(&mu_);
    if (std::find(connecting_.begin(), connecting_.end(), channel) == connecting_.end()) connecting_.push_back(channel);
  }

 private:
  ClientQueue();
  void Poll();
  // Drops the channels now connected, or held by nothing but this list.
  void ForgetConnected() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::erase_if(connecting_, [](const std::shared_ptr<grpc::Channel>& c) {
      return c.use_count() == 1 || c->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
    });
  }
  bool Busy() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ > 0 || !connecting_.empty(); }

  grpc::CompletionQueue cq_;
  absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // calls whose completion tag gRPC still holds
  std::vector<std::shared_ptr<grpc::Channel>> connecting_ ABSL_GUARDED_BY(mu_);
};

// The queue of the calls one thread starts inside CompletionsHere scopes, polled by that thread
// when a scope closes. Created on the thread's first such call.
struct ThreadQueue {
  grpc::CompletionQueue cq;
  int64_t in_flight = 0;  // calls whose completion tag gRPC still holds
  ~ThreadQueue() {
    cq.Shutdown();  // every call completed before its scope closed: nothing is left to drain
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
  }
};
thread_local int t_completions_here = 0;  // open CompletionsHere scopes on this thread
thread_local std::unique_ptr<ThreadQueue> t_queue;

// The queue a call started now completes on: this thread's inside a CompletionsHere on a connected
// channel, else the shared one. A call on a channel still connecting goes through the shared queue,
// whose thread then polls while the connection is made (PollWhileConnecting): a connect is no
// round trip worth saving a wake-up on, and its errors must be gRPC's own account of the cause.
grpc::CompletionQueue* QueueForNewCall(const std::shared_ptr<grpc::Channel>& channel) {
  if (channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
    ClientQueue::Get().PollWhileConnecting(channel);
    return ClientQueue::Get().StartCall();
  }
  if (t_completions_here == 0) return ClientQueue::Get().StartCall();
  if (t_queue == nullptr) t_queue = std::make_unique<ThreadQueue>();
  ++t_queue->in_flight;
  return &t_queue->cq;
}

// Sent, without waiting for a connection, after a call that waited for one timed out: it fails at
// once with the connection's last error (refused, TLS handshake failed...), which the timed-out
// call's own status does not carry. A method no server has, so a probe that does get through is
// answered UNIMPLEMENTED before any authentication and changes nothing.
const char kConnectProbePath[] = "/psflow.wire.Ps/ConnectProbe";
constexpr double kConnectProbeSecs = 2;

struct ClientCall;
// A completion tag on a client queue: one operation of a call.
struct ClientOp {
  enum Kind { kFinish, kWrite, kRead };
  ClientCall* call;
  Kind kind;
};

// Counts one more operation on `cq`, a queue QueueForNewCall returned (on the thread that polls it,
// for a thread's own queue).
void CountOp(grpc::CompletionQueue* cq);

struct ClientCall {
  std::shared_ptr<grpc::Channel> channel;  // kept alive while the call runs
  std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
  grpc::ByteBuffer response;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> rpc;  // lives in the context's call arena
  std::shared_ptr<ClientCall> self;                             // held while gRPC owns the completion tag
  std::atomic<int> pending{2};                                  // the response, and the release of the request's memory
  bool wait_for_ready = false;
  std::function<void(absl::StatusOr<IncomingMessage>)> done;
  // Rewrites a failure for the caller; `connect_error` is the probe's account of the connection.
  std::function<absl::Status(const grpc::Status&, const std::string& connect_error)> describe_error;
  std::shared_ptr<ClientCall> probed;  // on a connect probe: the call whose failure it explains
  ClientOp ops[3] = {{this, ClientOp::kFinish}, {this, ClientOp::kWrite}, {this, ClientOp::kRead}};
  // A call in chunks: its stream, the chunks not yet written, and its operations in flight.
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream;
  grpc::CompletionQueue* cq = nullptr;
  std::vector<grpc::ByteBuffer> chunks;
  size_t next_chunk = 0;
  std::atomic<int> ops_out{0};
  bool finish_done = false;  // the stream's Finish came back (touched by the queue's poller only)

  // The completion arrived: gRPC no longer needs the call (only, perhaps, the request's slices).
  void ReleaseGrpcCall() {
    rpc.reset();  // arena-allocated: must go before the context that owns the arena
    stream.reset();
    context.reset();
  }
  // Starts the stream of a call in chunks: its first chunk written, then the answer asked for
  // (last: once it is asked for, the call may end on the poller's thread at any time).
  void StartStream() {
    stream->StartCall(nullptr);  // corked (see Call): no operation of its own
    WriteNextChunk();
    Issue();
    stream->Read(&response, &ops[ClientOp::kRead]);
  }
  // Counts an operation about to be started: QueueForNewCall counted the first on the queue.
  void Issue() {
    ops_out.fetch_add(1, std::memory_order_relaxed);
    if (first_op_counted) CountOp(cq);
    first_op_counted = true;
  }
  bool first_op_counted = false;
  void WriteNextChunk() {
    grpc::ByteBuffer chunk = std::move(chunks[next_chunk]);
    const bool last = ++next_chunk == chunks.size();
    Issue();
    if (last) {
      stream->WriteLast(chunk, grpc::WriteOptions(), &ops[ClientOp::kWrite]);
    } else {
      stream->Write(chunk, &ops[ClientOp::kWrite]);
    }
  }
  // An operation of the stream came back (on the poller of its queue).
  void OnStreamOp(ClientOp::Kind kind, bool ok) {
    switch (kind) {
      case ClientOp::kWrite:  // the next chunk follows the one gRPC took; none after a broken stream
        if (ok && next_chunk < chunks.size()) WriteNextChunk();
        break;
      case ClientOp::kRead:  // the answer, or none (the call failed): its status next
        Issue();
        stream->Finish(&status, &ops[ClientOp::kFinish]);
        break;
      case ClientOp::kFinish:
        finish_done = true;
        break;
    }
    if (ops_out.fetch_sub(1, std::memory_order_acq_rel) != 1 || !finish_done) return;
    chunks.clear();  // the chunks never written (the call failed): their slices go
    ReleaseGrpcCall();
    Arrive(std::move(self), /*from_guard=*/false);
  }
  static void Complete(std::shared_ptr<ClientCall> call) {
    if (call->probed != nullptr) {
      const std::shared_ptr<ClientCall>& failed = call->probed;
      const bool explains = call->status.error_code() == grpc::StatusCode::UNAVAILABLE;
      return failed->done(failed->describe_error(failed->status, explains ? call->status.error_message() : ""));
    }
    if (call->status.ok()) return call->done(DecodeMessage(call->response));
    if (call->wait_for_ready && call->status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        call->channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
      return StartConnectProbe(std::move(call));
    }
    call->done(call->describe_error(call->status, ""));
  }
  static void StartConnectProbe(std::shared_ptr<ClientCall> failed) {
    auto probe = std::make_shared<ClientCall>();
    probe->channel = failed->channel;
    probe->probed = std::move(failed);
    probe->pending = 1;  // no request memory to wait for
    probe->context->set_deadline(std::chrono::system_clock::now() +
                                 std::chrono::milliseconds(static_cast<int>(kConnectProbeSecs * 1000)));
    grpc::GenericStub stub(probe->channel);
    probe->rpc = stub.PrepareUnaryCall(probe->context.get(), kConnectProbePath, EncodeMessage(OutgoingMessage()),
                                       QueueForNewCall(probe->channel));
    probe->self = probe;
    probe->rpc->StartCall();
    probe->rpc->Finish(&probe->response, &probe->status, &probe->ops[ClientOp::kFinish]);
  }
  // One of the two events happened: the completion (on a poller thread) or the release of the
  // request's memory (anywhere, possibly inside gRPC's write path).
  static void Arrive(std::shared_ptr<ClientCall> call, bool from_guard) {
    if (call->pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (!from_guard) return Complete(std::move(call));
    // Inside gRPC's write path neither user code nor new calls may run, nor may the call's
    // context be destroyed: finish on our own thread.
    DeferredRunner::Get().Post([call = std::move(call)]() mutable { Complete(std::move(call)); });
  }
};

// A call's completion tag came back from gRPC (on whichever thread polled its queue).
void CompleteTag(void* tag, bool ok) {
  const ClientOp* op = static_cast<const ClientOp*>(tag);
  ClientCall* call = op->call;
  if (call->stream != nullptr) return call->OnStreamOp(op->kind, ok);
  call->ReleaseGrpcCall();
  ClientCall::Arrive(std::move(call->self), /*from_guard=*/false);
}

void CountOp(grpc::CompletionQueue* cq) {
  if (cq == ClientQueue::Get().queue()) {
    ClientQueue::Get().StartCall();
  } else {
    ++t_queue->in_flight;  // this thread's own queue, polled by it alone
  }
}

ClientQueue::ClientQueue() {
  std::thread([this] { Poll(); }).detach();
}

void ClientQueue::Poll() {
  MarkTransportThread();
  for (;;) {
    bool calls = false, connecting = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(this, &ClientQueue::Busy), kIdleLookEvery);
      ForgetConnected();
      calls = in_flight_ > 0;
      connecting = !connecting_.empty();
    }
    void* tag = nullptr;
    bool ok = false;
    if (calls) {
      if (!cq_.Next(&tag, &ok)) return;
    } else if (connecting) {  // no call of ours in flight: block a while, then look at the state again
      const auto until = std::chrono::system_clock::now() + std::chrono::milliseconds(100);
      if (cq_.AsyncNext(&tag, &ok, until) != grpc::CompletionQueue::GOT_EVENT) continue;
    } else if (cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::now()) != grpc::CompletionQueue::GOT_EVENT) {
      continue;  // idle: read what the connections received, block nowhere
    }
    CompleteTag(tag, ok);
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }
}

// Destroyed when the last zero-copy slice of a request is released. It is never the call's last
// owner while gRPC still runs the call (`self` is), so the call is not destroyed in gRPC's write
// path; when it arrives last, the deferred closure owns the call.
class ReleaseGuard {
 public:
  explicit ReleaseGuard(std::shared_ptr<ClientCall> call) : call_(std::move(call)) {}
  ReleaseGuard(const ReleaseGuard&) = delete;
  ReleaseGuard& operator=(const ReleaseGuard&) = delete;
  ~ReleaseGuard() { ClientCall::Arrive(std::move(call_), /*from_guard=*/true); }

 private:
  std::shared_ptr<ClientCall> call_;
};

class GrpcChannel final : public ClientChannel {
 public:
  GrpcChannel(std::string address, std::string peer_name, std::string secret, ClientTls tls,
              std::shared_ptr<grpc::ChannelCredentials> credentials, int64_t max_message_bytes)
      : address_(std::move(address)),
        peer_name_(std::move(peer_name)),
        secret_(std::move(secret)),
        tls_(tls),
        max_message_bytes_(max_message_bytes) {
    for (int d = 0; d < 2; ++d) {
      auto channel = grpc::CreateCustomChannel(address_, credentials,
                                               TunedChannelArguments(d == 0 ? "push" : "pull", max_message_bytes));
      stubs_[d] = std::make_unique<grpc::GenericStub>(channel);
      channels_[d] = std::move(channel);
    }
  }

  void Call(Method method, OutgoingMessage request, const CallOptions& options,
            std::function<void(absl::StatusOr<IncomingMessage>)> done) override {
    auto call = std::make_shared<ClientCall>();
    call->done = std::move(done);
    call->channel = channels_[options.pull_direction ? 1 : 0];
    call->wait_for_ready = options.wait_for_ready;
    call->context->set_deadline(DeadlineAfter(options.timeout_secs));
    call->context->set_wait_for_ready(options.wait_for_ready);
    if (!secret_.empty()) call->context->AddMetadata(kTokenMetadataKey, secret_);
    grpc::GenericStub& stub = *stubs_[options.pull_direction ? 1 : 0];
    std::optional<int64_t> whole_bytes;  // of a message sent in chunks
    {
      auto guard = std::make_shared<ReleaseGuard>(call);
      const grpc::ByteBuffer buffer = EncodeMessage(std::move(request), guard);
      guard.reset();  // from here on only the request's slices hold the guard
      if (InChunks(method, buffer, options)) {
        call->chunks = CutIntoChunks(buffer, kChunkBytes);
        call->cq = QueueForNewCall(call->channel);
        // The call's metadata goes with its first chunk (and needs no write of its own, which
        // would have to complete before the first chunk's could start).
        call->context->set_initial_metadata_corked(true);
        call->stream = stub.PrepareCall(call->context.get(), kChunkedPushPath, call->cq);
        whole_bytes = static_cast<int64_t>(buffer.Length());  // an error about one chunk is said of all
      } else {
        call->rpc =
            stub.PrepareUnaryCall(call->context.get(), MethodPath(method), buffer, QueueForNewCall(call->channel));
      }
    }  // the call holds its own reference to the request's slices
    call->describe_error = [peer = peer_name_, method, timeout = options.timeout_secs, tls = tls_, whole_bytes](
                               const grpc::Status& s, const std::string& connect_error) {
      return DescribeError(peer, method, timeout, tls, s, connect_error, whole_bytes);
    };
    call->self = call;
    if (call->stream != nullptr) return call->StartStream();
    call->rpc->StartCall();
    call->rpc->Finish(&call->response, &call->status, &call->ops[ClientOp::kFinish]);
  }

  const std::string& peer_name() const override { return peer_name_; }

 private:
  // A Push this large goes in chunks on one stream (rpc/chunked_message.h); one over this side's
  // limit goes whole, for gRPC to refuse as any other.
  bool InChunks(Method method, const grpc::ByteBuffer& buffer, const CallOptions& options) const {
    const size_t bytes = buffer.Length();
    return method == Method::kPush && !options.wait_for_ready && bytes >= kChunkedMinBytes &&
           static_cast<int64_t>(bytes) <= max_message_bytes_;
  }
  // `message_bytes`: the whole message's size, for a call that sent it in pieces (else nullopt).
  static absl::Status DescribeError(const std::string& peer, Method method, double timeout_secs, ClientTls tls,
                                    const grpc::Status& s, const std::string& connect_error,
                                    std::optional<int64_t> message_bytes) {
    const absl::StatusCode code = static_cast<absl::StatusCode>(s.error_code());
    if (std::optional<absl::Status> too_large = DescribeMessageTooLarge(s, peer, MethodName(method), message_bytes)) {
      return *std::move(too_large);
    }
    if (code == absl::StatusCode::kDeadlineExceeded) {
      // The deadline is --rpc_timeout_secs plus the call's bytes at 1 MiB/s (src/ps/client/call_deadline.h).
      const std::string waited =
          absl::StrCat(peer, ": ", MethodName(method), " got no answer within ", absl::SixDigits(timeout_secs), " s");
      if (connect_error.empty()) {
        return absl::DeadlineExceededError(
            absl::StrCat(waited, " (", s.error_message(), "; deadline: --rpc_timeout_secs + its size)"));
      }
      return absl::DeadlineExceededError(
          absl::StrCat(waited, ": connecting fails: ", DescribeConnectFailure(connect_error, tls)));
    }
    if (code == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(absl::StrCat(peer, ": ", MethodName(method), " could not reach the task: ",
                                                 DescribeConnectFailure(s.error_message(), tls)));
    }
    return absl::Status(code, absl::StrCat(peer, ": ", s.error_message()));
  }

  const std::string address_;
  const std::string peer_name_;
  const std::string secret_;
  const ClientTls tls_;
  const int64_t max_message_bytes_;
  std::shared_ptr<grpc::Channel> channels_[2];  // [0] push + control, [1] pull
  std::unique_ptr<grpc::GenericStub> stubs_[2];
};

}  // namespace

CompletionsHere::CompletionsHere() { ++t_completions_here; }

CompletionsHere::~CompletionsHere() {
  --t_completions_here;
  if (t_queue == nullptr || t_queue->in_flight == 0) return;
  const bool was_transport_thread = SetTransportThread(true);  // the callbacks must not block
  while (t_queue->in_flight > 0) {
    void* tag = nullptr;
    bool ok = false;
    CHECK(NextEvent(&t_queue->cq, &tag, &ok)) << "a thread's call queue shut down with calls in flight";
    --t_queue->in_flight;
    CompleteTag(tag, ok);  // may start calls of its own on this thread: they are waited for too
  }
  SetTransportThread(was_transport_thread);
}

absl::StatusOr<std::unique_ptr<ClientChannel>> MakeGrpcChannel(const std::string& address, const std::string& peer_name,
                                                               const TransportOptions& security) {
  InstallGrpcLogFilter();
  if (absl::Status s = CheckMaxMessageBytes(security.max_message_bytes); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = MakeChannelCredentials(security);
  if (!creds.ok()) return creds.status();
  return std::unique_ptr<ClientChannel>(new GrpcChannel(address, peer_name, security.secret, ClientTlsOf(security),
                                                        *std::move(creds), security.max_message_bytes));
}

}  // namespace psflow::rpc
