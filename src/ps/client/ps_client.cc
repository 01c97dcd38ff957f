// PsClient: a worker's calls to every ps task, fanned out in parallel over rpc::ClientChannel.
// This file has the data path (Pull, Push, PushAndPull; the deprecated PullRows) and PsClient's forwarding
// functions; connecting and the control calls are in ps_client_control.cc, the shared state in
// ps/client/ps_client_impl.h.
#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/check.h"
#include "proto/psflow.pb.h"
#include "ps/client/ps_client_impl.h"
#include "ps/client/routing.h"
#include "ps/client/wait_heartbeat.h"

namespace psflow::ps {
namespace {

std::vector<rpc::ClientChannel*> ChannelsOf(const CallRound& round) {
  std::vector<rpc::ClientChannel*> channels;
  for (const Call& call : round.calls) channels.push_back(call.channel);
  return channels;
}

constexpr char kNoBlockingInCallbacks[] =
    "a blocking PsClient call from an async completion callback would deadlock; use the *Async variant";

}  // namespace

absl::Status Parse(const rpc::IncomingMessage& response, google::protobuf::MessageLite* header,
                   const std::string& peer) {
  absl::Status s = response.ParseHeader(header);
  if (!s.ok()) return absl::DataLossError(absl::StrCat(peer, ": ", s.message()));
  return absl::OkStatus();
}

absl::Status PsClient::Impl::CallAndWait(const std::vector<rpc::ClientChannel*>& channels, rpc::Method method,
                                         std::vector<rpc::OutgoingMessage> requests, const rpc::CallOptions& options,
                                         std::function<absl::Status(int, const rpc::IncomingMessage&)> on_response,
                                         Retrier* retrier, std::vector<int64_t> answer_bytes, double budget_secs) {
  CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
  absl::Notification done;
  absl::Status result;
  {
    rpc::CompletionsHere here;  // this thread reads the answers it waits for
    CallAll(
        channels, method, std::move(requests), options, std::move(on_response),
        [&](std::vector<absl::Status>& statuses) {
          result = Combine(statuses);
          done.Notify();
        },
        retrier, std::move(answer_bytes), budget_secs);
  }
  done.WaitForNotification();
  return result;
}

absl::StatusOr<std::shared_ptr<PsClient::Impl::Targets>> PsClient::Impl::PullTargets(
    const char* what, const std::vector<std::pair<std::string, Tensor*>>& out) const {
  auto targets = std::make_shared<Targets>(channels_.size());
  for (const auto& [name, tensor] : out) {
    auto it = routes_.find(name);
    if (it == routes_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", name, "' is not a variable of the plan"));
    }
    if (tensor == nullptr || tensor->shape() != it->second.spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": destination for '", name, "' has shape ",
                                                     tensor ? ShapeToString(tensor->shape()) : "null",
                                                     " but the variable is ", ShapeToString(it->second.spec.shape)));
    }
    for (const dist::ShardSpec& shard : it->second.shards) {
      (*targets)[shard.ps_task].push_back({{&shard, tensor}, 0, NumElements(shard.shape)});
    }
  }
  return targets;
}

namespace {

// The tensors a pull answers per shard or run (1 + the slots for a checkpoint's pull), or -1 when
// `got` tensors do not make `wanted` whole groups.
int TensorsPerShard(int got, size_t wanted, bool with_slots) {
  if (wanted == 0) return got == 0 ? 1 : -1;
  if (got % static_cast<int>(wanted) != 0) return -1;
  const int per = got / static_cast<int>(wanted);
  return per == 1 || (with_slots && per >= 1) ? per : -1;
}

}  // namespace

