// The gRPC implementation of ClientChannel and Server, on gRPC's generic callback API so that
// requests and responses are raw byte buffers (tensor_coding.h) rather than protobuf messages.
//
// Call lifecycle, client side: Call() creates a ClientCall (shared_ptr) holding the context and
// both byte buffers; it is referenced by gRPC's completion callback and, through a ReleaseGuard,
// by every zero-copy slice of the request. The user's `done` runs when both are gone: the
// response arrived and gRPC no longer reads the caller's tensor memory.
//
// Server side: gRPC creates one ServerCall reactor per call and deletes it in OnDone (the
// reactor API requires the reactor to free itself). The reactor reads one request, hands it to
// the Handler with a Responder, and finishes when the Responder answers — possibly much later,
// from another thread — or when the call is cancelled. A CallSlot shared by the reactor and the
// Responder decides which of the two finishes the call, so a late answer after cancellation is
// dropped instead of touching a deleted reactor.
#include <atomic>
#include <chrono>
#include <cmath>

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "psflow/core/check.h"
#include "rpc/grpc_options.h"
#include "rpc/tensor_coding.h"

namespace psflow::rpc {
namespace {

std::chrono::system_clock::time_point DeadlineAfter(double secs) {
  // Clamp so "effectively forever" timeouts do not overflow the clock.
  const double clamped = std::min(std::max(secs, 0.0), 1e7);
  return std::chrono::system_clock::now() +
         std::chrono::microseconds(static_cast<int64_t>(clamped * 1e6));
}

// ---------------------------------------------------------------------------------------------
// Client

struct ClientCall {
  std::shared_ptr<grpc::Channel> channel;  // kept alive while the call runs
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  grpc::Status status;
  std::atomic<int> pending{2};  // the response, and the release of the request's memory
  std::function<void(absl::StatusOr<IncomingMessage>)> done;
  std::function<absl::Status(const grpc::Status&)> describe_error;

  void Arrive() {
    if (pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (!status.ok()) {
      done(describe_error(status));
    } else {
      done(DecodeMessage(response));
    }
  }
};

// Destroyed when the last zero-copy slice of a request is released.
class ReleaseGuard {
 public:
  explicit ReleaseGuard(std::shared_ptr<ClientCall> call) : call_(std::move(call)) {}
  ReleaseGuard(const ReleaseGuard&) = delete;
  ReleaseGuard& operator=(const ReleaseGuard&) = delete;
  ~ReleaseGuard() { call_->Arrive(); }

 private:
  std::shared_ptr<ClientCall> call_;
};

class GrpcChannel final : public ClientChannel {
 public:
  GrpcChannel(std::string address, std::string peer_name, std::string secret,
              std::shared_ptr<grpc::ChannelCredentials> credentials)
      : address_(std::move(address)), peer_name_(std::move(peer_name)), secret_(std::move(secret)) {
    for (int d = 0; d < 2; ++d) {
      auto channel = grpc::CreateCustomChannel(address_, credentials,
                                               TunedChannelArguments(d == 0 ? "push" : "pull"));
      stubs_[d] = std::make_unique<grpc::GenericStub>(channel);
      channels_[d] = std::move(channel);
    }
  }

  void Call(Method method, OutgoingMessage request, const CallOptions& options,
            std::function<void(absl::StatusOr<IncomingMessage>)> done) override {
    auto call = std::make_shared<ClientCall>();
    call->done = std::move(done);
    call->channel = channels_[options.pull_direction ? 1 : 0];
    call->describe_error = [peer = peer_name_, method, timeout = options.timeout_secs](
                               const grpc::Status& s) { return DescribeError(peer, method, timeout, s); };
    call->context.set_deadline(DeadlineAfter(options.timeout_secs));
    call->context.set_wait_for_ready(options.wait_for_ready);
    if (!secret_.empty()) call->context.AddMetadata(kTokenMetadataKey, secret_);
    {
      auto guard = std::make_shared<ReleaseGuard>(call);
      call->request = EncodeMessage(std::move(request), guard);
    }  // from here on only the request's slices hold the guard
    grpc::GenericStub& stub = *stubs_[options.pull_direction ? 1 : 0];
    stub.UnaryCall(&call->context, MethodPath(method), grpc::StubOptions(), &call->request,
                   &call->response, [call](grpc::Status status) {
                     call->status = std::move(status);
                     call->request.Clear();  // drop our references to the request's slices
                     call->Arrive();
                   });
  }

