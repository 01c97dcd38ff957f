// PsServer: lifecycle, control RPCs (Hello, WaitInitialized, Goodbye, Shutdown,
// Stats) and pulls. Initialize is in ps_initialize.cc, pushes and the sync quorum in ps_push.cc.
#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "ps/common/wire_config.h"
#include "ps/server/ps_server_impl.h"

namespace psflow::ps {

namespace {
// Workers whose pushes a task without a cluster (tests, benchmarks) tells apart.
constexpr int kPushFlagsWithoutCluster = 1024;
int PushFlags(const PsServer::Options& o) {
  return o.cluster.num_workers() > 0 ? o.cluster.num_workers() : kPushFlagsWithoutCluster;
}
}  // namespace

PsServer::Impl::Impl(Options options)
    : options_(std::move(options)),
      pushed_(new std::atomic<bool>[PushFlags(options_)]()),
      num_pushed_flags_(PushFlags(options_)) {}

PsServer::Impl::~Impl() { Stop(); }

absl::Status PsServer::Impl::Start() {
  if (options_.table_storage != "memory" && options_.table_storage != "disk") {
    return absl::InvalidArgumentError(absl::StrCat("ps task ", options_.task_index, ": table storage '",
                                                   options_.table_storage, "' is not memory or disk"));
  }
  if (options_.table_storage == "disk") {
    absl::StatusOr<std::shared_ptr<table::DiskTier>> disk =
        table::DiskTier::Open({options_.table_dir, options_.table_cache_bytes, options_.task_index},
                              [this](const std::string& line) { Log(line.substr(line.find(": ") + 2)); });
    if (!disk.ok()) {
      return absl::Status(disk.status().code(),
                          absl::StrCat("ps task ", options_.task_index, ": ", disk.status().message()));
    }
    disk_ = *std::move(disk);
  }
  absl::StatusOr<std::unique_ptr<rpc::Server>> server =
      rpc::StartServer(options_.listen_address, options_.security, this);
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("ps task ", options_.task_index, ": ", server.status().message()));
  }
  server_ = *std::move(server);
  return absl::OkStatus();
}

void PsServer::Impl::Log(const std::string& message) const {
  const std::string line = absl::StrCat("ps task ", options_.task_index, ": ", message);
  if (options_.log) {
    options_.log(line);
  } else {
    std::cerr << line << std::endl;
  }
}

void PsServer::Impl::Handle(rpc::Method method, rpc::IncomingMessage request, rpc::Responder responder) {
  last_call_nanos_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
  switch (method) {
    case rpc::Method::kHello:
      return HandleHello(request, std::move(responder));
    case rpc::Method::kInitialize:
      return HandleInitialize(request, std::move(responder));
    case rpc::Method::kMarkInitialized:
      return HandleMarkInitialized(std::move(responder));
    case rpc::Method::kWaitInitialized:
      return HandleWaitInitialized(std::move(responder));
    case rpc::Method::kPull:
      return HandlePull(request, std::move(responder));
    case rpc::Method::kPush:
      return HandlePush(request, std::move(responder));
    case rpc::Method::kGoodbye:
      return HandleGoodbye(request, std::move(responder));
    case rpc::Method::kShutdown:
      return HandleShutdown(request, std::move(responder));
    case rpc::Method::kStats:
      return HandleStats(std::move(responder));
    case rpc::Method::kLoadTable:
      return HandleLoadTable(request, std::move(responder));
    case rpc::Method::kScanTable:
      return HandleScanTable(request, std::move(responder));
    case rpc::Method::kWorkQueue:
      return HandleWorkQueue(request, std::move(responder));
  }
  responder.Respond(absl::UnimplementedError("unknown method"));
}

bool PsServer::Impl::Finished(const Model& model) const {
  if (shutdown_flag_.load(std::memory_order_acquire)) return true;
  return model.config.train_steps > 0 && (model.config.sync || model.holds_global_step) &&
         step_.load(std::memory_order_acquire) >= model.config.train_steps;
}

