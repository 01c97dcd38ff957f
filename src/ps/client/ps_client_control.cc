// PsClient: connecting to the ps tasks and the control calls (the chief's Initialize and restores,
// PullState, WaitForInitialization, IsInitialized, Goodbye, Shutdown, Abort, Stats). The data path
// (Pull, Push) is in ps_client.cc, the shared state in ps/client/ps_client_impl.h.
#include <algorithm>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "core/check.h"
#include "core/random_id.h"
#include "proto/psflow.pb.h"
#include "ps/client/ps_client_impl.h"
#include "ps/client/routing.h"
#include "ps/client/snapshot_validation.h"
#include "ps/common/wire_config.h"

namespace psflow::ps {
namespace {

// "name[d0,d1]" lines of a model signature; the variable name of the first differing line.
std::string FirstDifferingVariable(const std::string& ours, const std::string& theirs) {
  std::vector<std::string> a = absl::StrSplit(ours, '\n', absl::SkipEmpty());
  std::vector<std::string> b = absl::StrSplit(theirs, '\n', absl::SkipEmpty());
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string& x = i < a.size() ? a[i] : b[i];
    if (i >= a.size() || i >= b.size() || a[i] != b[i]) {
      return absl::StrCat("'", x.substr(0, x.find('[')), "' is ", i < a.size() ? a[i] : "absent", " here but ",
                          i < b.size() ? b[i] : "absent", " on the ps");
    }
  }
  return "the variable lists are equal but their fingerprints differ";
}

}  // namespace

PsClient::Impl::Impl(Options options) : options_(std::move(options)), client_id_(RandomNonZeroId()) {}

absl::Status PsClient::Impl::Init() {
  absl::StatusOr<rpc::WireDtype> wire_dtype = rpc::ParseWireDtype(options_.wire_dtype);
  if (!wire_dtype.ok())
    return absl::InvalidArgumentError(absl::StrCat("--wire_dtype: ", wire_dtype.status().message()));
  wire_dtype_ = *wire_dtype;
  const dist::PlacementPlan& plan = options_.plan;
  if (plan.num_ps != options_.cluster.num_ps()) {
    return absl::InvalidArgumentError(absl::StrCat("the placement plan is for ", plan.num_ps,
                                                   " ps tasks but the cluster has ", options_.cluster.num_ps()));
  }
  if (plan.num_ps < 1 || plan.global_step_ps < 0 || plan.global_step_ps >= plan.num_ps) {
    return absl::InvalidArgumentError("the placement plan has no valid ps task for the global step");
  }
  for (const dist::VariableSpec& v : plan.variables) {
    VariableRoute& route = routes_[v.name];
    route.spec = v;
    for (const dist::ShardSpec* s : plan.ShardsOf(v.name)) {
      if (s->ps_task < 0 || s->ps_task >= plan.num_ps) {
        return absl::InvalidArgumentError(
            absl::StrCat("shard '", s->name, "' is placed on ps task ", s->ps_task, " of ", plan.num_ps));
      }
      route.shards.push_back(*s);
    }
  }
  for (int k = 0; k < plan.num_ps; ++k) {
    const std::string& address = options_.cluster.ps()[k];
    absl::StatusOr<std::unique_ptr<rpc::ClientChannel>> channel =
        rpc::MakeChannel(address, absl::StrCat("ps task ", k, " (", address, ")"), options_.security, wire_dtype_);
    if (!channel.ok()) return channel.status();
    channels_.push_back(*std::move(channel));
  }
  reached_ = std::make_unique<std::atomic<bool>[]>(channels_.size());
  model_ids_ = std::make_unique<std::atomic<uint64_t>[]>(channels_.size());
  std::vector<const rpc::ClientChannel*> all(channels_.size());
  for (size_t k = 0; k < channels_.size(); ++k) all[k] = channels_[k].get();
  retrier_ = std::make_unique<Retrier>(std::move(all), options_.ps_unavailable_timeout_secs, options_.log);
  return absl::OkStatus();
}

void PsClient::Impl::Log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::cerr << line << std::endl;
  }
}