absl::Status PsClient::Impl::AssembleAnswer(int k, const rpc::IncomingMessage& r, const std::vector<SliceTarget>& runs,
                                            const wire::PullResponse* with_slots, int table_tensors) const {
  const int per = TensorsPerShard(r.num_tensors() - table_tensors, runs.size(), with_slots != nullptr);
  const bool slots_fit = with_slots == nullptr || runs.empty() ||
                         (static_cast<size_t>(per - 1) == runs[0].target.slots->size() &&
                          with_slots->updates_size() == static_cast<int>(runs.size()));
  if (per < 0 || !slots_fit) {
    return absl::DataLossError(absl::StrCat(channel(k)->peer_name(), ": asked for ", runs.size(), " shards or runs",
                                            with_slots ? " with their optimizer slots" : "", ", received ",
                                            r.num_tensors(), " tensors (does the ps run another optimizer?)"));
  }
  for (size_t j = 0; j < runs.size(); ++j) {
    const SliceTarget& run = runs[j];
    const int first = static_cast<int>(j) * per;
    absl::Status s = AssembleShard(r, first, *run.target.shard, run.offset, run.count, run.target.dest);
    for (int slot = 0; s.ok() && slot + 1 < per; ++slot) {
      s = AssembleShard(r, first + 1 + slot, *run.target.shard, run.offset, run.count, &(*run.target.slots)[slot]);
    }
    if (!s.ok()) return absl::DataLossError(absl::StrCat(channel(k)->peer_name(), ": ", s.message()));
    // A checkpoint's shard counts the updates its first run saw (its runs may see later ones).
    if (with_slots != nullptr && run.offset == 0) *run.target.updates = with_slots->updates(static_cast<int>(j));
  }
  return absl::OkStatus();
}

void PsClient::Impl::AddWholePull(const std::vector<SliceTarget>& targets, int k, bool with_slots,
                                  int64_t floats_per_element, size_t r, std::vector<CallRound>* rounds,
                                  const std::vector<TableBlockCall>* tables) const {
  wire::PullRequest pull;
  pull.set_with_slots(with_slots);
  for (const SliceTarget& t : targets) pull.add_shards(t.target.shard->name);
  if (tables != nullptr && tables->empty()) tables = nullptr;
  if (tables != nullptr) AddTableBlocks(*tables, pull.mutable_table_pulls());
  if (rounds->size() <= r) rounds->resize(r + 1);
  CallRound& round = (*rounds)[r];
  round.method = rpc::Method::kPull;
  round.with_slots = with_slots;
  round.timeout_secs = options_.rpc_timeout_secs;
  round.calls.push_back(
      {.task = k,
       .channel = channel(k),
       .request = rpc::OutgoingMessage::Of(pull),
       .answer_bytes = TargetBytes(targets) * floats_per_element + (tables != nullptr ? TablePullBytes(*tables) : 0),
       .last = true,
       .whole_pull = true,
       .slices = {},
       .table_pulls = tables});
}

void PsClient::Impl::AddPullRounds(const Targets& targets, const std::vector<int>& tasks, size_t first_round,
                                   bool with_slots, int64_t floats_per_element, std::vector<CallRound>* rounds) const {
  for (int k : tasks) {
    std::vector<std::vector<SliceTarget>> parts =
        SplitPullIntoParts(targets[k], options_.max_part_bytes, floats_per_element);
    if (rounds->size() < first_round + parts.size()) rounds->resize(first_round + parts.size());
    for (size_t p = 0; p < parts.size(); ++p) {
      wire::PullRequest pull;
      pull.set_with_slots(with_slots);
      int64_t bytes = 0;
      for (const SliceTarget& run : parts[p]) {
        wire::ShardSlice* slice = pull.add_slices();
        slice->set_shard(run.target.shard->name);
        slice->set_offset(run.offset);
        slice->set_count(run.count);
        bytes += run.count * floats_per_element * static_cast<int64_t>(sizeof(float));
      }
      CallRound& round = (*rounds)[first_round + p];
      round.method = rpc::Method::kPull;
      round.with_slots = with_slots;
      round.timeout_secs = options_.rpc_timeout_secs;
      round.calls.push_back({.task = k,
                             .channel = channel(k),
                             .request = rpc::OutgoingMessage::Of(pull),
                             .answer_bytes = bytes,
                             .last = p + 1 == parts.size(),
                             .whole_pull = false,
                             .slices = std::move(parts[p])});
    }
  }
}

