// The gRPC server (rpc/transport.h: StartGrpcServer) on gRPC's generic asynchronous API: the
// queue thread that reads a request runs the handler on it (grpc_transport.cc says why).
//
// Server call lifecycle: a ServerCall is requested on one of the server's queues; it keeps itself
// alive (self_) while gRPC holds any of its tags, and Responders share ownership, so an answer
// given late — from another thread, after a sync quorum or initialization — finds it alive, and an
// answer after cancellation is dropped. A Push in chunks (rpc/chunked_message.h) is read chunk by
// chunk on its stream and handed to the handler whole once the stream ends.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "rpc/call_responder.h"
#include "rpc/chunked_message.h"
#include "rpc/grpc_common.h"
#include "rpc/grpc_options.h"
#include "rpc/tensor_coding.h"

namespace psflow::rpc {
namespace {

using grpc_internal::DeadlineAfter;
using grpc_internal::kChunkedPushPath;
using grpc_internal::NextEvent;

// One thread per queue: with several threads polling, every event costs a hand-over between them
// (measured: +70 us per call on loopback). Heavy work in handlers and completions spreads itself
// over the intra-op threads (ParallelFor) instead.
constexpr int kServerPollThreads = 1;
constexpr int kRequestsInFlight = 16;  // calls gRPC may accept before a thread asks for more

struct SharedCounters {
  std::atomic<int64_t> bytes_in{0};
  std::atomic<int64_t> bytes_out{0};
  std::atomic<int64_t> calls_unauthenticated{0};
  std::atomic<int64_t> calls_in_chunks{0};
};

struct ServerContextShared {
  grpc::AsyncGenericService* service;
  Handler* handler;
  std::string secret;
  std::shared_ptr<SharedCounters> counters;
  int64_t max_message_bytes = 0;
  // New calls are requested only before shutdown starts (a queue must get no new work once it
  // is shut down).
  absl::Mutex mu;
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
  std::atomic<int> live_calls{0};
};

class ServerCall : public std::enable_shared_from_this<ServerCall> {
 public:
  ServerCall(ServerContextShared* shared, grpc::ServerCompletionQueue* cq)
      : shared_(shared), cq_(cq), stream_(&context_) {
    shared_->live_calls.fetch_add(1);
  }
  ~ServerCall() { shared_->live_calls.fetch_sub(1); }

  // Asks gRPC for the next incoming call on this queue.
  static void Request(ServerContextShared* shared, grpc::ServerCompletionQueue* cq) {
    absl::MutexLock lock(&shared->mu);
    if (shared->shutting_down) return;
    auto call = std::make_shared<ServerCall>(shared, cq);
    ServerCall* raw = call.get();
    raw->self_ = std::move(call);
    shared->service->RequestCall(&raw->context_, &raw->stream_, cq, cq, raw);
  }

  // The operation gRPC was running for this call completed (on a queue thread).
  void OnEvent(bool ok) {
    switch (state_) {
      case State::kRequested:
        if (!ok) return Release();  // the server is shutting down
        Request(shared_, cq_);      // keep accepting calls
        return Accept();
      case State::kReading:
        if (chunks_.has_value()) return ReadChunk(ok);
        if (!ok) return FinishWith(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "call carried no request"));
        return Dispatch();
      case State::kFinishing:
        return Release();  // answered (or the client went away meanwhile: ok is false)
    }
  }

  // From the Responder, on any thread, at most once.
  void Respond(absl::StatusOr<OutgoingMessage> response) {
    if (!response.ok()) return FinishWith(ToGrpcStatus(response.status()));
    response_ = EncodeMessage(*std::move(response));
    shared_->counters->bytes_out.fetch_add(static_cast<int64_t>(response_.Length()), std::memory_order_relaxed);
    Arm(State::kFinishing);
    stream_.WriteAndFinish(response_, grpc::WriteOptions(), grpc::Status::OK, this);
  }

