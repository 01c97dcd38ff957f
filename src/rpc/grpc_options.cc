// gRPC tuning, credentials, status conversion and allocator tuning.
#include "rpc/grpc_options.h"

#include <grpc/support/log.h>
#include <malloc.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/check.h"
#include "rpc/tuning.h"

namespace psflow::rpc {
namespace {

constexpr int kWindowBytes = 64 << 20;
constexpr int kMaxFrameBytes = (16 << 20) - 1;  // HTTP/2's largest frame size
// Keepalive pings: every 10 s, a connection unacknowledged 10 s later is dead. Long enough that a
// ping queued behind a large message on a slow link (vgg19 over 40 Mbit/s) is answered in time.
constexpr int kKeepaliveTimeMs = 10000;
constexpr int kKeepaliveTimeoutMs = 10000;

template <typename Setter>
void ApplyTuning(int64_t max_message_bytes, Setter&& set) {
  CHECK(CheckMaxMessageBytes(max_message_bytes).ok()) << max_message_bytes;
  set(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, static_cast<int>(max_message_bytes));
  set(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, static_cast<int>(max_message_bytes));
  // BDP probing starts with a small window and grows it slowly; a fixed large window lets a
  // 16 MiB tensor flow without waiting for window updates.
  set(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kWindowBytes);
  set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
}

// "1 MiB", "2.5 MiB", or bytes below one MiB.
std::string MiB(int64_t bytes) {
  if (bytes < (1 << 20)) return absl::StrCat(bytes, " bytes");
  if (bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the TLS ", what, " file '", path, "': check the --tls_", what, " path"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void TuneAllocatorForLargeMessages() {
  // glibc otherwise serves 16 MiB buffers with mmap and returns them with munmap on every free;
  // page faults on each fresh mapping then cost more than the transfer. 32 MiB is glibc's largest
  // allowed mmap threshold on 64-bit.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  // Not enabled here: gRPC 1.51's experiment "tcp_frame_size_tuning" (GRPC_EXPERIMENTS), which reads
  // a message into one buffer of its announced size. On the shared 2-core machine it sped a 16 MiB
  // push up in some runs (median 21-25 ms -> 6.3 ms) but made 4 KiB calls slower in about half of
  // the runs (41 us -> 50-70 us), and 1.51's experiments are not production-tested.
}

grpc::ChannelArguments TunedChannelArguments(const std::string& connection_tag, int64_t max_message_bytes) {
  grpc::ChannelArguments args;
  ApplyTuning(max_message_bytes, [&args](const char* key, int value) { args.SetInt(key, value); });
  // Distinct arguments and a local subchannel pool give each tagged channel its own connection.
  args.SetString("psflow.connection", connection_tag);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Tasks start in any order: retry connecting every few hundred ms rather than gRPC's default
  // back-off, which grows to minutes and would delay a worker long after its ps came up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // gRPC 1.51 reads the "min reconnect backoff" as the least time one connection attempt is given
  // (its min_connect_timeout, 20 s by default), not as a pause between attempts. At 100 ms, a TLS
  // handshake on a loaded machine was cut off ("connection attempt timed out before receiving
  // SETTINGS frame", "tcp handshaker shutdown") and a task's first call failed; 1 s is the longest
  // pause between attempts anyway, so a link that comes back is still found within about 1 s.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  // A connection whose peer stopped acknowledging (a link that went down, a frozen ps) is found
  // dead by an HTTP/2 ping within kKeepalive{Time,Timeout}Ms and replaced by a fresh one at the
  // next retry. Without it, a call retried over the old connection waits for TCP's retransmission
  // back-off (tens of seconds after a long outage), so a link that came back stayed silent past
  // --ps_timeout_secs and the chief's abort could miss a ps (docs/failures.md).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

void TuneServerBuilder(grpc::ServerBuilder* builder, int64_t max_message_bytes) {
  // The builder's own size settings override channel arguments: set them too.
  builder->SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  builder->SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  ApplyTuning(max_message_bytes, [builder](const char* key, int value) { builder->AddChannelArgument(key, value); });
  // gRPC sets SO_REUSEPORT by default, which would let a second ps silently share a busy port.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Accept the clients' keepalive pings (by default a server answers pings more often than every
  // 5 minutes on an idle connection with GOAWAY "too_many_pings").
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, kKeepaliveTimeMs / 2);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

absl::Status CheckMaxMessageBytes(int64_t max_message_bytes) {
  if (max_message_bytes > 0 && max_message_bytes <= kMaxMessageBytesLimit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("largest message size ", max_message_bytes,
                                                 " bytes is out of range: give --max_message_mb between 1 and 2047"));
}

std::optional<absl::Status> DescribeMessageTooLarge(const grpc::Status& status, const std::string& peer,
                                                    const std::string& method, std::optional<int64_t> message_bytes) {
  if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return std::nullopt;
  const std::string& text = status.error_message();
  constexpr std::string_view kTooLarge = "message larger than max (";
  const size_t at = text.find(kTooLarge);
  if (at == std::string::npos) return std::nullopt;
  // "(N vs. M)": the size gRPC saw and the limit it broke, both in bytes.
  const size_t open = at + kTooLarge.size();
  const size_t vs = text.find(" vs. ", open);
  int64_t size = 0, limit = 0;
  if (vs == std::string::npos || std::sscanf(text.c_str() + open, "%" SCNd64 " vs. %" SCNd64, &size, &limit) != 2) {
    return absl::ResourceExhaustedError(absl::StrCat(peer, ": ", method,
                                                     " refused: a message is over a task's size limit (", text,
                                                     "); start every task with a larger --max_message_mb"));
  }
  // gRPC's words, with the whole message's size when it spoke of a piece.
  std::string quoted = text;
  if (message_bytes.has_value()) {
    size = *message_bytes;
    quoted = absl::StrCat(text.substr(0, open), size, text.substr(vs));
  }
  return absl::ResourceExhaustedError(absl::StrCat(peer, ": ", method, " refused: a message of ", MiB(size),
                                                   " is over the ", MiB(limit), " limit (gRPC: ", quoted,
                                                   "); start every task with a larger --max_message_mb"));
}

namespace {

// gRPC logs a failed TLS handshake on every reconnection attempt (several a second); a task that
// keeps dialling with the wrong certificate would bury everything else. Each distinct message is
// printed at most once a minute, as one line naming its source.
constexpr auto kRepeatHiddenFor = std::chrono::seconds(60);

struct GrpcLogState {
  absl::Mutex mu;
  std::map<std::string, std::chrono::steady_clock::time_point> last_shown ABSL_GUARDED_BY(mu);
};

thread_local std::string* t_captured_log = nullptr;  // set by a GrpcLogCapture on this thread

void LogOncePerMinute(gpr_log_func_args* args) {
  static GrpcLogState* state = new GrpcLogState();  // never destroyed: gRPC may log until exit
  const std::string message = args->message == nullptr ? "" : args->message;
  if (t_captured_log != nullptr) {
    absl::StrAppend(t_captured_log, message, "\n");
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&state->mu);
    auto [it, fresh] = state->last_shown.try_emplace(message, now);
    if (!fresh) {
      if (now - it->second < kRepeatHiddenFor) return;
      it->second = now;
    }
    if (state->last_shown.size() > 1000) state->last_shown.clear();  // bound memory, not correctness
  }
  const char* file = args->file == nullptr ? "?" : args->file;
  if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
  const char* severity = args->severity == GPR_LOG_SEVERITY_ERROR  ? "error"
                         : args->severity == GPR_LOG_SEVERITY_INFO ? "info"
                                                                   : "debug";
  std::fprintf(stderr, "gRPC %s: %s (%s:%d; repeats hidden for a minute)\n", severity, message.c_str(), file,
               args->line);
}

}  // namespace

void InstallGrpcLogFilter() {
  static std::once_flag once;
  std::call_once(once, [] { gpr_set_log_function(&LogOncePerMinute); });
}

GrpcLogCapture::GrpcLogCapture() : outer_(t_captured_log) {
  InstallGrpcLogFilter();
  t_captured_log = &text_;
}

GrpcLogCapture::~GrpcLogCapture() { t_captured_log = outer_; }

std::string DescribeBindFailure(const std::string& grpc_log) {
  auto has = [&grpc_log](const char* what) { return grpc_log.find(what) != std::string::npos; };
  if (has("Address already in use")) {
    return "the port is in use by another process (pick a free port in --ps_hosts, or stop the process holding "
           "it: `ss -ltnp` lists them)";
  }
  if (has("Cannot assign requested address")) {
    return "the address is not one of this host's (give this task its own host's address in --ps_hosts)";
  }
  if (has("Permission denied")) return "permission denied (ports below 1024 need privileges: pick a higher port)";
  if (has("resolve") || has("Name or service not known") || has("not known")) {
    return "the host name does not resolve (check the host in --ps_hosts)";
  }
  // Unrecognised: the first line of gRPC's account, which names the cause somewhere inside.
  const std::string first = grpc_log.substr(0, grpc_log.find('\n'));
  return absl::StrCat("the port is in use or the address is not on this host (", first.empty() ? "no detail" : first,
                      ")");
}

ClientTls ClientTlsOf(const TransportOptions& security) {
  ClientTls tls;
  tls.enabled = !security.tls_ca.empty() || !security.tls_cert.empty();
  tls.has_certificate = !security.tls_cert.empty() && !security.tls_key.empty();
  return tls;
}

std::string DescribeConnectFailure(const std::string& grpc_text, ClientTls tls) {
  // gRPC wraps the cause in "failed to connect to all addresses; last error: UNKNOWN: ipv4:...":
  // keep the address and the cause.
  std::string text = grpc_text;
  for (const char* noise : {"failed to connect to all addresses; last error: ", "UNKNOWN: ", "UNAVAILABLE: "}) {
    if (text.rfind(noise, 0) == 0) text.erase(0, std::strlen(noise));
  }
  auto has = [&text](const char* what) { return text.find(what) != std::string::npos; };
  const char* hint = nullptr;
  if (has("certificate verify failed")) {
    hint =
        "the task's certificate is not signed by the CA in this task's --tls_ca: give every task the CA "
        "that signed the cluster's certificates";
  } else if (has("Peer name") && has("is not in peer certificate")) {
    hint =
        "the task's certificate does not name the host this task dialled: add it to the certificate's "
        "subjectAltName, or dial the name the certificate has";
  } else if (has("Ssl handshake failed") && has("wrong version number")) {
    hint = "this task speaks TLS but the other does not: give every task the same --tls_cert/--tls_key/--tls_ca";
  } else if (has("Socket closed") || has("Connection reset")) {
    // A TLS server drops a connection whose handshake it refuses without saying why.
    if (!tls.enabled) {
      hint =
          "the task closed the connection: it stopped, or, if this repeats on every attempt, it uses TLS "
          "and this task must be started with the same --tls_cert/--tls_key/--tls_ca";
    } else if (!tls.has_certificate) {
      hint =
          "the task closed the connection during the TLS handshake; if it requires client certificates "
          "(it has --tls_ca), give this task --tls_cert and --tls_key";
    } else {
      hint =
          "the task closed the connection during the TLS handshake; it may not trust this task's "
          "certificate (which must be signed by the CA in the other task's --tls_ca)";
    }
  } else if (has("Connection refused")) {
    hint = "nothing listens there: is the task running, and is the address right?";
  }
  return hint == nullptr ? text : absl::StrCat(text, " (", hint, ")");
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const TransportOptions& security) {
  if (security.tls_ca.empty() && security.tls_cert.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  if (!security.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(security.tls_ca, "ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  if (!security.tls_cert.empty() && !security.tls_key.empty()) {
    // Clients present the cluster's certificate too, for servers that verify clients.
    absl::StatusOr<std::string> cert = ReadPemFile(security.tls_cert, "cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(security.tls_key, "key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TransportOptions& security) {
  if (security.tls_cert.empty() && security.tls_key.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (security.tls_cert.empty() || security.tls_key.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls_cert and --tls_key on a ps task (only one was given)");
  }
  absl::StatusOr<std::string> cert = ReadPemFile(security.tls_cert, "cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(security.tls_key, "key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!security.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(security.tls_ca, "ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    // With a CA, clients must prove they belong to the cluster (mutual TLS).
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

bool SecretsEqual(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace psflow::rpc