absl::Status PsServer::Impl::FinishedError() const {
  const int64_t step = shutdown_flag_.load() ? finished_step_.load() : step_.load();
  if (aborted_.load(std::memory_order_acquire)) {
    absl::MutexLock lock(&mu_);
    return absl::AbortedError(absl::StrCat("the chief aborted the job at step ", step, ": ", abort_reason_));
  }
  return absl::OutOfRangeError(absl::StrCat("training finished at step ", step));
}

std::vector<int> PsServer::Impl::ExpectedWorkers(const Model& model) const {
  const int n = options_.cluster.num_workers() > 0 ? options_.cluster.num_workers() : model.config.total_num_replicas;
  std::vector<int> workers;
  for (int w = 0; w < n; ++w) workers.push_back(w);
  return workers;
}

void PsServer::Impl::HandleHello(const rpc::IncomingMessage& request, rpc::Responder responder) {
  wire::HelloRequest hello;
  if (absl::Status s = request.ParseHeader(&hello); !s.ok()) return responder.Respond(s);
  if (hello.heartbeat()) {  // the worker's cluster was checked by its first Hello
    sync_.Heard(hello.worker_index());
    return responder.Respond(rpc::OutgoingMessage::Of(wire::HelloResponse()));
  }
  if (hello.wire_protocol() != kWireProtocol) {
    return responder.Respond(absl::FailedPreconditionError(absl::StrCat(
        "wire protocol mismatch: ", hello.probe() ? "a probe" : absl::StrCat("worker ", hello.worker_index()),
        " speaks psflow wire protocol ", hello.wire_protocol(), " but this ps task speaks ", kWireProtocol,
        " (0: a build from before 2026-11-28); start every task from the same psflow build")));
  }
  if (!hello.probe() && !options_.cluster.empty() && hello.cluster_fingerprint() != options_.cluster.Fingerprint()) {
    return responder.Respond(absl::FailedPreconditionError(
        absl::StrCat("cluster mismatch: this ps task runs cluster '", options_.cluster.ToString(), "' but worker ",
                     hello.worker_index(), " runs '", hello.cluster_text(),
                     "'; start every task with the same --ps_hosts and --worker_hosts (or TF_CONFIG)")));
  }
  std::vector<uint64_t> replaced;  // clients of this worker index before this one
  if (!hello.probe()) {
    absl::MutexLock lock(&mu_);
    // One process per worker index: a worker that says Hello again was restarted, and its
    // predecessor (killed, it never says Goodbye) must not hold up the end of the job.
    for (auto it = connected_.begin(); it != connected_.end();) {
      if (it->second == hello.worker_index() && it->first != hello.client_id()) {
        replaced.push_back(it->first);
        connected_.erase(it++);
      } else {
        ++it;
      }
    }
    connected_[hello.client_id()] = hello.worker_index();
    if (hello.worker_index() >= 0 && hello.worker_index() < options_.cluster.num_workers()) {
      greeted_.insert(hello.worker_index());
    }
  }
  if (!hello.probe()) {
    sync_.Rejoin(hello.worker_index());  // a worker that comes back rejoins the sync quorum
  }
  // The scans a replaced process left open (a chief killed during a save) go now (outside mu_: a
  // scan's storage failure reports to the task under it).
  if (std::shared_ptr<const Model> m = model(); m != nullptr && m->tables != nullptr) {
    for (uint64_t client : replaced) {
      for (const std::string& line : m->tables->DropScansOf(client, absl::StrCat("worker ", hello.worker_index()))) {
        Log(line);
      }
    }
  }
  wire::HelloResponse response;
  response.set_ps_task(options_.task_index);
  response.set_initialized(initialized());
  std::shared_ptr<const Model> m = model();
  response.set_finished(shutdown_flag_.load() || (m != nullptr && Finished(*m)));
  response.set_step(step_.load());
  response.set_cluster_text(options_.cluster.ToString());
  response.set_wire_protocol(kWireProtocol);
  responder.Respond(rpc::OutgoingMessage::Of(response));
}

wire::WaitInitializedResponse PsServer::Impl::InitializedResponse(const Model& model) const {
  wire::WaitInitializedResponse response;
  *response.mutable_config() = model.config_wire;
  for (const wire::ShardInfo& info : model.shard_infos) *response.add_shards() = info;
  response.set_model_signature(model.signature);
  response.set_model_fingerprint(model.fingerprint);
  return response;
}