 private:
  enum class State { kRequested, kReading, kFinishing };

  void Accept() {
    int found = -1;
    for (int m = 0; m < kNumMethods; ++m) {
      if (context_.method() == MethodPath(static_cast<Method>(m))) found = m;
    }
    if (context_.method() == kChunkedPushPath) {  // a Push in chunks
      found = static_cast<int>(Method::kPush);
      chunks_.emplace(shared_->max_message_bytes);
    }
    if (found < 0) {
      return FinishWith(
          grpc::Status(grpc::StatusCode::UNIMPLEMENTED, absl::StrCat("unknown method ", context_.method())));
    }
    method_ = static_cast<Method>(found);
    if (!shared_->secret.empty()) {
      const auto& metadata = context_.client_metadata();
      auto it = metadata.find(kTokenMetadataKey);
      if (it == metadata.end() || !SecretsEqual(std::string(it->second.data(), it->second.size()), shared_->secret)) {
        shared_->counters->calls_unauthenticated.fetch_add(1, std::memory_order_relaxed);
        return FinishWith(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                       absl::StrCat("refused ", MethodName(method_), ": ",
                                                    it == metadata.end() ? "no cluster secret" : "wrong cluster secret",
                                                    " (start every task with the same --cluster_secret_file)")));
      }
    }
    Arm(State::kReading);
    stream_.Read(&request_, this);
  }

  void Dispatch() {
    shared_->counters->bytes_in.fetch_add(static_cast<int64_t>(request_.Length()), std::memory_order_relaxed);
    absl::StatusOr<IncomingMessage> message = DecodeMessage(request_);
    request_.Clear();  // the message holds its own references to the slices
    Deliver(std::move(message));
  }

  // A chunk of a Push in chunks arrived (ok), or the stream ended: the next one is read, or the
  // whole message goes to the handler. A stream that broke off decodes to nothing.
  void ReadChunk(bool ok) {
    if (ok) {
      shared_->counters->bytes_in.fetch_add(static_cast<int64_t>(request_.Length()), std::memory_order_relaxed);
      absl::Status added = chunks_->Add(request_);
      request_.Clear();
      if (!added.ok()) return Refuse(added);
      Arm(State::kReading);
      return stream_.Read(&request_, this);
    }
    absl::StatusOr<IncomingMessage> message = chunks_->Finish();
    chunks_.reset();
    if (message.ok()) shared_->counters->calls_in_chunks.fetch_add(1, std::memory_order_relaxed);
    Deliver(std::move(message));
  }

  // A request that does not decode: answered with its defect, naming the method.
  void Refuse(const absl::Status& why) {
    FinishWith(
        ToGrpcStatus(absl::Status(why.code(), absl::StrCat("refused ", MethodName(method_), ": ", why.message()))));
  }

  void Deliver(absl::StatusOr<IncomingMessage> message) {
    if (!message.ok()) return Refuse(message.status());
    // Until the handler answers, only the Responder owns the call.
    std::shared_ptr<ServerCall> self = std::move(self_);
    shared_->handler->Handle(method_, *std::move(message),
                             Responder(std::make_unique<CallResponder<ServerCall>>(std::move(self))));
  }

  void FinishWith(const grpc::Status& status) {
    Arm(State::kFinishing);
    stream_.Finish(status, this);
  }

  // gRPC is about to hold a tag of this call: keep the call alive until it comes back.
  void Arm(State next) {
    state_ = next;
    if (self_ == nullptr) self_ = shared_from_this();
  }
  void Release() { self_.reset(); }

  ServerContextShared* const shared_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_;
  Method method_ = Method::kHello;
  grpc::ByteBuffer request_;
  std::optional<ChunkedMessageReader> chunks_;  // a Push in chunks, until its stream ended
  grpc::ByteBuffer response_;
  // Touched by one thread at a time: the queue thread running the current event, or the thread
  // answering; gRPC orders the answer's start before its completion event.
  State state_ = State::kRequested;
  std::shared_ptr<ServerCall> self_;  // while gRPC holds this call's tag
};