  const std::string& peer_name() const override { return peer_name_; }

 private:
  static absl::Status DescribeError(const std::string& peer, Method method,
                                    double timeout_secs, const grpc::Status& s) {
    const absl::StatusCode code = static_cast<absl::StatusCode>(s.error_code());
    if (code == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(absl::StrCat(peer, ": ", MethodName(method),
                                                      " got no answer within ", timeout_secs,
                                                      " s (", s.error_message(), ")"));
    }
    if (code == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(absl::StrCat(peer, ": ", MethodName(method),
                                                 " could not reach the task: ", s.error_message()));
    }
    return absl::Status(code, absl::StrCat(peer, ": ", s.error_message()));
  }

  const std::string address_;
  const std::string peer_name_;
  const std::string secret_;
  std::shared_ptr<grpc::Channel> channels_[2];  // [0] push + control, [1] pull
  std::unique_ptr<grpc::GenericStub> stubs_[2];
};

// ---------------------------------------------------------------------------------------------
// Server

struct SharedCounters {
  std::atomic<int64_t> bytes_in{0};
  std::atomic<int64_t> bytes_out{0};
  std::atomic<int64_t> calls_unauthenticated{0};
};

class ServerCall;

// Decides, once, who finishes a call: the Responder (an answer) or the reactor (cancellation).
struct CallSlot {
  absl::Mutex mu;
  ServerCall* reactor ABSL_GUARDED_BY(mu) = nullptr;  // null once gRPC is done with the call
  bool finished ABSL_GUARDED_BY(mu) = false;

  // Claims the right to finish; returns the reactor, or null if already finished or gone.
  ServerCall* Claim() {
    absl::MutexLock lock(&mu);
    if (finished || reactor == nullptr) return nullptr;
    finished = true;
    return reactor;
  }
};

class ServerCall final : public grpc::ServerGenericBidiReactor {
 public:
  ServerCall(grpc::GenericCallbackServerContext* context, Handler* handler,
             std::shared_ptr<SharedCounters> counters, const std::string& secret)
      : handler_(handler), counters_(std::move(counters)), slot_(std::make_shared<CallSlot>()) {
    {
      absl::MutexLock lock(&slot_->mu);
      slot_->reactor = this;
    }
    int found = -1;
    for (int m = 0; m < kNumMethods; ++m) {
      if (context->method() == MethodPath(static_cast<Method>(m))) found = m;
    }
    if (found < 0) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                              absl::StrCat("unknown method ", context->method())));
      return;
    }
    method_ = static_cast<Method>(found);
    if (!secret.empty()) {
      const auto& metadata = context->client_metadata();
      auto it = metadata.find(kTokenMetadataKey);
      if (it == metadata.end() ||
          !SecretsEqual(std::string(it->second.data(), it->second.size()), secret)) {
        counters_->calls_unauthenticated.fetch_add(1, std::memory_order_relaxed);
        FinishOnce(grpc::Status(
            grpc::StatusCode::UNAUTHENTICATED,
            absl::StrCat("refused ", MethodName(method_), ": ",
                         it == metadata.end() ? "no cluster secret" : "wrong cluster secret",
                         " (start every task with the same --cluster_secret_file)")));
        return;
      }
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "call carried no request"));
      return;
    }
    counters_->bytes_in.fetch_add(static_cast<int64_t>(request_.Length()),
                                  std::memory_order_relaxed);
    absl::StatusOr<IncomingMessage> message = DecodeMessage(request_);
    if (!message.ok()) {
      FinishOnce(ToGrpcStatus(message.status()));
      return;
    }
    handler_->Handle(method_, *std::move(message),
                     Responder(std::make_unique<SlotResponder>(slot_, counters_)));
  }

  void OnCancel() override {
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&slot_->mu);
      slot_->reactor = nullptr;
    }
    delete this;  // the reactor API's ownership model: gRPC is done with the reactor
  }

  // Sends `response` and finishes; the caller has claimed the slot.
  void SendAndFinish(absl::StatusOr<OutgoingMessage> response) {
    if (!response.ok()) {
      Finish(ToGrpcStatus(response.status()));
      return;
    }
    response_ = EncodeMessage(*std::move(response));
    counters_->bytes_out.fetch_add(static_cast<int64_t>(response_.Length()),
                                   std::memory_order_relaxed);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }

 private:
  class SlotResponder final : public Responder::Impl {
   public:
    SlotResponder(std::shared_ptr<CallSlot> slot, std::shared_ptr<SharedCounters> counters)
        : slot_(std::move(slot)), counters_(std::move(counters)) {}
    void Respond(absl::StatusOr<OutgoingMessage> response) override {
      // After Claim succeeds nobody else finishes the call, so gRPC cannot call OnDone (which
      // needs Finish) until SendAndFinish below: the reactor stays valid.
      if (ServerCall* reactor = slot_->Claim()) reactor->SendAndFinish(std::move(response));
    }

   private:
    std::shared_ptr<CallSlot> slot_;
    std::shared_ptr<SharedCounters> counters_;
  };

  void FinishOnce(const grpc::Status& status) {
    if (slot_->Claim() != nullptr) Finish(status);
  }

  Handler* const handler_;
  const std::shared_ptr<SharedCounters> counters_;
  const std::shared_ptr<CallSlot> slot_;
  Method method_ = Method::kHello;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
};

