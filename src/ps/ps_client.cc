// PsClient: a worker's calls to every ps task, fanned out in parallel over rpc::ClientChannel.
#include "psflow/ps/ps_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <optional>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "proto/psflow.pb.h"
#include "ps/client_state.h"
#include "ps/fan_out.h"
#include "ps/push_parts.h"
#include "ps/routing.h"
#include "ps/wait_heartbeat.h"
#include "ps/wire_config.h"
#include "core/check.h"
#include "rpc/transport.h"

namespace psflow::ps {
namespace {

constexpr char kNoBlockingInCallbacks[] =
    "a blocking PsClient call from an async completion callback would deadlock; use the *Async variant";

struct VariableRoute {
  dist::VariableSpec spec;
  std::vector<dist::ShardSpec> shards;  // in shard order
};

absl::Status Parse(const rpc::IncomingMessage& response, google::protobuf::MessageLite* header,
                   const std::string& peer) {
  absl::Status s = response.ParseHeader(header);
  if (!s.ok()) return absl::DataLossError(absl::StrCat(peer, ": ", s.message()));
  return absl::OkStatus();
}

// "name[d0,d1]" lines of a model signature; the variable name of the first differing line.
std::string FirstDifferingVariable(const std::string& ours, const std::string& theirs) {
  std::vector<std::string> a = absl::StrSplit(ours, '\n', absl::SkipEmpty());
  std::vector<std::string> b = absl::StrSplit(theirs, '\n', absl::SkipEmpty());
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string& x = i < a.size() ? a[i] : b[i];
    if (i >= a.size() || i >= b.size() || a[i] != b[i]) {
      return absl::StrCat("'", x.substr(0, x.find('[')), "' is ", i < a.size() ? a[i] : "absent",
                          " here but ", i < b.size() ? b[i] : "absent", " on the ps");
    }
  }
  return "the variable lists are equal but their fingerprints differ";
}

uint64_t RandomClientId() {
  std::random_device device;
  const uint64_t high = device();
  return (high << 32) ^ device() ^
         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

}  // namespace

class PsClient::Impl {
 public:
  explicit Impl(Options options) : options_(std::move(options)), client_id_(RandomClientId()) {}