class GrpcServer final : public Server {
 public:
  GrpcServer(rpc::Handler* handler, std::string secret, int64_t max_message_bytes) {
    shared_.service = &service_;
    shared_.handler = handler;
    shared_.secret = std::move(secret);
    shared_.counters = std::make_shared<SharedCounters>();
    shared_.max_message_bytes = max_message_bytes;
  }
  ~GrpcServer() override { Shutdown(1.0); }

  absl::Status Start(const std::string& address, std::shared_ptr<grpc::ServerCredentials> creds) {
    grpc::ServerBuilder builder;
    TuneServerBuilder(&builder, shared_.max_message_bytes);
    builder.AddListeningPort(address, std::move(creds), &port_);
    builder.RegisterAsyncGenericService(&service_);
    queues_.push_back(builder.AddCompletionQueue());
    GrpcLogCapture grpc_log;  // a failed bind is logged by gRPC over several lines: say it in one
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      server_.reset();
      for (auto& q : queues_) {
        q->Shutdown();
        void* tag = nullptr;
        bool ok = false;
        while (q->Next(&tag, &ok)) {
        }  // nothing was started on it: returns false at once
      }
      queues_.clear();  // inside the capture: gRPC complains about the queue of a server never started
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", address, ": ", DescribeBindFailure(grpc_log.text())));
    }
    grpc::ServerCompletionQueue* cq = queues_[0].get();
    for (int i = 0; i < kRequestsInFlight; ++i) ServerCall::Request(&shared_, cq);
    for (int i = 0; i < kServerPollThreads; ++i) {
      threads_.emplace_back([cq] {
        void* tag = nullptr;
        bool ok = false;
        while (NextEvent(cq, &tag, &ok)) static_cast<ServerCall*>(tag)->OnEvent(ok);
      });
    }
    return absl::OkStatus();
  }

  int port() const override { return port_; }

  ServerCounters counters() const override {
    ServerCounters c;
    c.bytes_in = shared_.counters->bytes_in.load();
    c.bytes_out = shared_.counters->bytes_out.load();
    c.calls_unauthenticated = shared_.counters->calls_unauthenticated.load();
    c.calls_in_chunks = shared_.counters->calls_in_chunks.load();
    return c;
  }

  void Shutdown(double grace_secs) override {
    absl::MutexLock lock(&shutdown_mu_);
    if (server_ == nullptr) {
      for (auto& q : queues_) q->Shutdown();
      queues_.clear();
      return;
    }
    {
      absl::MutexLock lock(&shared_.mu);
      shared_.shutting_down = true;
    }
    // Calls still running after the grace are cancelled; the queues keep being polled meanwhile.
    server_->Shutdown(DeadlineAfter(grace_secs));
    // A call answered late (its Responder held elsewhere) still needs its queue: wait for the
    // last ones, bounded in case an owner never answers.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (shared_.live_calls.load() > 0 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (auto& q : queues_) q->Shutdown();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    server_.reset();
    queues_.clear();
  }

 private:
  grpc::AsyncGenericService service_;
  ServerContextShared shared_;
  int port_ = 0;
  absl::Mutex shutdown_mu_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::thread> threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> StartGrpcServer(const std::string& address, const TransportOptions& security,
                                                        Handler* handler) {
  InstallGrpcLogFilter();
  if (absl::Status s = CheckMaxMessageBytes(security.max_message_bytes); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = MakeServerCredentials(security);
  if (!creds.ok()) return creds.status();
  auto server = std::make_unique<GrpcServer>(handler, security.secret, security.max_message_bytes);
  absl::Status started = server->Start(address, *std::move(creds));
  if (!started.ok()) return started;
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace psflow::rpc