void PsServer::Impl::HandleMarkInitialized(rpc::Responder responder) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return responder.Respond(absl::FailedPreconditionError("MarkInitialized before Initialize"));
  }
  std::vector<rpc::Responder> waiters;
  {
    absl::MutexLock lock(&mu_);
    initialized_.store(true, std::memory_order_release);
    waiters.swap(init_waiters_);
  }
  const wire::WaitInitializedResponse response = InitializedResponse(*m);
  for (rpc::Responder& waiter : waiters) waiter.Respond(rpc::OutgoingMessage::Of(response));
  responder.Respond(rpc::OutgoingMessage::Of(wire::Empty()));
}

void PsServer::Impl::HandleWaitInitialized(rpc::Responder responder) {
  std::shared_ptr<const Model> m;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return responder.Respond(absl::UnavailableError("ps task is stopping"));
    if (!initialized()) {
      // Held until MarkInitialized answers it (or the caller's deadline cancels it).
      init_waiters_.push_back(std::move(responder));
      return;
    }
    m = model();
  }
  responder.Respond(rpc::OutgoingMessage::Of(InitializedResponse(*m)));
}

void PsServer::Impl::HandlePull(const rpc::IncomingMessage& request, rpc::Responder responder) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr || !initialized()) {
    return responder.Respond(absl::FailedPreconditionError(kNotInitializedMessage));
  }
  wire::PullRequest pull;
  if (absl::Status s = request.ParseHeader(&pull); !s.ok()) return responder.Respond(s);
  absl::StatusOr<std::vector<TableBlock>> table_pulls = m->tables->Decode(pull.table_pulls(), nullptr, 0);
  if (!table_pulls.ok()) return responder.Respond(table_pulls.status());
  if (pull.slices_size() > 0) {
    if (!table_pulls->empty()) {
      return responder.Respond(absl::InvalidArgumentError("table rows asked in a pull in parts"));
    }
    return HandlePullSlices(*m, pull, std::move(responder));
  }
  wire::PullResponse header;
  header.set_step(step_.load(std::memory_order_acquire));
  header.set_model_id(m->id);
  rpc::OutgoingMessage response = rpc::OutgoingMessage::Of(header);
  for (const std::string& name : pull.shards()) {
    auto it = m->by_name.find(name);
    if (it == m->by_name.end()) {
      return responder.Respond(absl::NotFoundError(absl::StrCat("no shard '", name, "' on this ps task")));
    }
    const Shard& shard = *it->second;
    auto add = [&](std::shared_ptr<const FloatBuffer> buffer) {
      rpc::OutgoingTensor t;
      t.meta.set_name(name);
      for (int64_t d : shard.shape()) t.meta.add_shape(d);
      t.data = buffer->data();
      t.num_floats = static_cast<int64_t>(buffer->size());
      t.owner = std::move(buffer);
      response.tensors.push_back(std::move(t));
    };
    if (!pull.with_slots()) {
      add(shard.Snapshot());
      response.tensors.back().meta.set_dtype(rpc::WireDtypeName(shard.wire_dtype()));  // --wire_dtype
      continue;
    }
    optim::SlotState state;
    add(shard.SnapshotWithState(&state));
    for (FloatBuffer& slot : state.slots) add(std::make_shared<const FloatBuffer>(std::move(slot)));
    header.add_updates(state.updates);
  }
  if (pull.with_slots()) response.header = header.SerializeAsString();
  if (absl::Status s = PsTables::AppendGathered(*table_pulls, &response); !s.ok()) return responder.Respond(s);
  responder.Respond(std::move(response));
}