  absl::Status Init() {
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
          return absl::InvalidArgumentError(absl::StrCat("shard '", s->name, "' is placed on ps task ",
                                                         s->ps_task, " of ", plan.num_ps));
        }
        route.shards.push_back(*s);
      }
    }
    for (int k = 0; k < plan.num_ps; ++k) {
      const std::string& address = options_.cluster.ps()[k];
      absl::StatusOr<std::unique_ptr<rpc::ClientChannel>> channel =
          rpc::MakeChannel(address, absl::StrCat("ps task ", k, " (", address, ")"), options_.security);
      if (!channel.ok()) return channel.status();
      channels_.push_back(*std::move(channel));
    }
    std::vector<const rpc::ClientChannel*> all(channels_.size());
    for (size_t k = 0; k < channels_.size(); ++k) all[k] = channels_[k].get();
    retrier_ = std::make_unique<Retrier>(std::move(all), options_.ps_unavailable_timeout_secs, options_.log);
    return absl::OkStatus();
  }

  void Log(const std::string& line) const {
    if (options_.log) {
      options_.log(line);
    } else {
      std::cerr << line << std::endl;
    }
  }

  int num_ps() const { return static_cast<int>(channels_.size()); }
  int gs_ps() const { return options_.plan.global_step_ps; }
  rpc::ClientChannel* channel(int k) const { return channels_[k].get(); }
  std::vector<rpc::ClientChannel*> AllChannels() const {
    std::vector<rpc::ClientChannel*> all;
    for (const auto& c : channels_) all.push_back(c.get());
    return all;
  }
  rpc::CallOptions Control(double timeout) const {
    rpc::CallOptions o;
    o.timeout_secs = timeout;
    return o;
  }

  // Runs the same request on every ps and waits; with `retry`, retrying silent tasks for up to
  // `budget_secs` (negative: --ps_timeout_secs).
  absl::Status CallEveryPs(rpc::Method method, const google::protobuf::MessageLite& header, double timeout,
                           std::function<absl::Status(int, const rpc::IncomingMessage&)> on_response = nullptr,
                           bool retry = true, double budget_secs = -1) {
    std::vector<rpc::OutgoingMessage> requests(channels_.size(), rpc::OutgoingMessage::Of(header));
    return CallAndWait(AllChannels(), method, std::move(requests), Control(timeout), std::move(on_response),
                       retry ? retrier_.get() : nullptr, {}, budget_secs);
  }

  static absl::Status CallAndWait(const std::vector<rpc::ClientChannel*>& channels, rpc::Method method,
                                  std::vector<rpc::OutgoingMessage> requests, const rpc::CallOptions& options,
                                  std::function<absl::Status(int, const rpc::IncomingMessage&)> on_response,
                                  Retrier* retrier = nullptr, std::vector<int64_t> answer_bytes = {},
                                  double budget_secs = -1) {
    CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
    absl::Notification done;
    absl::Status result;
    CallAll(channels, method, std::move(requests), options, std::move(on_response),
            [&](std::vector<absl::Status>& statuses) {
              result = Combine(statuses);
              done.Notify();
            },
            retrier, std::move(answer_bytes), budget_secs);
    done.WaitForNotification();
    return result;
  }

  absl::Status ConnectOne(int k) {
    wire::HelloRequest hello;
    hello.set_worker_index(options_.worker_index);
    hello.set_client_id(client_id_);
    hello.set_cluster_fingerprint(options_.cluster.Fingerprint());
    hello.set_cluster_text(options_.cluster.ToString());
    const auto start = std::chrono::steady_clock::now();
    const double limit = options_.connect_timeout_secs;
    absl::Status last;
    double backoff = 0.1;
    double next_report = 1;  // a ps that comes up within a second is not worth a line
    for (;;) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (elapsed >= limit && !last.ok()) {
        const bool hinted = absl::StrContains(last.message(), "is the task running") ||
                            absl::StrContains(last.message(), "--tls_");
        return absl::DeadlineExceededError(absl::StrCat(
            "could not reach ", channel(k)->peer_name(), " within ", limit, " s",
            hinted ? "" : " (is it running, and is the address right?)", ": ", last.message()));
      }
      // Not wait_for_ready: a call failing fast says why (refused, TLS handshake, ...), and the loop
      // waits for the ps to come up (the channel reconnects at most 1 s apart, grpc_options.cc).
      const rpc::CallOptions o = Control(std::max(0.05, std::min(limit - elapsed, 5.0)));
      absl::StatusOr<rpc::IncomingMessage> response =
          channel(k)->CallBlocking(rpc::Method::kHello, rpc::OutgoingMessage::Of(hello), o);
      if (response.ok()) return absl::OkStatus();
      if (!absl::IsUnavailable(response.status()) && !absl::IsDeadlineExceeded(response.status())) {
        return response.status();  // refused (secret, cluster, ...): waiting would not help
      }
      last = response.status();
      const std::string prefix = channel(k)->peer_name() + ": ";
      if (absl::StartsWith(last.message(), prefix)) {
        last = absl::Status(last.code(), last.message().substr(prefix.size()));
      }
      // Say what is waited for, at once and then every 10 s, rather than being silent until the bound.
      if (elapsed >= next_report) {
        Log(absl::StrCat("waiting for ", channel(k)->peer_name(), " (", static_cast<int>(elapsed), " s of ",
                         limit, "): ", last.message()));
        next_report = elapsed + 10;
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, 1.0);
    }
  }

  absl::Status Connect() {
    std::vector<absl::Status> statuses(channels_.size());
    std::vector<std::thread> threads;
    for (int k = 0; k < num_ps(); ++k) threads.emplace_back([this, k, &statuses] { statuses[k] = ConnectOne(k); });
    for (std::thread& t : threads) t.join();
    return Combine(statuses);
  }

  absl::Status Initialize(const std::vector<std::pair<std::string, const Tensor*>>& variables,
                          const TrainingConfig& config) {
    absl::flat_hash_map<std::string, const Tensor*> given;
    for (const auto& [name, tensor] : variables) {
      auto it = routes_.find(name);
      if (it == routes_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("Initialize: '", name, "' is not a variable of the plan"));
      }
      if (tensor == nullptr || tensor->shape() != it->second.spec.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Initialize: '", name, "' has shape ", tensor ? ShapeToString(tensor->shape()) : "null",
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

  absl::Status Initialize(const ModelSnapshot& state, TrainingConfig config, const std::vector<int>& tasks) {
    absl::StatusOr<std::unique_ptr<optim::Optimizer>> optimizer = optim::MakeOptimizer(config.optimizer);
    if (!optimizer.ok()) return optimizer.status();
    if (absl::Status s = ValidateSnapshot(state, options_.plan, (*optimizer)->slot_names().size()); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize from a checkpoint: ", s.message()));
    }
    absl::flat_hash_map<std::string, InitSource> sources;
    for (const VariableSnapshot& v : state.variables) sources[v.name] = {&v.value, &v.slots, v.updates};
    config.initial_global_step = state.global_step;
    return InitializeTasks(tasks, sources, /*with_slots=*/true, config);
  }

  std::vector<int> AllTasks() const {
    std::vector<int> tasks(channels_.size());
    for (int k = 0; k < num_ps(); ++k) tasks[k] = k;
    return tasks;
  }

  // A variable's initial state: its value, and (restores) its slots and update count.
  struct InitSource {
    const Tensor* value = nullptr;
    const std::vector<Tensor>* slots = nullptr;
    int64_t updates = 0;
  };

  // Initializes the given ps tasks (validated sources for every variable), then marks them initialized.
  absl::Status InitializeTasks(const std::vector<int>& tasks, const absl::flat_hash_map<std::string, InitSource>& given,
                               bool with_slots, const TrainingConfig& config) {
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
          for (const Tensor& slot : *source.slots) {
            tensors.push_back(ShardOf(slot, *shard));
            tensors.back().meta.set_slot(static_cast<int>(&slot - source.slots->data()) + 1);
          }
        }
      }
      channels.push_back(channel(k));
      headers.push_back(std::move(init));
      // A big model goes in parts (ps/push_parts.h, src/ps/ps_initialize.cc).
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
    SetConfig(config);
    std::vector<rpc::OutgoingMessage> marks(channels.size(), rpc::OutgoingMessage::Of(wire::MarkInitializedRequest()));
    return CallAndWait(channels, rpc::Method::kMarkInitialized, std::move(marks), Control(options_.rpc_timeout_secs),
                       nullptr, retrier_.get());
  }

  absl::StatusOr<ModelSnapshot> PullState() {
    std::vector<rpc::ClientChannel*> channels;
    std::vector<int> tasks;
    std::vector<rpc::OutgoingMessage> requests;
    std::vector<int64_t> answer_bytes;  // values and slots: sizes the deadlines
    const int64_t per_value = 1 + SlotCount();
    for (int k = 0; k < num_ps(); ++k) {
      const std::vector<const dist::ShardSpec*> shards = options_.plan.ShardsOn(k);
      if (shards.empty() && k != gs_ps()) continue;
      wire::PullRequest pull;
      pull.set_with_slots(true);
      int64_t bytes = 0;
      for (const dist::ShardSpec* shard : shards) {
        pull.add_shards(shard->name);
        bytes += NumElements(shard->shape) * per_value * static_cast<int64_t>(sizeof(float));
      }
      answer_bytes.push_back(bytes);
      channels.push_back(channel(k));
      tasks.push_back(k);
      requests.push_back(rpc::OutgoingMessage::Of(pull));
    }
    // Kept whole and assembled afterwards: the slot count is only known from the answers.
    std::vector<std::optional<rpc::IncomingMessage>> answers(channels_.size());
    int64_t step = 0;
    rpc::CallOptions o = Control(options_.rpc_timeout_secs);
    o.pull_direction = true;
    absl::Status s = CallAndWait(
        channels, rpc::Method::kPull, std::move(requests), o,
        [&](int i, const rpc::IncomingMessage& r) {
          wire::PullResponse header;
          if (absl::Status p = Parse(r, &header, channel(tasks[i])->peer_name()); !p.ok()) return p;
          if (tasks[i] == gs_ps()) {
            step = header.step();
            NoteGlobalStep(step);
          }
          answers[tasks[i]] = r;
          return absl::OkStatus();
        },
        retrier_.get(), std::move(answer_bytes));
    if (!s.ok()) return s;
    std::vector<std::string> peers;
    for (const auto& c : channels_) peers.push_back(c->peer_name());
    return AssembleSnapshot(options_.plan, answers, peers, step);
  }

  absl::Status WaitForInitialization(double timeout_secs) {
    std::vector<wire::WaitInitializedResponse> responses(channels_.size());
    // A long poll: not retried here (the caller polls in slices until its own bound).
    absl::Status s = CallEveryPs(rpc::Method::kWaitInitialized, wire::WaitInitializedRequest(), timeout_secs,
                                 [&](int k, const rpc::IncomingMessage& r) {
                                   return Parse(r, &responses[k], channel(k)->peer_name());
                                 },
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
      return absl::DeadlineExceededError(absl::StrCat("waited ", timeout_secs,
                                                      " s for the chief (worker 0) to initialize the variables on ",
                                                      where));
    }
    if (!s.ok()) return s;
    for (int k = 0; k < num_ps(); ++k) {
      const wire::WaitInitializedResponse& r = responses[k];
      if (r.model_fingerprint() != options_.plan.ModelFingerprint()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker ", options_.worker_index, " builds a different model than the chief: ",
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
        return absl::FailedPreconditionError(absl::StrCat(
            channel(k)->peer_name(), " holds different shards than this worker's placement plan expects; start "
            "every task with the same --partitioner and --placement"));
      }
    }
    SetConfig(FromWire(responses[0].config()));
    return absl::OkStatus();
  }

  absl::StatusOr<bool> IsInitialized() {
    wire::HelloRequest hello;
    hello.set_probe(true);
    hello.set_worker_index(options_.worker_index);
    std::vector<bool> initialized(channels_.size(), false);
    absl::Status s = CallEveryPs(rpc::Method::kHello, hello, options_.rpc_timeout_secs,
                                 [&](int k, const rpc::IncomingMessage& r) {
                                   wire::HelloResponse response;
                                   absl::Status p = Parse(r, &response, channel(k)->peer_name());
                                   initialized[k] = response.initialized();
                                   return p;
                                 });
    if (!s.ok()) return s;
    return std::all_of(initialized.begin(), initialized.end(), [](bool b) { return b; });
  }

  // Where each pulled shard goes, per ps task.
  struct Target {
    const dist::ShardSpec* shard;
    Tensor* dest;
  };
  using Targets = std::vector<std::vector<Target>>;

  absl::StatusOr<std::shared_ptr<Targets>> PullTargets(const char* what,
                                                       const std::vector<std::pair<std::string, Tensor*>>& out) const {
    auto targets = std::make_shared<Targets>(channels_.size());
    for (const auto& [name, tensor] : out) {
      auto it = routes_.find(name);
      if (it == routes_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": '", name, "' is not a variable of the plan"));
      }
      if (tensor == nullptr || tensor->shape() != it->second.spec.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": destination for '", name, "' has shape ", tensor ? ShapeToString(tensor->shape()) : "null",
            " but the variable is ", ShapeToString(it->second.spec.shape)));
      }
      for (const dist::ShardSpec& shard : it->second.shards) (*targets)[shard.ps_task].push_back({&shard, tensor});
    }
    return targets;
  }

  // Copies the shards of a Pull (or push-and-pull) answer from ps task k into their tensors.
  absl::Status AssembleAnswer(int k, const rpc::IncomingMessage& r, const Targets& targets) const {
    const std::vector<Target>& wanted = targets[k];
    if (r.num_tensors() != static_cast<int>(wanted.size())) {
      return absl::DataLossError(absl::StrCat(channel(k)->peer_name(), ": asked for ", wanted.size(),
                                              " shards, received ", r.num_tensors()));
    }
    for (int j = 0; j < r.num_tensors(); ++j) {
      absl::Status s = AssembleShard(r, j, *wanted[j].shard, wanted[j].dest);
      if (!s.ok()) return absl::DataLossError(absl::StrCat(channel(k)->peer_name(), ": ", s.message()));
    }
    return absl::OkStatus();
  }

  void PullAsync(const std::vector<std::pair<std::string, Tensor*>>& out,
                 std::function<void(absl::StatusOr<int64_t>)> done) {
    absl::StatusOr<std::shared_ptr<Targets>> targets_or = PullTargets("Pull", out);
    if (!targets_or.ok()) return done(targets_or.status());
    std::shared_ptr<Targets> targets = *std::move(targets_or);
    std::vector<rpc::ClientChannel*> channels;
    std::vector<int> tasks;
    std::vector<rpc::OutgoingMessage> requests;
    std::vector<int64_t> answer_bytes;
    for (int k = 0; k < num_ps(); ++k) {
      if ((*targets)[k].empty() && k != gs_ps()) continue;  // the global step's ps always answers
      wire::PullRequest pull;
      for (const Target& t : (*targets)[k]) pull.add_shards(t.shard->name);
      answer_bytes.push_back(TargetBytes((*targets)[k]));
      channels.push_back(channel(k));
      tasks.push_back(k);
      requests.push_back(rpc::OutgoingMessage::Of(pull));
    }
    auto step = std::make_shared<std::atomic<int64_t>>(0);
    rpc::CallOptions o = Control(options_.rpc_timeout_secs);
    o.pull_direction = true;
    CallAll(
        channels, rpc::Method::kPull, std::move(requests), o,
        [this, targets, tasks, step](int i, const rpc::IncomingMessage& r) -> absl::Status {
          const int k = tasks[i];
          wire::PullResponse header;
          if (absl::Status s = Parse(r, &header, channel(k)->peer_name()); !s.ok()) return s;
          if (k == gs_ps()) {
            step->store(header.step());
            NoteGlobalStep(header.step());
          }
          return AssembleAnswer(k, r, *targets);
        },
        [step, done = std::move(done)](std::vector<absl::Status>& statuses) {
          absl::Status s = Combine(statuses);
          if (!s.ok()) return done(s);
          done(step->load());
        },
        retrier_.get(), std::move(answer_bytes));
  }

  absl::StatusOr<Tensor> PullRows(const std::string& variable, const std::vector<int64_t>& rows) {
    auto it = routes_.find(variable);
    if (it == routes_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("PullRows: '", variable, "' is not a variable of the plan"));
    }
    const VariableRoute& route = it->second;
    if (route.spec.shape.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("PullRows: '", variable, "' is a scalar"));
    }
    for (int64_t r : rows) {
      if (r < 0 || r >= route.spec.shape[0]) {
        return absl::InvalidArgumentError(absl::StrCat("PullRows: row ", r, " of '", variable,
                                                       "' is out of range 0..", route.spec.shape[0] - 1));
      }
    }
    Shape out_shape = route.spec.shape;
    out_shape[0] = static_cast<int64_t>(rows.size());
    Tensor out(out_shape);
    if (rows.empty()) return out;
    const bool by_rows = route.shards.size() == 1 || route.shards[0].axis == 0;
    // Per shard: the positions in `rows` it answers (all of them when split along an inner axis).
    std::vector<std::vector<size_t>> positions(route.shards.size());
    for (size_t p = 0; p < rows.size(); ++p) {
      if (!by_rows) {
        for (auto& pos : positions) pos.push_back(p);
        continue;
      }
      size_t s = 0;
      while (s + 1 < route.shards.size() && rows[p] >= route.shards[s + 1].offset) ++s;
      positions[s].push_back(p);
    }
    std::vector<rpc::ClientChannel*> channels;
    std::vector<rpc::OutgoingMessage> requests;
    std::vector<size_t> shard_of_call;
    for (size_t s = 0; s < route.shards.size(); ++s) {
      if (positions[s].empty()) continue;
      const dist::ShardSpec& shard = route.shards[s];
      wire::PullRowsRequest pull;
      pull.set_shard(shard.name);
      for (size_t p : positions[s]) pull.add_rows(by_rows ? rows[p] - shard.offset : rows[p]);
      channels.push_back(channel(shard.ps_task));
      requests.push_back(rpc::OutgoingMessage::Of(pull));
      shard_of_call.push_back(s);
    }
    const int64_t row_size = out.size() / out_shape[0];
    rpc::CallOptions o = Control(options_.rpc_timeout_secs);
    o.pull_direction = true;
    absl::Status s = CallAndWait(
        channels, rpc::Method::kPullRows, std::move(requests), o, [&](int i, const rpc::IncomingMessage& r) {
          const dist::ShardSpec& shard = route.shards[shard_of_call[i]];
          const std::vector<size_t>& pos = positions[shard_of_call[i]];
          const int64_t shard_row = NumElements(shard.shape) / std::max<int64_t>(shard.shape[0], 1);
          if (r.num_tensors() != 1 || r.num_floats(0) != static_cast<int64_t>(pos.size()) * shard_row) {
            return absl::DataLossError(absl::StrCat(channels[i]->peer_name(), ": PullRows of '", shard.name,
                                                    "' returned the wrong size"));
          }
          if (by_rows) {
            // Rows come back in request order; place each at its position.
            std::vector<float> buffer(static_cast<size_t>(r.num_floats(0)));
            r.CopyTo(0, buffer.data());
            for (size_t q = 0; q < pos.size(); ++q) {
              std::copy_n(buffer.data() + q * row_size, row_size, out.data() + pos[q] * row_size);
            }
          } else {
            const int64_t inner = InnerSize(out_shape, shard.axis);
            r.CopyStrided(0, out.data() + shard.offset * inner, shard.shape[shard.axis] * inner,
                          out_shape[shard.axis] * inner);
          }
          return absl::OkStatus();
        },
        retrier_.get());
    if (!s.ok()) return s;
    return out;
  }

  // Push, or push-and-pull when `out` is given.
  void PushAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                 const std::vector<std::pair<std::string, Tensor*>>* out,
                 std::function<void(absl::StatusOr<PushResult>)> done) {
    std::shared_ptr<Targets> targets;
    if (out != nullptr) {
      absl::StatusOr<std::shared_ptr<Targets>> targets_or = PullTargets("PushAndPull", *out);
      if (!targets_or.ok()) return done(targets_or.status());
      targets = *std::move(targets_or);
    }
    std::vector<std::vector<rpc::OutgoingTensor>> per_ps(channels_.size());
    for (const Gradient& g : grads) {
      auto it = routes_.find(g.variable);
      if (it == routes_.end()) {
        return done(absl::InvalidArgumentError(absl::StrCat("Push: '", g.variable, "' is not a variable of the plan")));
      }
      const VariableRoute& route = it->second;
      if (g.dense != nullptr && g.dense->shape() != route.spec.shape) {
        return done(absl::InvalidArgumentError(absl::StrCat("Push: gradient for '", g.variable, "' has shape ",
                                                            ShapeToString(g.dense->shape()), " but the variable is ",
                                                            ShapeToString(route.spec.shape))));
      }
      if (g.sparse != nullptr) {
        if (absl::Status s = ValidateSparse(*g.sparse, route.spec); !s.ok()) return done(s);
      }
      if (g.dense != nullptr && g.sparse != nullptr) {
        // Both kinds: one update with their sum (the optimizer must step once per variable).
        auto sum = std::make_shared<Tensor>(Densify(g.dense, *g.sparse, route.spec.shape));
        for (const dist::ShardSpec& shard : route.shards) {
          rpc::OutgoingTensor t = ShardOf(*sum, shard);
          if (t.owner == nullptr) t.owner = sum;
          per_ps[shard.ps_task].push_back(std::move(t));
        }
      } else if (g.dense != nullptr) {
        for (const dist::ShardSpec& shard : route.shards) per_ps[shard.ps_task].push_back(ShardOf(*g.dense, shard));
      } else if (g.sparse != nullptr) {
        for (auto& [s, t] : RouteSparse(*g.sparse, route.shards)) per_ps[route.shards[s].ps_task].push_back(std::move(t));
      }
    }
    // Each ps refuses a non-finite gradient for its own shards; a push spanning several ps tasks is
    // checked here first so that it is refused as a whole rather than applied on some of them.
    if (std::count_if(per_ps.begin(), per_ps.end(), [](const auto& t) { return !t.empty(); }) > 1) {
      for (const Gradient& g : grads) {
        if (absl::Status s = CheckFinite(g.variable, g.dense, g.sparse); !s.ok()) {
          return done(absl::InvalidArgumentError(absl::StrCat("Push: ", s.message())));
        }
      }
    }
    const TrainingConfig config = GetConfig();
    // Async pushes bigger than a part go as parts, one round of calls after another
    // (ps/push_parts.h); a sync push, or one that fits, is one round: a call per ps task.
    std::vector<int> tasks;
    std::vector<std::vector<std::vector<rpc::OutgoingTensor>>> parts;  // [task][part]
    size_t num_rounds = 1;
    for (int k = 0; k < num_ps(); ++k) {
      // Sync: every ps counts every worker's push each step, even an empty one. Async: the
      // global step's ps counts every push.
      const bool pulls_here = targets != nullptr && !(*targets)[k].empty();
      if (per_ps[k].empty() && !pulls_here && !config.sync && k != gs_ps()) continue;
      tasks.push_back(k);
      if (config.sync || options_.max_part_bytes <= 0) {
        parts.emplace_back().push_back(std::move(per_ps[k]));
      } else {
        parts.push_back(SplitIntoParts(std::move(per_ps[k]), options_.max_part_bytes));
      }
      num_rounds = std::max(num_rounds, parts.back().size());
    }
    wire::PushRequest header;
    header.set_worker_index(options_.worker_index);
    header.set_step_tag(step_tag);
    // One id per round on every ps task and for its retries: each ps applies each part once.
    header.set_client_id(client_id_);
    const uint64_t first_seq = next_seq_.fetch_add(num_rounds);
    auto rounds = std::make_shared<std::vector<PushRound>>(num_rounds);
    for (size_t i = 0; i < tasks.size(); ++i) {
      const int k = tasks[i];
      const bool pulls_here = targets != nullptr && !(*targets)[k].empty();
      for (size_t p = 0; p < parts[i].size(); ++p) {
        const bool last = p + 1 == parts[i].size();
        wire::PushRequest request = header;
        request.set_seq(first_seq + p);
        request.set_more_parts(!last);
        if (last && pulls_here) {
          for (const Target& t : (*targets)[k]) request.add_pull_shards(t.shard->name);
        }
        rpc::OutgoingMessage message = rpc::OutgoingMessage::Of(request);
        message.tensors = std::move(parts[i][p]);
        PushRound& round = (*rounds)[p];
        round.answer_bytes.push_back(last && pulls_here ? TargetBytes((*targets)[k]) : 0);
        round.channels.push_back(channel(k));
        round.tasks.push_back(k);
        round.last.push_back(last);
        round.requests.push_back(std::move(message));
      }
    }
    // Sync: the tasks that answered hear that this worker is alive while others keep it waiting.
    std::shared_ptr<WaitHeartbeat> heartbeat;
    if (config.sync && tasks.size() > 1) {
      wire::HelloRequest hello;
      hello.set_worker_index(options_.worker_index);
      hello.set_client_id(client_id_);
      hello.set_heartbeat(true);
      heartbeat = WaitHeartbeat::Start((*rounds)[0].channels, std::move(hello),
                                       std::clamp(config.sync_timeout_secs / 4, 0.05, 10.0), options_.rpc_timeout_secs,
                                       retrier_.get());
    }
    SendPushRound(std::move(rounds), 0, options_.rpc_timeout_secs + (config.sync ? config.sync_timeout_secs : 0),
                  std::move(targets), std::move(heartbeat), std::make_shared<PushResult>(), std::move(done));
  }

  // Sends round r of a push (a call to each ps task with a part left) and, once all answered,
  // the next round; `done` gets the outcome after the last round or the first failed one.
  void SendPushRound(std::shared_ptr<std::vector<PushRound>> rounds, size_t r, double timeout_secs,
                     std::shared_ptr<Targets> targets, std::shared_ptr<WaitHeartbeat> heartbeat,
                     std::shared_ptr<PushResult> result, std::function<void(absl::StatusOr<PushResult>)> done) {
    PushRound& round = (*rounds)[r];
    CallAll(
        round.channels, rpc::Method::kPush, std::move(round.requests), Control(timeout_secs),
        [this, rounds, r, result, targets, heartbeat](int i, const rpc::IncomingMessage& m) -> absl::Status {
          if (heartbeat != nullptr) heartbeat->Answered(i);
          const PushRound& round = (*rounds)[r];
          const int task = round.tasks[i];
          wire::PushResponse response;
          if (absl::Status s = Parse(m, &response, channel(task)->peer_name()); !s.ok()) return s;
          if (!round.last[i]) return absl::OkStatus();  // a part: the step and the pull come with the last
          if (task == gs_ps()) {
            result->global_step = response.step();
            result->stale = response.stale();
            NoteGlobalStep(response.step());
          }
          if (targets != nullptr) return AssembleAnswer(task, m, *targets);
          return absl::OkStatus();
        },
        [this, rounds, r, timeout_secs, targets, heartbeat, result, done](std::vector<absl::Status>& statuses) {
          absl::Status s = Combine(statuses);
          if (s.ok() && r + 1 < rounds->size()) {
            return SendPushRound(rounds, r + 1, timeout_secs, targets, heartbeat, result, done);
          }
          if (heartbeat != nullptr) heartbeat->Stop();
          if (!s.ok()) return done(s);
          done(*result);
        },
        retrier_.get(), std::move(round.answer_bytes));
  }

  absl::Status Goodbye(const std::string& failure) {
    wire::GoodbyeRequest bye;
    bye.set_worker_index(options_.worker_index);
    bye.set_client_id(client_id_);
    bye.set_failure(failure);
    // Leaving is retried for one deadline at most: a worker that is done should not linger.
    return CallEveryPs(rpc::Method::kGoodbye, bye, options_.rpc_timeout_secs, nullptr, /*retry=*/true,
                       std::min(options_.rpc_timeout_secs, options_.ps_unavailable_timeout_secs));
  }

  absl::Status Shutdown() {
    wire::ShutdownRequest shutdown;
    shutdown.set_worker_index(options_.worker_index);
    shutdown.set_client_id(client_id_);
    shutdown.set_global_step(last_global_step_.load());
    return CallEveryPs(rpc::Method::kShutdown, shutdown, options_.rpc_timeout_secs);
  }

  void Abort(const std::string& reason, double timeout_secs) {
    wire::ShutdownRequest shutdown;
    shutdown.set_worker_index(options_.worker_index);
    shutdown.set_client_id(client_id_);
    shutdown.set_global_step(last_global_step_.load());
    shutdown.set_abort_reason(reason);
    if (timeout_secs < 0) timeout_secs = options_.ps_unavailable_timeout_secs;
    // Retried for up to the same bound as every call, so a ps that is silent for a while still
    // learns that the job is over.
    (void)CallEveryPs(rpc::Method::kShutdown, shutdown, std::min(options_.rpc_timeout_secs, timeout_secs), nullptr,
                      /*retry=*/true, timeout_secs);
  }

  absl::StatusOr<std::vector<PsTaskStats>> Stats() {
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

 private:
  // Bytes of the shards a pull (or push-and-pull) asks one ps task for.
  static int64_t TargetBytes(const std::vector<Target>& targets) {
    int64_t bytes = 0;
    for (const Target& t : targets) bytes += NumElements(t.shard->shape) * static_cast<int64_t>(sizeof(float));
    return bytes;
  }
  // Optimizer slots per variable (sizes a checkpoint's pull); 2 (Adam's) when not known yet.
  int64_t SlotCount() const {
    absl::StatusOr<std::unique_ptr<optim::Optimizer>> optimizer = optim::MakeOptimizer(GetConfig().optimizer);
    return optimizer.ok() ? static_cast<int64_t>((*optimizer)->slot_names().size()) : 2;
  }

  void SetConfig(const TrainingConfig& config) {
    absl::MutexLock lock(&mu_);
    config_ = config;
  }
  TrainingConfig GetConfig() const {
    absl::MutexLock lock(&mu_);
    return config_;
  }
  // The newest global step a pull or push answer carried; Shutdown tells every ps task the final
  // one (a ps that does not hold the global step knows it from nowhere else).
  void NoteGlobalStep(int64_t step) {
    int64_t seen = last_global_step_.load();
    while (step > seen && !last_global_step_.compare_exchange_weak(seen, step)) {
    }
  }

  const Options options_;
  const uint64_t client_id_;
  std::atomic<uint64_t> next_seq_{1};  // pushes' and Initializes' ids, with client_id_
  std::vector<std::unique_ptr<rpc::ClientChannel>> channels_;
  std::unique_ptr<Retrier> retrier_;  // after channels_: destroyed first (its timers call them)
  absl::flat_hash_map<std::string, VariableRoute> routes_;
  mutable absl::Mutex mu_;
  TrainingConfig config_ ABSL_GUARDED_BY(mu_);  // learned from Initialize / WaitForInitialization
  std::atomic<int64_t> last_global_step_{0};     // see NoteGlobalStep
};