void PsClient::Impl::PullAsync(const std::vector<std::pair<std::string, Tensor*>>& out, const TableStep* tables,
                               std::function<void(absl::StatusOr<int64_t>)> done) {
  absl::StatusOr<std::shared_ptr<Targets>> targets_or = PullTargets("Pull", out);
  if (!targets_or.ok()) return done(targets_or.status());
  std::shared_ptr<Targets> targets = *std::move(targets_or);
  std::shared_ptr<TableWork> work;
  if (tables != nullptr) {
    if (!tables->pushes.empty()) return done(absl::InvalidArgumentError("Pull: table pushes need a push call"));
    absl::StatusOr<std::shared_ptr<TableWork>> routed = RouteTables("Pull", *tables, options_.plan);
    if (!routed.ok()) return done(routed.status());
    work = *std::move(routed);
  }
  SendPull(
      std::move(targets), /*with_slots=*/false, 1,
      [done = std::move(done)](absl::StatusOr<PushResult> r) {
        if (!r.ok()) return done(r.status());
        done(r->global_step);
      },
      std::move(work));
}

void PsClient::Impl::SendPull(std::shared_ptr<Targets> targets, bool with_slots, int64_t floats_per_element,
                              std::function<void(absl::StatusOr<PushResult>)> done, std::shared_ptr<TableWork> tables) {
  // A task's share that fits in a part is one call for its whole shards; a bigger one comes as
  // parts (ps/client/call_parts.h), one round of calls after another.
  auto rounds = std::make_shared<std::vector<CallRound>>();
  std::vector<int> in_parts;
  std::vector<int> tables_apart;  // tasks pulled in parts: their table rows come in a call of their own
  for (int k = 0; k < num_ps(); ++k) {
    const bool tables_here = tables != nullptr && !tables->pulls[k].empty();
    if ((*targets)[k].empty() && k != gs_ps() && !tables_here) continue;  // the global step's ps always answers
    if (PullInParts((*targets)[k], floats_per_element)) {
      in_parts.push_back(k);
      if (tables_here) tables_apart.push_back(k);
    } else {
      AddWholePull((*targets)[k], k, with_slots, floats_per_element, 0, rounds.get(),
                   tables_here ? &tables->pulls[k] : nullptr);
    }
  }
  AddPullRounds(*targets, in_parts, rounds->size(), with_slots, floats_per_element, rounds.get());
  if (!tables_apart.empty()) {
    const size_t r = rounds->size();
    for (int k : tables_apart) {
      AddWholePull({}, k, false, 1, r, rounds.get(), &tables->pulls[k]);
      (*rounds)[r].calls.back().tables_only = true;
    }
  }
  SendRound(std::move(rounds), 0, std::move(targets), nullptr, std::make_shared<PushResult>(), std::move(done),
            std::move(tables));
}