void PsServer::Impl::HandlePullSlices(const Model& m, const wire::PullRequest& pull, rpc::Responder responder) {
  if (pull.shards_size() > 0) {
    return responder.Respond(absl::InvalidArgumentError("a pull asks for whole shards and slices at once"));
  }
  // A checkpoint's run carries each optimizer slot's same run after the values.
  const int tensors_per_run = 1 + (pull.with_slots() ? static_cast<int>(m.optimizer->slot_names().size()) : 0);
  std::vector<const Shard*> shards;
  int64_t floats = 0;
  for (const wire::ShardSlice& slice : pull.slices()) {
    auto it = m.by_name.find(slice.shard());
    if (it == m.by_name.end()) {
      return responder.Respond(absl::NotFoundError(absl::StrCat("no shard '", slice.shard(), "' on this ps task")));
    }
    const Shard& shard = *it->second;
    if (slice.offset() < 0 || slice.count() < 0 || slice.offset() > shard.size() - slice.count()) {
      return responder.Respond(absl::InvalidArgumentError(absl::StrCat("pull of elements ", slice.offset(), "..",
                                                                       slice.offset() + slice.count(), " of '",
                                                                       slice.shard(), "', which has ", shard.size())));
    }
    shards.push_back(&shard);
    floats += slice.count() * tensors_per_run;
  }
  // One buffer for the whole answer: a part's size repeats from step to step, so the tensor
  // allocator recycles it (src/core/tensor.cc) instead of caching a block per run size.
  // (Left uninitialized: every float is copied over.)
  auto buffer = std::make_shared<std::vector<float, UninitAlignedAllocator<float>>>(static_cast<size_t>(floats));
  wire::PullResponse header;
  header.set_step(step_.load(std::memory_order_acquire));
  header.set_model_id(m.id);
  rpc::OutgoingMessage response;
  float* out = buffer->data();
  for (int i = 0; i < pull.slices_size(); ++i) {
    const wire::ShardSlice& slice = pull.slices(i);
    const int64_t updates = shards[i]->CopySlice(slice.offset(), slice.count(), pull.with_slots(), out);
    for (int slot = 0; slot < tensors_per_run; ++slot, out += slice.count()) {
      rpc::OutgoingTensor t;
      t.meta.set_name(slice.shard());
      t.meta.add_shape(slice.count());
      t.meta.set_slice(true);
      t.meta.set_slice_offset(slice.offset());
      if (slot > 0) t.meta.set_slot(slot);
      if (!pull.with_slots()) t.meta.set_dtype(rpc::WireDtypeName(shards[i]->wire_dtype()));  // --wire_dtype
      t.data = out;
      t.num_floats = slice.count();
      t.owner = buffer;
      response.tensors.push_back(std::move(t));
    }
    if (pull.with_slots()) header.add_updates(updates);
  }
  response.header = header.SerializeAsString();
  responder.Respond(std::move(response));
}

void PsServer::Impl::HandleGoodbye(const rpc::IncomingMessage& request, rpc::Responder responder) {
  wire::GoodbyeRequest bye;
  if (absl::Status s = request.ParseHeader(&bye); !s.ok()) return responder.Respond(s);
  {
    absl::MutexLock lock(&mu_);
    connected_.erase(bye.client_id());
    if (!bye.failure().empty()) {
      worker_failure_ = absl::StrCat("worker ", bye.worker_index(), " gave up: ", bye.failure());
      Log(absl::StrCat(worker_failure_, " (", connected_.size(), " client(s) still connected)"));
    }
  }
  dedup_.Forget(bye.client_id());
  if (std::shared_ptr<const Model> m = model(); m != nullptr && m->config.sync) {
    // A departed worker no longer counts towards the quorum, so the others need not time out.
    sync_.Depart(bye.worker_index());
  }
  responder.Respond(rpc::OutgoingMessage::Of(wire::Empty()));
}

