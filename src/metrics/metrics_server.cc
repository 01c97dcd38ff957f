#include "psflow/metrics/metrics_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace psflow::metrics {
namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace

MetricsServer::MetricsServer(std::unique_ptr<httplib::Server> server, std::string host, int port)
    : server_(std::move(server)), host_(std::move(host)), port_(port) {}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(MetricsRegistry* registry, const std::string& host,
                                                                    int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_port ", port, " is out of range: use 1-65535 (0: any)"));
  }
  auto server = std::make_unique<httplib::Server>();
  // httplib sets SO_REUSEPORT by default, which would let a second task share a taken port and
  // receive half of the scrapes; plain SO_REUSEADDR still allows a quick restart of the task.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Scrapes are rare and small: two threads, one request per connection, and short timeouts so
  // that Stop() never waits long for an idle or slow client.
  server->new_task_queue = [] { return new httplib::ThreadPool(2); };  // httplib takes ownership
  server->set_keep_alive_max_count(1);
  server->set_keep_alive_timeout(1);
  server->set_read_timeout(2);
  server->set_write_timeout(2);
  server->Get("/metrics", [registry](const httplib::Request&, httplib::Response& response) {
    response.set_content(registry->Render(), kContentType);
  });

  errno = 0;
  const int bound_port = port == 0 ? server->bind_to_any_port(host) : (server->bind_to_port(host, port) ? port : -1);
  if (bound_port <= 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", host, ":", port, err != 0 ? absl::StrCat(" (", std::strerror(err), ")") : "",
        ": the port is taken or the host is not a local address; pick another --metrics_port"));
  }
  std::unique_ptr<MetricsServer> metrics(new MetricsServer(std::move(server), host, bound_port));
  {
    absl::MutexLock lock(&metrics->stop_mu_);
    MetricsServer* self = metrics.get();
    metrics->listener_ = std::thread([self] {
      self->server_->listen_after_bind();
      self->listen_returned_ = true;
    });
  }
  // httplib's stop() only acts on a server that is already running, so wait for the listen loop.
  while (!metrics->server_->is_running() && !metrics->listen_returned_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!metrics->server_->is_running()) {
    metrics->Stop();
    return absl::InternalError(absl::StrCat("the metrics server on ", host, ":", bound_port, " stopped at once"));
  }
  return metrics;
}

void MetricsServer::Stop() {
  absl::MutexLock lock(&stop_mu_);
  if (!listener_.joinable()) return;
  server_->stop();
  listener_.join();
}

MetricsServer::~MetricsServer() { Stop(); }

}  // namespace psflow::metrics