absl::StatusOr<Tensor> PsClient::Impl::PullRows(const std::string& variable, const std::vector<int64_t>& rows) {
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
      return absl::InvalidArgumentError(
          absl::StrCat("PullRows: row ", r, " of '", variable, "' is out of range 0..", route.spec.shape[0] - 1));
    }
  }
  Shape out_shape = route.spec.shape;
  out_shape[0] = static_cast<int64_t>(rows.size());
  Tensor out(out_shape);
  if (rows.empty()) return out;
  // The whole variable, then its rows (no call of its own: this is only a convenience, deprecated).
  Tensor whole(route.spec.shape);
  absl::Notification done;
  absl::StatusOr<int64_t> pulled;
  PullAsync({{variable, &whole}}, nullptr, [&](absl::StatusOr<int64_t> r) {
    pulled = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  if (!pulled.ok()) return pulled.status();
  const int64_t row_size = out.size() / out_shape[0];
  for (size_t p = 0; p < rows.size(); ++p) {
    std::copy_n(whole.data() + rows[p] * row_size, row_size, out.data() + static_cast<int64_t>(p) * row_size);
  }
  return out;
}

absl::StatusOr<PsClient::Impl::PerPs> PsClient::Impl::RouteGradients(const std::vector<Gradient>& grads) const {
  PerPs per_ps(channels_.size());
  for (const Gradient& g : grads) {
    auto it = routes_.find(g.variable);
    if (it == routes_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("Push: '", g.variable, "' is not a variable of the plan"));
    }
    const VariableRoute& route = it->second;
    if (g.dense != nullptr && g.dense->shape() != route.spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat("Push: gradient for '", g.variable, "' has shape ",
                                                     ShapeToString(g.dense->shape()), " but the variable is ",
                                                     ShapeToString(route.spec.shape)));
    }
    if (g.sparse != nullptr) {
      if (absl::Status s = ValidateSparse(*g.sparse, route.spec); !s.ok()) return s;
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
        return absl::InvalidArgumentError(absl::StrCat("Push: ", s.message()));
      }
    }
  }
  return per_ps;
}

void PsClient::Impl::RoundForWire(PerPs* per_ps) {
  if (wire_dtype_ == rpc::WireDtype::kFloat32) return;
  absl::MutexLock lock(&residual_mu_);
  for (std::vector<rpc::OutgoingTensor>& tensors : *per_ps) {
    for (rpc::OutgoingTensor& t : tensors) {
      if (t.meta.sparse()) continue;  // sparse gradients (and table rows) travel as float32
      std::vector<float>& residual = residuals_[t.meta.name()];
      if (residual.size() != static_cast<size_t>(t.num_floats))
        residual.assign(static_cast<size_t>(t.num_floats), 0.0f);
      auto rounded = std::make_shared<std::vector<float>>(static_cast<size_t>(t.num_floats));
      rpc::RoundWithFeedback(wire_dtype_, t.data, residual.data(), rounded->data(), t.num_floats);
      t.data = rounded->data();
      t.owner = std::move(rounded);
      t.meta.set_dtype(rpc::WireDtypeName(wire_dtype_));
    }
  }
}