void PsServer::Impl::HandleShutdown(const rpc::IncomingMessage& request, rpc::Responder responder) {
  wire::ShutdownRequest shutdown;
  if (absl::Status s = request.ParseHeader(&shutdown); !s.ok()) return responder.Respond(s);
  std::vector<rpc::Responder> init_waiters;
  // An async ps that does not hold the global step counts nothing itself: it takes the final step
  // from the chief's message, so its logs and final stats say the real one.
  const std::shared_ptr<const Model> m = model();
  const bool counts_steps = m != nullptr && (m->config.sync || m->holds_global_step);
  {
    absl::MutexLock lock(&mu_);
    if (!shutdown_) {
      shutdown_ = true;
      shutdown_time_ = absl::Now();
      if (!counts_steps && shutdown.global_step() > step_.load()) step_.store(shutdown.global_step());
      finished_step_.store(step_.load());
      if (!shutdown.abort_reason().empty()) {
        abort_reason_ = shutdown.abort_reason();
        aborted_.store(true, std::memory_order_release);
        Log(absl::StrCat("the chief (worker ", shutdown.worker_index(), ") aborted the job at step ", step_.load(),
                         ": ", abort_reason_));
      } else {
        Log(absl::StrCat("training finished at step ", step_.load(), " (worker ", shutdown.worker_index(),
                         " called Shutdown)"));
      }
      shutdown_flag_.store(true, std::memory_order_release);
    }
    connected_.erase(shutdown.client_id());
    init_waiters.swap(init_waiters_);
  }
  sync_.Release(FinishedError());
  for (rpc::Responder& waiter : init_waiters) {
    waiter.Respond(absl::FailedPreconditionError("training finished before the variables were initialized"));
  }
  responder.Respond(rpc::OutgoingMessage::Of(wire::Empty()));
}

PsTaskStats PsServer::Impl::Stats() const {
  PsTaskStats stats;
  stats.task = options_.task_index;
  if (server_) {
    const rpc::ServerCounters counters = server_->counters();
    stats.bytes_in = counters.bytes_in;
    stats.bytes_out = counters.bytes_out;
    stats.calls_unauthenticated = counters.calls_unauthenticated;
  }
  if (std::shared_ptr<const Model> m = model()) {
    stats.num_params = m->num_params;
    stats.tables = m->tables->Stats();
  }
  stats.global_step = step_.load();
  stats.stale_gradients_dropped = sync_.stale_dropped();
  stats.pushes_refused = pushes_refused_.load();
  int64_t counted = 0;
  for (const std::atomic<int64_t>& n : staleness_) counted += n.load(std::memory_order_relaxed);
  if (counted > 0) {
    for (const std::atomic<int64_t>& n : staleness_)
      stats.staleness_counts.push_back(n.load(std::memory_order_relaxed));
  }
  {
    absl::MutexLock lock(&mu_);
    stats.connected_workers = static_cast<int64_t>(connected_.size());
    for (const auto& [client, worker] : connected_) stats.connected_worker_indices.push_back(worker);
  }
  std::sort(stats.connected_worker_indices.begin(), stats.connected_worker_indices.end());
  stats.connected_worker_indices.erase(
      std::unique(stats.connected_worker_indices.begin(), stats.connected_worker_indices.end()),
      stats.connected_worker_indices.end());
  for (int i = 0; i < num_pushed_flags_; ++i) {
    if (pushed_[i].load(std::memory_order_relaxed)) stats.pushed_worker_indices.push_back(i);
  }
  return stats;
}

void PsServer::Impl::HandleStats(rpc::Responder responder) {
  const PsTaskStats stats = Stats();
  {
    absl::MutexLock lock(&mu_);
    reported_ = stats;
  }
  responder.Respond(rpc::OutgoingMessage::Of(ToWire(stats)));
}

void PsServer::Impl::FailTask(const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  if (!task_failure_.ok()) return;
  task_failure_ = s;
  // The message names the ps task already.
  if (options_.log) {
    options_.log(std::string(s.message()));
  } else {
    std::cerr << s.message() << std::endl;
  }
}