absl::Status PsClient::Impl::CallEveryPs(rpc::Method method, const google::protobuf::MessageLite& header,
                                         double timeout,
                                         std::function<absl::Status(int, const rpc::IncomingMessage&)> on_response,
                                         bool retry, double budget_secs) {
  std::vector<rpc::OutgoingMessage> requests(channels_.size(), rpc::OutgoingMessage::Of(header));
  return CallAndWait(AllChannels(), method, std::move(requests), Control(timeout), std::move(on_response),
                     retry ? retrier_.get() : nullptr, {}, budget_secs);
}

absl::Status PsClient::Impl::ConnectOne(int k) {
  wire::HelloRequest hello;
  hello.set_worker_index(options_.worker_index);
  hello.set_client_id(client_id_);
  hello.set_cluster_fingerprint(options_.cluster.Fingerprint());
  hello.set_cluster_text(options_.cluster.ToString());
  hello.set_wire_protocol(kWireProtocol);
  const double limit = options_.connect_timeout_secs;
  RetryOptions retry;
  retry.peer = channel(k)->peer_name();
  retry.what = "Hello";
  retry.budget_secs = limit;
  retry.budget_flag = "--ps_timeout_secs";
  retry.log = retrier_->silences();
  retry.quiet_secs = 1;  // a ps that comes up within a second is not worth a line
  retry.give_up = [this, k, limit](const std::string& why, const absl::Status&) {
    const bool hinted = absl::StrContains(why, "is the task running") || absl::StrContains(why, "--tls_");
    return absl::DeadlineExceededError(absl::StrCat("could not reach ", channel(k)->peer_name(), " within ", limit,
                                                    " s", hinted ? "" : " (is it running, and is the address right?)",
                                                    ": ", why));
  };
  // Not wait_for_ready: a call failing fast says why (refused, TLS handshake, ...), and the retries
  // wait for the ps to come up (the channel reconnects at most 1 s apart, grpc_options.cc). A
  // refusal (secret, cluster, ...) ends the wait at once: waiting would not help.
  absl::Status s = RetryBlocking(retry, [&](double left) -> absl::Status {
    absl::StatusOr<rpc::IncomingMessage> answer =
        channel(k)->CallBlocking(rpc::Method::kHello, rpc::OutgoingMessage::Of(hello), Control(std::min(left, 5.0)));
    if (!answer.ok()) return answer.status();
    wire::HelloResponse response;
    if (absl::Status p = Parse(*answer, &response, channel(k)->peer_name()); !p.ok()) return p;
    // A ps of an older build does not refuse this worker (it ignores the field): refuse it here.
    if (response.wire_protocol() != kWireProtocol) {
      return absl::FailedPreconditionError(
          absl::StrCat("wire protocol mismatch: ", channel(k)->peer_name(), " speaks psflow wire protocol ",
                       response.wire_protocol(), " but this worker speaks ", kWireProtocol,
                       " (0: a build from before 2026-11-28); start every task from the same psflow build"));
    }
    return absl::OkStatus();
  });
  if (s.ok()) reached_[k] = true;
  return s;
}

absl::Status PsClient::Impl::Connect() {
  std::vector<absl::Status> statuses(channels_.size());
  std::vector<std::thread> threads;
  for (int k = 0; k < num_ps(); ++k) threads.emplace_back([this, k, &statuses] { statuses[k] = ConnectOne(k); });
  for (std::thread& t : threads) t.join();
  return Combine(statuses);
}

absl::Status PsClient::Impl::Initialize(const std::vector<std::pair<std::string, const Tensor*>>& variables,
                                        const TrainingConfig& config) {
  absl::flat_hash_map<std::string, const Tensor*> given;
  for (const auto& [name, tensor] : variables) {
    auto it = routes_.find(name);
    if (it == routes_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize: '", name, "' is not a variable of the plan"));
    }
    if (tensor == nullptr || tensor->shape() != it->second.spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize: '", name, "' has shape ",
                                                     tensor ? ShapeToString(tensor->shape()) : "null",
                                                     " but the plan says ", ShapeToString(it->second.spec.shape)));
    }
    if (!given.emplace(name, tensor).second) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize: '", name, "' given twice"));
    }
  }
  for (const auto& v : options_.plan.variables) {
    if (!given.contains(v.name)) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize: no initial value for variable '", v.name, "'"));
    }
  }
  absl::flat_hash_map<std::string, InitSource> sources;
  for (const auto& [name, tensor] : given) sources[name] = {tensor, nullptr, 0};
  return InitializeTasks(AllTasks(), sources, /*with_slots=*/false, config);
}