// ---------------------------------------------------------------------------------------------

PsClient::PsClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PsClient::~PsClient() = default;

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(Options options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status s = impl->Init(); !s.ok()) return s;
  return std::unique_ptr<PsClient>(new PsClient(std::move(impl)));
}

absl::Status PsClient::Connect() { return impl_->Connect(); }
absl::Status PsClient::Initialize(const std::vector<std::pair<std::string, const Tensor*>>& variables,
                                  const TrainingConfig& config) {
  return impl_->Initialize(variables, config);
}
absl::Status PsClient::Initialize(const ModelSnapshot& state, const TrainingConfig& config) {
  return impl_->Initialize(state, config, impl_->AllTasks());
}
absl::Status PsClient::InitializePs(int ps_task, const ModelSnapshot& state, const TrainingConfig& config) {
  if (ps_task < 0 || ps_task >= impl_->num_ps()) {
    return absl::InvalidArgumentError(absl::StrCat("InitializePs: no ps task ", ps_task, " (the cluster has ",
                                                   impl_->num_ps(), ")"));
  }
  return impl_->Initialize(state, config, {ps_task});
}
absl::StatusOr<ModelSnapshot> PsClient::PullState() { return impl_->PullState(); }
absl::Status PsClient::WaitForInitialization(double timeout_secs) { return impl_->WaitForInitialization(timeout_secs); }
absl::StatusOr<bool> PsClient::IsInitialized() { return impl_->IsInitialized(); }