absl::Status PsServer::Impl::GiveUpReason() const {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    if (!task_failure_.ok()) return task_failure_;  // a disk table's failure: the job cannot go on
  }
  {
    // Every worker left, one of them because it gave up: nobody is coming back to finish the job.
    absl::MutexLock lock(&mu_);
    if (!worker_failure_.empty() && connected_.empty()) {
      return absl::AbortedError(
          absl::StrCat("ps task ", options_.task_index, ": every worker left; ", worker_failure_));
    }
  }
  if (!initialized()) {
    // At start-up, and after Initialize began again (a restarted chief, or a restore): the chief's job.
    const absl::Time since = absl::FromUnixNanos(uninitialized_since_nanos_.load(std::memory_order_relaxed));
    if (options_.init_timeout_secs > 0 && now - since > absl::Seconds(options_.init_timeout_secs)) {
      return absl::DeadlineExceededError(absl::StrCat("ps task ", options_.task_index,
                                                      ": the chief (worker 0) did not initialize the variables within ",
                                                      options_.init_timeout_secs,
                                                      " s; start worker 0 (it restores the last checkpoint), or raise "
                                                      "--init_timeout_secs"));
    }
    return absl::OkStatus();
  }
  if (options_.idle_timeout_secs <= 0) return absl::OkStatus();
  const absl::Time last = absl::FromUnixNanos(last_call_nanos_.load(std::memory_order_relaxed));
  if (now - last > absl::Seconds(options_.idle_timeout_secs)) {
    return absl::DeadlineExceededError(absl::StrCat("ps task ", options_.task_index, ": no call from any worker for ",
                                                    options_.idle_timeout_secs, " s (global step ", step_.load(),
                                                    "); the workers are gone: restart them (the chief resumes from the "
                                                    "last checkpoint), or raise --worker_timeout_secs"));
  }
  return absl::OkStatus();
}

void PsServer::Impl::DropIdleScans() {
  if (options_.table_scan_timeout_secs <= 0) return;
  std::shared_ptr<const Model> m = model();
  if (m == nullptr || m->tables == nullptr) return;
  for (const std::string& line : m->tables->DropIdleScans(absl::Now(), absl::Seconds(options_.table_scan_timeout_secs),
                                                          "--table_scan_timeout_secs")) {
    Log(line);
  }
}

absl::Status PsServer::Impl::Wait() {
  absl::Status result;
  // Woken every second to check the bounds on waiting for the workers (between lock scopes:
  // GiveUpReason may take mu_ itself).
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(this, &Impl::ShutdownOrStopped), absl::Seconds(1))) break;
    }
    DropIdleScans();
    absl::Status give_up = GiveUpReason();
    absl::MutexLock lock(&mu_);
    if (!give_up.ok() && !shutdown_ && !stopped_) {
      result = give_up;  // the caller reports it (the task's process exits with it)
      break;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    const bool aborted = result.ok() && aborted_.load();
    if (aborted) result = absl::AbortedError(abort_reason_);
    // After the chief's Shutdown (or abort), the workers still calling are told, until they leave.
    if ((result.ok() || aborted) && !stopped_) {
      const absl::Time give_up = shutdown_time_ + absl::Seconds(options_.shutdown_grace_secs);
      if (!mu_.AwaitWithDeadline(absl::Condition(this, &Impl::DoneWaiting), give_up)) {
        const int never = options_.cluster.num_workers() - static_cast<int>(greeted_.size());
        Log(absl::StrCat(connected_.size(), " worker(s) did not say goodbye and ", std::max(never, 0),
                         " never connected within ", options_.shutdown_grace_secs,
                         " s of the shutdown; exiting anyway"));
      }
    }
  }
  Stop();
  return result;
}

void PsServer::Impl::Stop() {
  std::vector<rpc::Responder> init_waiters;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    init_waiters.swap(init_waiters_);
  }
  for (rpc::Responder& waiter : init_waiters) waiter.Respond(absl::UnavailableError("ps task is stopping"));
  sync_.Release(absl::UnavailableError("ps task is stopping"));
  // Calls that slipped in meanwhile are cancelled by the server's shutdown grace.
  if (server_) server_->Shutdown(0.5);
}

// ---------------------------------------------------------------------------------------------

PsServer::PsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PsServer::~PsServer() = default;

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(Options options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status s = impl->Start(); !s.ok()) return s;
  return std::unique_ptr<PsServer>(new PsServer(std::move(impl)));
}

absl::Status PsServer::Wait() { return impl_->Wait(); }
void PsServer::Stop() { impl_->Stop(); }
PsTaskStats PsServer::Stats() const { return impl_->Stats(); }
std::optional<PsTaskStats> PsServer::ReportedStats() const { return impl_->ReportedStats(); }
PsServer::SyncTiming PsServer::sync_timing() const {
  const SyncAccumulator::Timing t = impl_->sync_timing();
  return {t.steps, t.pushes, t.wait_secs, t.spread_secs, t.apply_secs, t.answer_secs};
}
int PsServer::port() const { return impl_->port(); }

}  // namespace psflow::ps