absl::Status PsClient::Impl::Initialize(const ModelSnapshot& state, TrainingConfig config,
                                        const std::vector<int>& tasks) {
  return Initialize(state, std::move(config), tasks, nullptr);
}

absl::Status PsClient::Impl::Initialize(const ModelSnapshot& state, TrainingConfig config,
                                        const std::vector<int>& tasks,
                                        const std::vector<std::pair<std::string, TablePartSource>>* tables) {
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> optimizer = optim::MakeOptimizer(config.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  if (absl::Status s = ValidateSnapshot(state, options_.plan, (*optimizer)->slot_names().size()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Initialize from a checkpoint: ", s.message()));
  }
  absl::flat_hash_map<std::string, InitSource> sources;
  for (const VariableSnapshot& v : state.variables) sources[v.name] = {&v.value, &v.slots, v.updates};
  config.initial_global_step = state.global_step;
  return InitializeTasks(tasks, sources, /*with_slots=*/true, config, tables);
}

absl::Status PsClient::Impl::InitializeTasks(const std::vector<int>& tasks,
                                             const absl::flat_hash_map<std::string, InitSource>& given, bool with_slots,
                                             const TrainingConfig& given_config,
                                             const std::vector<std::pair<std::string, TablePartSource>>* tables) {
  // The plan's tables, declared to every ps task (never their values: each ps computes its rows).
  TrainingConfig config = given_config;
  config.tables.clear();
  for (const dist::TablePlacement& t : options_.plan.tables) {
    config.tables.push_back({t.spec, t.layout.num_shards});
  }
  const wire::TrainingConfig config_wire = ToWire(config);
  const std::string signature = options_.plan.ModelSignature();
  const uint64_t fingerprint = options_.plan.ModelFingerprint();
  // Each ps task's tensors: its shards' values (and, restoring, each shard's slots after it).
  std::vector<rpc::ClientChannel*> channels;
  std::vector<wire::InitializeRequest> headers;
  std::vector<std::vector<std::vector<rpc::OutgoingTensor>>> parts;  // [task][part]
  size_t num_rounds = 1;
  for (int k : tasks) {
    wire::InitializeRequest init;
    init.set_worker_index(options_.worker_index);
    *init.mutable_config() = config_wire;
    init.set_model_signature(signature);
    init.set_model_fingerprint(fingerprint);
    init.set_holds_global_step(k == gs_ps());
    init.set_with_slots(with_slots);
    init.set_client_id(client_id_);
    for (const dist::TablePlacement& t : options_.plan.tables) {
      for (const dist::TableShardSpec& shard : t.shards) {
        if (shard.ps_task != k) continue;
        wire::TableShardInfo* info = init.add_table_shards();
        info->set_table(t.spec.name);
        info->set_shard(shard.shard_index);
        info->set_num_ps(num_ps());
      }
    }
    std::vector<rpc::OutgoingTensor> tensors;
    for (const dist::ShardSpec* shard : options_.plan.ShardsOn(k)) {
      const InitSource& source = given.at(shard->variable);
      wire::ShardInfo* info = init.add_shards();
      info->set_name(shard->name);
      info->set_variable(shard->variable);
      for (int64_t d : shard->shape) info->add_shape(d);
      info->set_updates(source.updates);
      tensors.push_back(ShardOf(*source.value, *shard));
      if (with_slots) {
        for (size_t j = 0; j < source.slots->size(); ++j) {
          tensors.push_back(ShardOf((*source.slots)[j], *shard));
          tensors.back().meta.set_slot(static_cast<int>(j) + 1);  // 0 is the values
        }
      }
    }
    channels.push_back(channel(k));
    headers.push_back(std::move(init));
    // A big model goes in parts (ps/client/call_parts.h, src/ps/server/ps_initialize.cc).
    parts.push_back(options_.max_part_bytes > 0 ? SplitIntoParts(std::move(tensors), options_.max_part_bytes)
                                                : std::vector<std::vector<rpc::OutgoingTensor>>{std::move(tensors)});
    num_rounds = std::max(num_rounds, parts.back().size());
  }
  // One id per part for it and its retries; the parts of one Initialize share its first.
  const uint64_t first_seq = next_seq_.fetch_add(num_rounds);
  absl::Status s;
  for (size_t p = 0; p < num_rounds && s.ok(); ++p) {
    std::vector<rpc::ClientChannel*> round_channels;
    std::vector<rpc::OutgoingMessage> requests;
    for (size_t i = 0; i < channels.size(); ++i) {
      if (p >= parts[i].size()) continue;
      wire::InitializeRequest init = headers[i];
      init.set_seq(first_seq + p);
      if (parts[i].size() > 1) {
        init.set_first_seq(first_seq);
        init.set_more_parts(p + 1 < parts[i].size());
      }
      rpc::OutgoingMessage message;
      message.header = init.SerializeAsString();
      message.tensors = std::move(parts[i][p]);
      round_channels.push_back(channels[i]);
      requests.push_back(std::move(message));
    }
    s = CallAndWait(round_channels, rpc::Method::kInitialize, std::move(requests), Control(options_.rpc_timeout_secs),
                    nullptr, retrier_.get());
  }
  if (!s.ok()) return s;
  if (tables != nullptr) {
    for (const auto& [name, source] : *tables) {
      if (absl::Status t = LoadTable(name, source); !t.ok()) return t;
    }
  }
  SetConfig(config);
  // This client installed the tasks' new models itself: its pushes to them go unchecked until an
  // answer names the new model (another client's push from before is refused: PushRequest.model_id).
  for (int k : tasks) model_ids_[k].store(0, std::memory_order_relaxed);
  std::vector<rpc::OutgoingMessage> marks(channels.size(), rpc::OutgoingMessage::Of(wire::MarkInitializedRequest()));
  return CallAndWait(channels, rpc::Method::kMarkInitialized, std::move(marks), Control(options_.rpc_timeout_secs),
                     nullptr, retrier_.get());
}

absl::StatusOr<ModelSnapshot> PsClient::Impl::PullState() {
  CHECK(!rpc::OnTransportThread()) << "PullState from an async completion callback would deadlock";
  // The snapshot's tensors are allocated first and each answer (or part of one) is copied into
  // them as it arrives, so the state is held once, plus a part in flight.
  const int64_t num_slots = SlotCount();
  ModelSnapshot state;
  absl::flat_hash_map<std::string, VariableSnapshot*> by_name;
  state.variables.reserve(options_.plan.variables.size());
  for (const dist::VariableSpec& v : options_.plan.variables) {
    VariableSnapshot& snapshot = state.variables.emplace_back();
    snapshot.name = v.name;
    snapshot.value = Tensor(v.shape);
    snapshot.slots.reserve(static_cast<size_t>(num_slots));
    // Each its own tensor (assign() would copy a temporary one as big as the variable).
    for (int64_t s = 0; s < num_slots; ++s) snapshot.slots.emplace_back(v.shape);
    by_name[v.name] = &snapshot;
  }
  std::vector<int64_t> shard_updates(options_.plan.shards.size(), 0);
  auto targets = std::make_shared<Targets>(channels_.size());
  for (size_t s = 0; s < options_.plan.shards.size(); ++s) {
    const dist::ShardSpec& shard = options_.plan.shards[s];
    VariableSnapshot* v = by_name.at(shard.variable);
    (*targets)[shard.ps_task].push_back(
        {{&shard, &v->value, &v->slots, &shard_updates[s]}, 0, NumElements(shard.shape)});
  }
  absl::Notification done;
  absl::StatusOr<PushResult> pulled;
  SendPull(std::move(targets), /*with_slots=*/true, 1 + num_slots, [&](absl::StatusOr<PushResult> r) {
    pulled = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  if (!pulled.ok()) return pulled.status();
  state.global_step = pulled->global_step;
  // A variable split into shards has each shard's count; they agree unless a push was under way.
  for (size_t s = 0; s < options_.plan.shards.size(); ++s) {
    VariableSnapshot* v = by_name.at(options_.plan.shards[s].variable);
    v->updates = std::max(v->updates, shard_updates[s]);
  }
  return state;
}

absl::Status PsClient::Impl::WaitForInitialization(double timeout_secs) {
  std::vector<wire::WaitInitializedResponse> responses(channels_.size());
  // A long poll: not retried here (the caller polls in slices until its own bound).
  absl::Status s = CallEveryPs(
      rpc::Method::kWaitInitialized, wire::WaitInitializedRequest(), timeout_secs,
      [&](int k, const rpc::IncomingMessage& r) { return Parse(r, &responses[k], channel(k)->peer_name()); },
      /*retry=*/false);
  if (absl::IsDeadlineExceeded(s)) {
    // Name the first ps task that is still uninitialized.
    std::string where = channel(0)->peer_name();
    for (int k = 0; k < num_ps(); ++k) {
      if (!responses[k].has_config()) {
        where = channel(k)->peer_name();
        break;
      }
    }
    return absl::DeadlineExceededError(
        absl::StrCat("waited ", timeout_secs, " s for the chief (worker 0) to initialize the variables on ", where));
  }
  if (!s.ok()) return s;
  for (int k = 0; k < num_ps(); ++k) {
    const wire::WaitInitializedResponse& r = responses[k];
    if (r.model_fingerprint() != options_.plan.ModelFingerprint()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", options_.worker_index, " builds a different model than the chief: ",
                       FirstDifferingVariable(options_.plan.ModelSignature(), r.model_signature()), " (",
                       channel(k)->peer_name(), "); start every task with the same model flags"));
    }
    const std::vector<const dist::ShardSpec*> ours = options_.plan.ShardsOn(k);
    bool same = static_cast<int>(ours.size()) == r.shards_size();
    for (size_t i = 0; same && i < ours.size(); ++i) {
      same = ours[i]->name == r.shards(i).name() &&
             ours[i]->shape == Shape(r.shards(i).shape().begin(), r.shards(i).shape().end());
    }
    if (!same) {
      return absl::FailedPreconditionError(
          absl::StrCat(channel(k)->peer_name(),
                       " holds different shards than this worker's placement plan expects; start "
                       "every task with the same --partitioner and --placement"));
    }
  }
  absl::StatusOr<TrainingConfig> config = FromWire(responses[0].config());
  if (!config.ok()) return config.status();
  SetConfig(*std::move(config));
  return absl::OkStatus();
}

absl::StatusOr<bool> PsClient::Impl::IsInitialized() {
  wire::HelloRequest hello;
  hello.set_probe(true);
  hello.set_worker_index(options_.worker_index);
  hello.set_wire_protocol(kWireProtocol);
  std::vector<bool> initialized(channels_.size(), false);
  absl::Status s =
      CallEveryPs(rpc::Method::kHello, hello, options_.rpc_timeout_secs, [&](int k, const rpc::IncomingMessage& r) {
        wire::HelloResponse response;
        absl::Status p = Parse(r, &response, channel(k)->peer_name());
        initialized[k] = response.initialized();
        return p;
      });
  if (!s.ok()) return s;
  return std::all_of(initialized.begin(), initialized.end(), [](bool b) { return b; });
}

absl::Status PsClient::Impl::Goodbye(const std::string& failure) {
  wire::GoodbyeRequest bye;
  bye.set_worker_index(options_.worker_index);
  bye.set_client_id(client_id_);
  bye.set_failure(failure);
  // Leaving is retried for one deadline at most: a worker that is done should not linger.
  return CallEveryPs(rpc::Method::kGoodbye, bye, options_.rpc_timeout_secs, nullptr, /*retry=*/true,
                     std::min(options_.rpc_timeout_secs, options_.ps_unavailable_timeout_secs));
}

absl::Status PsClient::Impl::Shutdown() {
  wire::ShutdownRequest shutdown;
  shutdown.set_worker_index(options_.worker_index);
  shutdown.set_client_id(client_id_);
  shutdown.set_global_step(last_global_step_.load());
  return CallEveryPs(rpc::Method::kShutdown, shutdown, options_.rpc_timeout_secs);
}

void PsClient::Impl::Abort(const std::string& reason, double timeout_secs) {
  wire::ShutdownRequest shutdown;
  shutdown.set_worker_index(options_.worker_index);
  shutdown.set_client_id(client_id_);
  shutdown.set_global_step(last_global_step_.load());
  shutdown.set_abort_reason(reason);
  if (timeout_secs < 0) timeout_secs = options_.ps_unavailable_timeout_secs;
  // Retried for up to the same bound as every call, so a ps that is silent for a while still
  // learns that the job is over; sent only to the tasks this client reached (one it never reached
  // learns nothing from it, and would cost a second wait of the whole bound).
  std::vector<rpc::ClientChannel*> reached;
  for (size_t k = 0; k < channels_.size(); ++k) {
    if (reached_[k].load()) reached.push_back(channels_[k].get());
  }
  std::vector<rpc::OutgoingMessage> requests(reached.size(), rpc::OutgoingMessage::Of(shutdown));
  (void)CallAndWait(reached, rpc::Method::kShutdown, std::move(requests),
                    Control(std::min(options_.rpc_timeout_secs, timeout_secs)), nullptr, retrier_.get(), {},
                    timeout_secs);
}

absl::StatusOr<std::vector<PsTaskStats>> PsClient::Impl::Stats() {
  std::vector<PsTaskStats> stats(channels_.size());
  absl::Status s = CallEveryPs(rpc::Method::kStats, wire::StatsRequest(), options_.rpc_timeout_secs,
                               [&](int k, const rpc::IncomingMessage& r) {
                                 wire::StatsResponse w;
                                 if (absl::Status p = Parse(r, &w, channel(k)->peer_name()); !p.ok()) return p;
                                 stats[k] = FromWire(w);
                                 return absl::OkStatus();
                               });
  if (!s.ok()) return s;
  return stats;
}

absl::StatusOr<WorkQueueAnswer> PsClient::Impl::CallWorkQueue(const WorkQueueCall& call) {
  wire::WorkQueueRequest request;
  switch (call.op) {
    case WorkQueueCall::Op::kNext:
      request.set_op(wire::WorkQueueRequest::NEXT);
      break;
    case WorkQueueCall::Op::kConfigure:
      request.set_op(wire::WorkQueueRequest::CONFIGURE);
      break;
    case WorkQueueCall::Op::kState:
      request.set_op(wire::WorkQueueRequest::STATE);
      break;
    case WorkQueueCall::Op::kRelease:
      request.set_op(wire::WorkQueueRequest::RELEASE);
      break;
  }
  request.set_worker_index(options_.worker_index);
  request.set_seq(call.seq);
  request.set_fresh(call.fresh);
  request.set_examples(call.examples);
  request.set_bad_lines(call.bad_lines);
  request.set_state_json(call.state_json);
  request.set_replace(call.replace);
  wire::WorkQueueResponse w;
  std::vector<rpc::OutgoingMessage> requests;
  requests.push_back(rpc::OutgoingMessage::Of(request));
  absl::Status s = CallAndWait(
      {channel(0)}, rpc::Method::kWorkQueue, std::move(requests), Control(options_.rpc_timeout_secs),
      [&](int, const rpc::IncomingMessage& r) { return Parse(r, &w, channel(0)->peer_name()); }, retrier_.get());
  if (!s.ok()) return s;
  WorkQueueAnswer a;
  a.configured = w.configured();
  a.end = w.end();
  a.epoch = w.epoch();
  a.slice = w.slice();
  a.path = w.path();
  a.begin = w.begin();
  a.end_offset = w.end_offset();
  a.state_json = w.state_json();
  a.held = w.held();
  a.holders.assign(w.holders().begin(), w.holders().end());
  a.handed = w.handed();
  a.total = w.total();
  a.returned = w.returned();
  a.at_end = w.at_end();
  a.examples = w.examples();
  a.bad_lines = w.bad_lines();
  a.epoch_now = w.epoch_now();
  return a;
}

int64_t PsClient::Impl::SlotCount() const {
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> optimizer = optim::MakeOptimizer(GetConfig().optimizer);
  return optimizer.ok() ? static_cast<int64_t>((*optimizer)->slot_names().size()) : 2;
}

}  // namespace psflow::ps