std::vector<CallRound> PsClient::Impl::PushRounds(PerPs per_ps, int64_t step_tag, const Targets* targets,
                                                  const TrainingConfig& config, const TableWork* tables,
                                                  bool early_part) {
  // Async pushes bigger than a part go as parts, one round of calls after another
  // (ps/client/call_parts.h); a sync push, or one that fits, is one round: a call per ps task. A pull
  // that fits rides on the task's last part; a bigger one follows as Pull calls in parts.
  std::vector<int> tasks;
  std::vector<int> pulls_in_parts;
  std::vector<std::vector<std::vector<rpc::OutgoingTensor>>> parts;  // [task][part]
  size_t num_rounds = 1;
  for (int k = 0; k < num_ps(); ++k) {
    // Sync: every ps counts every worker's push each step, even an empty one. Async: the
    // global step's ps counts every push.
    const bool pulls_here = targets != nullptr && !(*targets)[k].empty();
    if (pulls_here && PullInParts((*targets)[k])) pulls_in_parts.push_back(k);
    const bool tables_here = tables != nullptr && tables->Any(k);
    if (per_ps[k].empty() && (early_part || (!pulls_here && !tables_here && !config.sync && k != gs_ps()))) {
      continue;  // an early part goes only where it has gradients
    }
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
  std::vector<CallRound> rounds(num_rounds);
  for (size_t i = 0; i < tasks.size(); ++i) {
    const int k = tasks[i];
    const bool pull_with_push = targets != nullptr && !(*targets)[k].empty() && !PullInParts((*targets)[k]);
    for (size_t p = 0; p < parts[i].size(); ++p) {
      // An early part of a push as backward goes: every call has more parts to come (the push's
      // last part is another PushRounds), and its answer carries nothing to read.
      const bool last = p + 1 == parts[i].size() && !early_part;
      wire::PushRequest request = header;
      request.set_seq(first_seq + p);
      request.set_model_id(ModelOf(k));  // refused if the task's model changed since (a restore)
      request.set_more_parts(!last);
      if (last && pull_with_push) {
        for (const SliceTarget& t : (*targets)[k]) request.add_pull_shards(t.target.shard->name);
      }
      // Table blocks ride on the last part: gradient rows after the dense tensors, and the
      // prefetch whose rows end the answer.
      const std::vector<TableBlockCall>* prefetch = nullptr;
      std::vector<rpc::OutgoingTensor> tensors = std::move(parts[i][p]);
      if (last && tables != nullptr) {
        AddTablePushes(tables->pushes[k], request.mutable_table_pushes(), &tensors);
        AddTableBlocks(tables->pulls[k], request.mutable_table_prefetch());
        if (!tables->pulls[k].empty()) prefetch = &tables->pulls[k];
      }
      rpc::OutgoingMessage message = rpc::OutgoingMessage::Of(request);
      message.tensors = std::move(tensors);
      CallRound& round = rounds[p];
      round.timeout_secs = options_.rpc_timeout_secs + (config.sync ? config.sync_timeout_secs : 0);
      round.calls.push_back({.task = k,
                             .channel = channel(k),
                             .request = std::move(message),
                             .answer_bytes = (last && pull_with_push ? TargetBytes((*targets)[k]) : 0) +
                                             (prefetch != nullptr ? TablePullBytes(*prefetch) : 0),
                             .last = last,
                             .whole_pull = last && pull_with_push,
                             .slices = {},
                             .table_pulls = prefetch});
    }
  }
  if (!pulls_in_parts.empty()) AddPullRounds(*targets, pulls_in_parts, num_rounds, false, 1, &rounds);
  return rounds;
}

void PsClient::Impl::PushAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                               const std::vector<std::pair<std::string, Tensor*>>* out, const TableStep* tables,
                               std::function<void(absl::StatusOr<PushResult>)> done, bool early_part) {
  std::shared_ptr<Targets> targets;
  if (out != nullptr) {
    absl::StatusOr<std::shared_ptr<Targets>> targets_or = PullTargets("PushAndPull", *out);
    if (!targets_or.ok()) return done(targets_or.status());
    targets = *std::move(targets_or);
  }
  absl::StatusOr<PerPs> per_ps = RouteGradients(grads);
  if (!per_ps.ok()) return done(per_ps.status());
  std::shared_ptr<TableWork> work;
  if (tables != nullptr) {
    absl::StatusOr<std::shared_ptr<TableWork>> routed = RouteTables("Push", *tables, options_.plan);
    if (!routed.ok()) return done(routed.status());
    work = *std::move(routed);
    // The dense gradients' finiteness is checked here too, so that a bad dense gradient with good
    // table rows (or the reverse) is refused on every ps task alike.
    for (const Gradient& g : grads) {
      if (absl::Status s = CheckFinite(g.variable, g.dense, g.sparse); !s.ok()) {
        return done(absl::InvalidArgumentError(absl::StrCat("Push: ", s.message())));
      }
    }
  }
  const TrainingConfig config = GetConfig();
  RoundForWire(&*per_ps);  // after every check: a refused push leaves the residuals alone
  auto rounds = std::make_shared<std::vector<CallRound>>(
      PushRounds(*std::move(per_ps), step_tag, targets.get(), config, work.get(), early_part));
  if ((*rounds)[0].calls.empty()) return done(PushResult{});  // an early part with nothing in it
  // Sync: the tasks that answered hear that this worker is alive while others keep it waiting.
  std::shared_ptr<WaitHeartbeat> heartbeat;
  if (config.sync && !early_part && (*rounds)[0].calls.size() > 1) {
    wire::HelloRequest hello;
    hello.set_worker_index(options_.worker_index);
    hello.set_client_id(client_id_);
    hello.set_heartbeat(true);
    heartbeat = WaitHeartbeat::Start(ChannelsOf((*rounds)[0]), std::move(hello),
                                     std::clamp(config.sync_timeout_secs / 4, 0.05, 10.0), options_.rpc_timeout_secs,
                                     retrier_.get());
  }
  SendRound(std::move(rounds), 0, std::move(targets), std::move(heartbeat), std::make_shared<PushResult>(),
            std::move(done), std::move(work));
}