// The generic service: every method of the ps service arrives here as raw byte buffers.
class GenericService final : public grpc::CallbackGenericService {
 public:
  GenericService(rpc::Handler* handler, std::string secret, std::shared_ptr<SharedCounters> counters)
      : handler_(handler), secret_(std::move(secret)), counters_(std::move(counters)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    // Owned by gRPC until ServerCall::OnDone deletes it.
    return new ServerCall(context, handler_, counters_, secret_);
  }

 private:
  rpc::Handler* const handler_;
  const std::string secret_;
  const std::shared_ptr<SharedCounters> counters_;
};

class GrpcServer final : public Server {
 public:
  GrpcServer(rpc::Handler* handler, std::string secret)
      : counters_(std::make_shared<SharedCounters>()),
        service_(handler, std::move(secret), counters_) {}
  ~GrpcServer() override { Shutdown(1.0); }

  absl::Status Start(const std::string& address, std::shared_ptr<grpc::ServerCredentials> creds) {
    grpc::ServerBuilder builder;
    TuneServerBuilder(&builder);
    builder.AddListeningPort(address, std::move(creds), &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      server_.reset();
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", address,
                       ": the port is in use or the address is not on this host (pick a free "
                       "port in --ps_hosts, or stop the process holding it)"));
    }
    return absl::OkStatus();
  }

  int port() const override { return port_; }

  ServerCounters counters() const override {
    ServerCounters c;
    c.bytes_in = counters_->bytes_in.load();
    c.bytes_out = counters_->bytes_out.load();
    c.calls_unauthenticated = counters_->calls_unauthenticated.load();
    return c;
  }

  void Shutdown(double grace_secs) override {
    absl::MutexLock lock(&shutdown_mu_);
    if (server_ == nullptr) return;
    server_->Shutdown(DeadlineAfter(grace_secs));
    server_->Wait();
    server_.reset();
  }

 private:
  const std::shared_ptr<SharedCounters> counters_;
  GenericService service_;
  int port_ = 0;
  absl::Mutex shutdown_mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(shutdown_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<ClientChannel>> MakeGrpcChannel(const std::string& address,
                                                               const std::string& peer_name,
                                                               const SecurityOptions& security) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = MakeChannelCredentials(security);
  if (!creds.ok()) return creds.status();
  return std::unique_ptr<ClientChannel>(
      new GrpcChannel(address, peer_name, security.secret, *std::move(creds)));
}

absl::StatusOr<std::unique_ptr<Server>> StartGrpcServer(const std::string& address,
                                                        const SecurityOptions& security,
                                                        Handler* handler) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = MakeServerCredentials(security);
  if (!creds.ok()) return creds.status();
  auto server = std::make_unique<GrpcServer>(handler, security.secret);
  absl::Status started = server->Start(address, *std::move(creds));
  if (!started.ok()) return started;
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace psflow::rpc