absl::StatusOr<int64_t> PsClient::Pull(const std::vector<std::pair<std::string, Tensor*>>& out) {
  CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
  absl::Notification done;
  absl::StatusOr<int64_t> result;
  impl_->PullAsync(out, [&](absl::StatusOr<int64_t> r) {
    result = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

void PsClient::PullAsync(const std::vector<std::pair<std::string, Tensor*>>& out,
                         std::function<void(absl::StatusOr<int64_t>)> done) {
  impl_->PullAsync(out, std::move(done));
}

absl::StatusOr<Tensor> PsClient::PullRows(const std::string& variable, const std::vector<int64_t>& rows) {
  return impl_->PullRows(variable, rows);
}

absl::StatusOr<PushResult> PsClient::Push(const std::vector<Gradient>& grads, int64_t step_tag) {
  CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
  absl::Notification done;
  absl::StatusOr<PushResult> result;
  impl_->PushAsync(grads, step_tag, nullptr, [&](absl::StatusOr<PushResult> r) {
    result = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

void PsClient::PushAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                         std::function<void(absl::StatusOr<PushResult>)> done) {
  impl_->PushAsync(grads, step_tag, nullptr, std::move(done));
}

absl::StatusOr<PushResult> PsClient::PushAndPull(const std::vector<Gradient>& grads, int64_t step_tag,
                                                 const std::vector<std::pair<std::string, Tensor*>>& out) {
  CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
  absl::Notification done;
  absl::StatusOr<PushResult> result;
  impl_->PushAsync(grads, step_tag, &out, [&](absl::StatusOr<PushResult> r) {
    result = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

void PsClient::PushAndPullAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                                const std::vector<std::pair<std::string, Tensor*>>& out,
                                std::function<void(absl::StatusOr<PushResult>)> done) {
  impl_->PushAsync(grads, step_tag, &out, std::move(done));
}

absl::Status PsClient::Goodbye(const std::string& failure) { return impl_->Goodbye(failure); }
absl::Status PsClient::Shutdown() { return impl_->Shutdown(); }
void PsClient::Abort(const std::string& reason, double timeout_secs) { impl_->Abort(reason, timeout_secs); }
absl::StatusOr<std::vector<PsTaskStats>> PsClient::Stats() { return impl_->Stats(); }

}  // namespace psflow::ps