std::shared_ptr<WaitHeartbeat> PsClient::Impl::StartPartsHeartbeat() {
  const TrainingConfig config = GetConfig();
  if (!config.sync || num_ps() < 2) return nullptr;
  wire::HelloRequest hello;
  hello.set_worker_index(options_.worker_index);
  hello.set_client_id(client_id_);
  hello.set_heartbeat(true);
  std::shared_ptr<WaitHeartbeat> heartbeat =
      WaitHeartbeat::Start(AllChannels(), std::move(hello), std::clamp(config.sync_timeout_secs / 4, 0.05, 10.0),
                           options_.rpc_timeout_secs, retrier_.get());
  for (int k = 0; k < num_ps(); ++k) heartbeat->Answered(k);
  return heartbeat;
}

void PsClient::Impl::SendRound(std::shared_ptr<std::vector<CallRound>> rounds, size_t r,
                               std::shared_ptr<Targets> targets, std::shared_ptr<WaitHeartbeat> heartbeat,
                               std::shared_ptr<PushResult> result, std::function<void(absl::StatusOr<PushResult>)> done,
                               std::shared_ptr<TableWork> tables) {
  CallRound& round = (*rounds)[r];
  // A push's answers (a sync worker heard from some ps tasks) are over once its rounds are.
  if (heartbeat != nullptr && round.method != rpc::Method::kPush) {
    heartbeat->Stop();
    heartbeat = nullptr;
  }
  const bool pull_only = (*rounds)[0].method == rpc::Method::kPull;  // a Pull, not a push's pull
  rpc::CallOptions options = Control(round.timeout_secs);
  options.pull_direction = round.method == rpc::Method::kPull;
  std::vector<rpc::OutgoingMessage> requests;
  std::vector<int64_t> answer_bytes;
  for (Call& call : round.calls) {
    requests.push_back(std::move(call.request));
    answer_bytes.push_back(call.answer_bytes);
  }
  CallAll(
      ChannelsOf(round), round.method, std::move(requests), options,
      [this, rounds, r, result, targets, heartbeat, pull_only](int i, const rpc::IncomingMessage& m) -> absl::Status {
        const CallRound& round = (*rounds)[r];
        const Call& call = round.calls[i];
        const int task = call.task;
        const int table_tensors = call.table_pulls != nullptr ? static_cast<int>(call.table_pulls->size()) : 0;
        auto scatter = [&]() -> absl::Status {
          if (call.table_pulls == nullptr) return absl::OkStatus();
          return ScatterTableRows(m, *call.table_pulls, channel(task)->peer_name());
        };
        if (round.method == rpc::Method::kPull) {
          wire::PullResponse response;
          if (absl::Status s = Parse(m, &response, channel(task)->peer_name()); !s.ok()) return s;
          NoteModel(task, response.model_id());
          if (task == gs_ps() && pull_only) {
            result->global_step = response.step();
            NoteGlobalStep(response.step());
          }
          const wire::PullResponse* with_slots = round.with_slots ? &response : nullptr;
          static const std::vector<SliceTarget> kNone;
          const std::vector<SliceTarget>& runs =
              call.tables_only ? kNone : (call.whole_pull ? (*targets)[task] : call.slices);
          if (absl::Status s = AssembleAnswer(task, m, runs, with_slots, table_tensors); !s.ok()) return s;
          return scatter();
        }
        if (heartbeat != nullptr) heartbeat->Answered(i);
        wire::PushResponse response;
        if (absl::Status s = Parse(m, &response, channel(task)->peer_name()); !s.ok()) return s;
        NoteModel(task, response.model_id());
        if (!call.last) return absl::OkStatus();  // a part: the step and the pull come with the last
        if (task == gs_ps()) {
          result->global_step = response.step();
          result->stale = response.stale();
          NoteGlobalStep(response.step());
        }
        if (call.whole_pull) {
          if (absl::Status s = AssembleAnswer(task, m, (*targets)[task], nullptr, table_tensors); !s.ok()) return s;
        }
        return scatter();
      },
      [this, rounds, r, targets, heartbeat, result, done, tables](std::vector<absl::Status>& statuses) {
        absl::Status s = Combine(statuses);
        if (s.ok() && r + 1 < rounds->size()) {
          return SendRound(rounds, r + 1, targets, heartbeat, result, done, tables);
        }
        if (heartbeat != nullptr) heartbeat->Stop();
        if (!s.ok()) return done(s);
        done(*result);
      },
      retrier_.get(), std::move(answer_bytes));
}

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
    return absl::InvalidArgumentError(
        absl::StrCat("InitializePs: no ps task ", ps_task, " (the cluster has ", impl_->num_ps(), ")"));
  }
  return impl_->Initialize(state, config, {ps_task});
}
absl::StatusOr<ModelSnapshot> PsClient::PullState() { return impl_->PullState(); }
absl::Status PsClient::Initialize(const ModelSnapshot& state, const TrainingConfig& config,
                                  const std::vector<std::pair<std::string, TablePartSource>>& tables) {
  return impl_->Initialize(state, config, impl_->AllTasks(), &tables);
}
absl::Status PsClient::ScanTable(const std::string& table, int64_t max_rows,
                                 const std::function<absl::Status(TableRowsPart part)>& sink) {
  return impl_->ScanTable(table, max_rows, TableScanOptions(), sink);
}
absl::Status PsClient::ScanTable(const std::string& table, int64_t max_rows, const TableScanOptions& options,
                                 const std::function<absl::Status(TableRowsPart part)>& sink) {
  return impl_->ScanTable(table, max_rows, options, sink);
}

