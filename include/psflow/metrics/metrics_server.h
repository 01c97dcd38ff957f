// psflow/metrics/metrics_server.h — Prometheus metrics of one task: a registry of counters and
// gauges (with optional labels such as {ps="0"}) rendered in the Prometheus text exposition format
// 0.0.4, and a small HTTP server (cpp-httplib) answering GET /metrics, on loopback by default.
//
// Ownership: the caller owns the MetricsRegistry; a MetricsServer borrows it and must be stopped
// (Stop() or destruction) before the registry goes away. Callbacks are owned by the registry.
// Thread-safe: every method of both classes may be called from any thread.
//
// Typical use in a task:
//   MetricsRegistry registry;
//   CHECK(DeclarePsflowMetrics(registry).ok());
//   auto server = MetricsServer::Start(&registry, port);          // --metrics_port
//   registry.SetGauge(kGlobalStep, {}, step);                      // as training goes
//   registry.AddCounter(kPushesRefused, {});                       // on each refused push
//   registry.RegisterCallback([&](MetricsRegistry::Snapshot& s) {  // or: computed at scrape time
//     s.Set(kPsBytesIn, {{"ps", "0"}}, transport.bytes_in());
//   });
#ifndef PSFLOW_METRICS_METRICS_SERVER_H_
#define PSFLOW_METRICS_METRICS_SERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace httplib {
class Server;
}

namespace psflow::metrics {

// The metric names psflow tasks export (DeclarePsflowMetrics declares them all).
inline constexpr char kGlobalStep[] = "psflow_global_step";                               // gauge
inline constexpr char kStepsPerSecond[] = "psflow_steps_per_second";                      // gauge
inline constexpr char kPsBytesIn[] = "psflow_ps_bytes_in_total";                          // counter {ps="N"}
inline constexpr char kPsBytesOut[] = "psflow_ps_bytes_out_total";                        // counter {ps="N"}
inline constexpr char kStaleGradientsDropped[] = "psflow_stale_gradients_dropped_total";  // counter
inline constexpr char kPushesRefused[] = "psflow_pushes_refused_total";                   // counter
inline constexpr char kConnectedWorkers[] = "psflow_connected_workers";                   // gauge
// A worker's training mode: 1 with the label {mode="async"|"sync"|"hybrid"} (hybrid: --sync_replicas
// --table_sync=async, the dense variables sync and the tables async).
inline constexpr char kTrainingMode[] = "psflow_training_mode";  // gauge {mode="..."}
// Embedding tables, per ps task and table shard (labels {ps="N",table="NAME"}).
inline constexpr char kTableRows[] = "psflow_table_rows";                     // gauge
inline constexpr char kTableBytes[] = "psflow_table_bytes";                   // gauge
inline constexpr char kTableRowsPulled[] = "psflow_table_rows_pulled_total";  // counter
inline constexpr char kTableRowsPushed[] = "psflow_table_rows_pushed_total";  // counter
inline constexpr char kTableAdmissions[] = "psflow_table_admissions_total";   // counter
inline constexpr char kTableEvictions[] = "psflow_table_evictions_total";     // counter
// Disk tables only (docs/table-storage.md): the hot-row cache and the disk below it.
inline constexpr char kTableCacheHits[] = "psflow_table_cache_hits_total";               // counter
inline constexpr char kTableCacheMisses[] = "psflow_table_cache_misses_total";           // counter
inline constexpr char kTableDiskBytes[] = "psflow_table_disk_bytes";                     // gauge
inline constexpr char kTableDiskRowsRead[] = "psflow_table_disk_rows_read_total";        // counter
inline constexpr char kTableDiskRowsWritten[] = "psflow_table_disk_rows_written_total";  // counter

class MetricsRegistry {
 public:
  enum class Type { kCounter, kGauge };
  // Label (name, value) pairs, naming exactly the declared label names in the declared order.
  using Labels = std::vector<std::pair<std::string, std::string>>;