absl::Status PsClient::OpenTableScans(const std::vector<std::string>& tables, const TableScanOptions& options) {
  return impl_->OpenTableScans(tables, options);
}

absl::Status PsClient::CloseTableScans() { return impl_->CloseTableScans(); }
absl::Status PsClient::WaitForInitialization(double timeout_secs) { return impl_->WaitForInitialization(timeout_secs); }
absl::StatusOr<bool> PsClient::IsInitialized() { return impl_->IsInitialized(); }

absl::StatusOr<int64_t> PsClient::Pull(const std::vector<std::pair<std::string, Tensor*>>& out) {
  CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
  absl::Notification done;
  absl::StatusOr<int64_t> result;
  {
    rpc::CompletionsHere here;
    impl_->PullAsync(out, nullptr, [&](absl::StatusOr<int64_t> r) {
      result = std::move(r);
      done.Notify();
    });
  }
  done.WaitForNotification();
  return result;
}

void PsClient::PullAsync(const std::vector<std::pair<std::string, Tensor*>>& out,
                         std::function<void(absl::StatusOr<int64_t>)> done) {
  impl_->PullAsync(out, nullptr, std::move(done));
}

absl::StatusOr<int64_t> PsClient::Pull(const std::vector<std::pair<std::string, Tensor*>>& out,
                                       const TableStep& tables) {
  CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
  absl::Notification done;
  absl::StatusOr<int64_t> result;
  {
    rpc::CompletionsHere here;
    impl_->PullAsync(out, &tables, [&](absl::StatusOr<int64_t> r) {
      result = std::move(r);
      done.Notify();
    });
  }
  done.WaitForNotification();
  return result;
}