  // Values reported by callbacks at scrape time; Set() works like SetGauge for gauges and
  // SetCounter for counters.
  class Snapshot {
   public:
    void Set(std::string_view name, const Labels& labels, double value) {
      values_.push_back({std::string(name), labels, value});
    }

   private:
    friend class MetricsRegistry;
    struct Value {
      std::string name;
      Labels labels;
      double value;
    };
    std::vector<Value> values_;
  };
  using Callback = std::function<void(Snapshot&)>;

  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Declares a metric family. `name` must match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
  // [a-zA-Z_][a-zA-Z0-9_]* (not starting "__"). A family without labels is exported as 0 from
  // now on; one with labels shows a sample per label set once it is first set. Declaring the same
  // family again identically is a no-op; differently, an AlreadyExists error.
  absl::Status Declare(const std::string& name, Type type, const std::string& help,
                       std::vector<std::string> label_names = {});

  // Setting a metric that was not declared, of the other type, or with labels that do not match
  // its declaration is a programmer error (CHECK).
  void SetGauge(std::string_view name, const Labels& labels, double value);
  // Adds `delta` >= 0 to a counter.
  void AddCounter(std::string_view name, const Labels& labels, double delta = 1);
  // Sets a counter whose running total is kept elsewhere (e.g. the bytes a transport counted).
  void SetCounter(std::string_view name, const Labels& labels, double total);

  // Adds a callback run on every Render() (every scrape), before the text is produced. It may call
  // the setters above but must not call Render or (un)register callbacks. Returns an id for
  // UnregisterCallback, which waits for a running scrape so that the callback's captures can be
  // destroyed right after it returns.
  int RegisterCallback(Callback callback);
  void UnregisterCallback(int id);

  // All families, sorted by name, in the Prometheus text format 0.0.4: "# HELP", "# TYPE" and one
  // line per sample, label values escaped.
  std::string Render();

 private:
  struct Family {
    Type type;
    std::string help;
    std::vector<std::string> label_names;
    std::map<std::vector<std::string>, double> samples;  // label values → value
  };
  enum class Op { kSetGauge, kAddCounter, kSetCounter, kSetAny };
  void Update(std::string_view name, const Labels& labels, double value, Op op) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex callbacks_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // held while callbacks run
  std::map<int, Callback> callbacks_ ABSL_GUARDED_BY(callbacks_mu_);
  int next_callback_id_ ABSL_GUARDED_BY(callbacks_mu_) = 0;

  absl::Mutex mu_;
  std::map<std::string, Family, std::less<>> families_ ABSL_GUARDED_BY(mu_);
};

// Declares the seven psflow metrics above with their help texts.
absl::Status DeclarePsflowMetrics(MetricsRegistry& registry);

inline constexpr char kDefaultMetricsHost[] = "127.0.0.1";

class MetricsServer {
 public:
  // Serves GET /metrics for `registry` (borrowed; must outlive the server) on host:port, port 0
  // meaning any free port (see port()). Errors: the port is taken or the host is not a local
  // address (InvalidArgument / Unavailable naming host:port), port out of range.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(MetricsRegistry* registry, const std::string& host,
                                                              int port);
  // The same on 127.0.0.1.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(MetricsRegistry* registry, int port) {
    return Start(registry, kDefaultMetricsHost, port);
  }

  ~MetricsServer();  // stops
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

  // Stops listening and waits for requests in flight (a second or so at most). Idempotent.
  void Stop();

 private:
  MetricsServer(std::unique_ptr<httplib::Server> server, std::string host, int port);

  std::unique_ptr<httplib::Server> server_;
  const std::string host_;
  const int port_;
  std::atomic<bool> listen_returned_{false};
  absl::Mutex stop_mu_;
  std::thread listener_ ABSL_GUARDED_BY(stop_mu_);
};

}  // namespace psflow::metrics

#endif  // PSFLOW_METRICS_METRICS_SERVER_H_