void PsClient::PullAsync(const std::vector<std::pair<std::string, Tensor*>>& out, const TableStep& tables,
                         std::function<void(absl::StatusOr<int64_t>)> done) {
  impl_->PullAsync(out, &tables, std::move(done));
}

absl::StatusOr<Tensor> PsClient::PullRows(const std::string& variable, const std::vector<int64_t>& rows) {
  CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
  return impl_->PullRows(variable, rows);
}

absl::StatusOr<PushResult> PsClient::Push(const std::vector<Gradient>& grads, int64_t step_tag) {
  CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
  absl::Notification done;
  absl::StatusOr<PushResult> result;
  {
    rpc::CompletionsHere here;
    impl_->PushAsync(grads, step_tag, nullptr, nullptr, [&](absl::StatusOr<PushResult> r) {
      result = std::move(r);
      done.Notify();
    });
  }
  done.WaitForNotification();
  return result;
}

void PsClient::PushAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                         std::function<void(absl::StatusOr<PushResult>)> done) {
  impl_->PushAsync(grads, step_tag, nullptr, nullptr, std::move(done));
}

absl::StatusOr<PushResult> PsClient::PushAndPull(const std::vector<Gradient>& grads, int64_t step_tag,
                                                 const std::vector<std::pair<std::string, Tensor*>>& out) {
  CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
  absl::Notification done;
  absl::StatusOr<PushResult> result;
  {
    rpc::CompletionsHere here;
    PushAndPullAsync(grads, step_tag, out, [&](absl::StatusOr<PushResult> r) {
      result = std::move(r);
      done.Notify();
    });
  }
  done.WaitForNotification();
  return result;
}

void PsClient::PushAndPullAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                                const std::vector<std::pair<std::string, Tensor*>>& out,
                                std::function<void(absl::StatusOr<PushResult>)> done) {
  impl_->PushAsync(grads, step_tag, &out, nullptr, std::move(done));
}

absl::StatusOr<PushResult> PsClient::PushAndPull(const std::vector<Gradient>& grads, int64_t step_tag,
                                                 const std::vector<std::pair<std::string, Tensor*>>& out,
                                                 const TableStep& tables) {
  CHECK(!rpc::OnTransportThread()) << kNoBlockingInCallbacks;
  absl::Notification done;
  absl::StatusOr<PushResult> result;
  {
    rpc::CompletionsHere here;
    PushAndPullAsync(grads, step_tag, out, tables, [&](absl::StatusOr<PushResult> r) {
      result = std::move(r);
      done.Notify();
    });
  }
  done.WaitForNotification();
  return result;
}

void PsClient::PushAndPullAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                                const std::vector<std::pair<std::string, Tensor*>>& out, const TableStep& tables,
                                std::function<void(absl::StatusOr<PushResult>)> done) {
  impl_->PushAsync(grads, step_tag, &out, &tables, std::move(done));
}

absl::Status PsClient::Goodbye(const std::string& failure) { return impl_->Goodbye(failure); }
absl::Status PsClient::Shutdown() { return impl_->Shutdown(); }
void PsClient::Abort(const std::string& reason, double timeout_secs) { impl_->Abort(reason, timeout_secs); }
absl::StatusOr<std::vector<PsTaskStats>> PsClient::Stats() { return impl_->Stats(); }
absl::StatusOr<WorkQueueAnswer> PsClient::CallWorkQueue(const WorkQueueCall& call) {
  return impl_->CallWorkQueue(call);
}

}  // namespace psflow::ps
