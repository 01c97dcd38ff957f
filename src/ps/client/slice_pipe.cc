// Push and pull pipelined in slices (ps/client/slice_pipe.h): PsClient::PullBackSlices, the
// SlicePulls handle, and PsClient::Impl::PushSlicesAsync.
#include "ps/client/slice_pipe.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "proto/psflow.pb.h"
#include "ps/client/call_parts.h"
#include "ps/client/ps_client_impl.h"
#include "ps/client/routing.h"
#include "rpc/wire_dtype.h"

namespace psflow::ps {
namespace {

// Pushes of one ps task in flight at once (two keep its link busy across the answer's round trip).
constexpr int kSliceWindow = 2;
// A part no further than this behind the first one not answered leaves: a part retried after a
// broken connection (in back-off meanwhile) must not be overtaken by more of the task's parts than
// its ps remembers (PushDedup::kWindow, 64), or its retry would be refused as too old and fail
// the job (seen once in a vgg19 run at 100 Mbit/s under bbr: "push 3317 of this client is older
// than the last 64 the ps task remembers").
constexpr size_t kSliceSpan = 32;

// One part of a ps task's share: the runs of pulled-back variables it carries, pulled once its
// push is answered.
struct SlicePart {
  std::vector<SliceTarget> runs;
  std::vector<int> run_vars;  // each run's variable (index into the pull-back's `out`)
  bool opens = false;         // holds the first run of a shard cut into several
  bool closes = false;        // holds the last run of a shard cut into several
};

struct SliceTask {
  int k = 0;  // the ps task
  std::vector<SlicePart> parts;
};

}  // namespace

// One sliced push: its parts per ps task (fixed once built) and their progress.
struct SlicedPush {
  std::vector<SliceTask> tasks;
  std::shared_ptr<SlicePulls::State> pulls;
  std::function<void(absl::StatusOr<PushResult>)> done;

  wire::PushRequest header;  // every part's, but its seq (given as the part leaves)

  absl::Mutex mu;
  // [task][part]: each part's tensors, moved out when sent.
  std::vector<std::vector<std::vector<rpc::OutgoingTensor>>> requests ABSL_GUARDED_BY(mu);
  std::vector<size_t> next ABSL_GUARDED_BY(mu);    // per task: the next part to push
  std::vector<int> in_flight ABSL_GUARDED_BY(mu);  // per task
  std::vector<bool> stopped ABSL_GUARDED_BY(mu);   // per task: a push failed, the rest is not sent
  // Per task: which parts were answered, and the first that was not (see kSliceSpan).
  std::vector<std::vector<bool>> answered ABSL_GUARDED_BY(mu);
  std::vector<size_t> oldest ABSL_GUARDED_BY(mu);
  int parts_left ABSL_GUARDED_BY(mu) = 0;   // pushes not answered (nor given up)
  absl::Status status ABSL_GUARDED_BY(mu);  // the first failure
};

// --- SlicePulls -------------------------------------------------------------------------------

void SlicePulls::State::Start(int index, int n) {
  absl::MutexLock lock(&mu);
  pending[index] += n;
  started[index] = true;
}

void SlicePulls::State::Done(int index, const absl::Status& s) {
  absl::MutexLock lock(&mu);
  --pending[index];
  if (!s.ok() && status.ok()) status = s;
}

SlicePulls::SlicePulls(PsClient::Impl* client, std::shared_ptr<State> state)
    : client_(client), state_(std::move(state)) {}

SlicePulls::~SlicePulls() {
  client_->UnregisterPullBack(state_.get());
  absl::MutexLock lock(&state_->mu);
  state_->mu.Await(absl::Condition(
      +[](State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
        return std::all_of(s->pending.begin(), s->pending.end(), [](int n) { return n == 0; });
      },
      state_.get()));
}

std::vector<int> SlicePulls::TakeStarted() {
  absl::MutexLock lock(&state_->mu);
  std::vector<int> started;
  for (size_t i = 0; i < state_->started.size(); ++i) {
    if (!state_->started[i]) continue;
    state_->started[i] = false;
    state_->taken[i] = true;
    started.push_back(static_cast<int>(i));
  }
  return started;
}

void SlicePulls::Wait(int index) {
  if (index < 0 || index >= static_cast<int>(state_->out.size())) return;
  absl::MutexLock lock(&state_->mu);
  std::pair<State*, int> arg(state_.get(), index);
  state_->mu.Await(absl::Condition(
      +[](std::pair<State*, int>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->first->pending[a->second] == 0; },
      &arg));
}

absl::Status SlicePulls::Settle() {
  State* s = state_.get();
  absl::MutexLock lock(&s->mu);
  s->mu.Await(absl::Condition(
      +[](State* st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) {
        for (size_t i = 0; i < st->pending.size(); ++i) {
          if (st->taken[i] && st->pending[i] > 0) return false;
        }
        return true;
      },
      s));
  absl::Status status = s->status;
  if (!status.ok()) {
    // A failure: the caller pulls every value again, so no slice pull may still be writing.
    s->mu.Await(absl::Condition(
        +[](State* st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) {
          return std::all_of(st->pending.begin(), st->pending.end(), [](int n) { return n == 0; });
        },
        s));
    s->started.assign(s->started.size(), false);
  }
  s->status = absl::OkStatus();
  s->taken.assign(s->taken.size(), false);
  return status;
}

bool SlicePulls::failed() const {
  absl::MutexLock lock(&state_->mu);
  return !state_->status.ok();
}

std::unique_ptr<SlicePulls> PsClient::PullBackSlices(std::vector<std::pair<std::string, Tensor*>> out) {
  if (impl_->transfer_slice_bytes() <= 0) return nullptr;
  std::shared_ptr<SlicePulls::State> state = impl_->RegisterPullBack(std::move(out));
  return std::unique_ptr<SlicePulls>(new SlicePulls(impl_.get(), std::move(state)));
}

// --- the client's side ------------------------------------------------------------------------

std::shared_ptr<SlicePulls::State> PsClient::Impl::RegisterPullBack(std::vector<std::pair<std::string, Tensor*>> out) {
  auto state = std::make_shared<SlicePulls::State>();
  for (size_t i = 0; i < out.size(); ++i) state->index_of.emplace(out[i].first, static_cast<int>(i));
  {
    absl::MutexLock lock(&state->mu);
    state->pending.assign(out.size(), 0);
    state->started.assign(out.size(), false);
    state->taken.assign(out.size(), false);
  }
  state->out = std::move(out);
  absl::MutexLock lock(&pull_back_mu_);
  pull_back_ = state;
  return state;
}

void PsClient::Impl::UnregisterPullBack(const SlicePulls::State* state) {
  absl::MutexLock lock(&pull_back_mu_);
  if (pull_back_.get() == state) pull_back_ = nullptr;
}

bool PsClient::Impl::SlicesFor(const std::vector<Gradient>& grads) const {
  if (options_.transfer_slice_bytes <= 0) return false;
  std::shared_ptr<SlicePulls::State> state;
  {
    absl::MutexLock lock(&pull_back_mu_);
    state = pull_back_;
  }
  if (state == nullptr || GetConfig().sync) return false;  // a sync step counts whole pushes
  const int64_t slice_elements =
      std::max<int64_t>(1, options_.transfer_slice_bytes / static_cast<int64_t>(rpc::WireDtypeBytes(wire_dtype_)));
  for (const Gradient& g : grads) {
    if (g.dense == nullptr || g.sparse != nullptr || !state->index_of.contains(g.variable)) continue;
    auto it = routes_.find(g.variable);
    if (it == routes_.end()) continue;
    for (const dist::ShardSpec& shard : it->second.shards) {
      if (NumElements(shard.shape) > slice_elements) return true;
    }
  }
  return false;
}

void PsClient::Impl::PushSlicesAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                                     std::function<void(absl::StatusOr<PushResult>)> done) {
  std::shared_ptr<SlicePulls::State> pulls;
  {
    absl::MutexLock lock(&pull_back_mu_);
    pulls = pull_back_;
  }
  if (pulls == nullptr) return PushAsync(grads, step_tag, nullptr, nullptr, std::move(done), /*early_part=*/true);
  // The whole push is checked before its first slice leaves: a slice once applied stays applied.
  for (const Gradient& g : grads) {
    if (absl::Status s = CheckFinite(g.variable, g.dense, g.sparse); !s.ok()) {
      return done(absl::InvalidArgumentError(absl::StrCat("Push: ", s.message())));
    }
  }
  absl::StatusOr<PerPs> per_ps = RouteGradients(grads);
  if (!per_ps.ok()) return done(per_ps.status());
  // Where each pulled-back shard's values go.
  struct Dest {
    const dist::ShardSpec* shard = nullptr;
    int index = 0;
  };
  absl::flat_hash_map<std::string, Dest> dests;
  for (const Gradient& g : grads) {
    if (g.dense == nullptr || g.sparse != nullptr) continue;
    auto v = pulls->index_of.find(g.variable);
    if (v == pulls->index_of.end()) continue;
    for (const dist::ShardSpec& shard : routes_.at(g.variable).shards) dests[shard.name] = {&shard, v->second};
  }
  RoundForWire(&*per_ps);  // the shards' residuals as for a whole push (after every check)
  // SplitIntoParts counts float32 bytes; a slice is transfer_slice_bytes on the wire.
  const int64_t wire_bytes = static_cast<int64_t>(rpc::WireDtypeBytes(wire_dtype_));
  const int64_t part_bytes =
      std::max<int64_t>(1, options_.transfer_slice_bytes / wire_bytes) * static_cast<int64_t>(sizeof(float));

  auto push = std::make_shared<SlicedPush>();
  push->pulls = pulls;
  push->done = std::move(done);
  push->header.set_worker_index(options_.worker_index);
  push->header.set_step_tag(step_tag);
  push->header.set_client_id(client_id_);
  push->header.set_more_parts(true);  // an early part: the push's last part (FinishAsync) counts
  std::vector<std::vector<std::vector<rpc::OutgoingTensor>>> requests;
  for (int k = 0; k < num_ps(); ++k) {
    if ((*per_ps)[k].empty()) continue;
    absl::flat_hash_map<std::string, int64_t> sizes;  // each shard's elements (a cut shard's last run ends there)
    for (const rpc::OutgoingTensor& t : (*per_ps)[k]) sizes[t.meta.name()] = t.num_floats;
    SliceTask task;
    task.k = k;
    std::vector<std::vector<rpc::OutgoingTensor>>& messages = requests.emplace_back();
    for (std::vector<rpc::OutgoingTensor>& tensors : SplitIntoParts(std::move((*per_ps)[k]), part_bytes)) {
      SlicePart part;
      for (const rpc::OutgoingTensor& t : tensors) {
        const int64_t offset = t.meta.slice() ? t.meta.slice_offset() : 0;
        if (t.meta.slice()) {
          part.opens |= offset == 0;
          part.closes |= offset + t.num_floats == sizes[t.meta.name()];
        }
        if (t.meta.sparse()) continue;
        if (auto d = dests.find(t.meta.name()); d != dests.end()) {
          part.runs.push_back({{d->second.shard, pulls->out[d->second.index].second}, offset, t.num_floats});
          part.run_vars.push_back(d->second.index);
        }
      }
      messages.push_back(std::move(tensors));
      task.parts.push_back(std::move(part));
    }
    push->tasks.push_back(std::move(task));
  }
  int parts = 0;
  for (const SliceTask& task : push->tasks) {
    parts += static_cast<int>(task.parts.size());
    for (const SlicePart& part : task.parts) {
      for (int v : part.run_vars) pulls->Start(v, 1);  // before anything leaves: Wait sees them
    }
  }
  if (parts == 0) return push->done(PushResult{});
  {
    absl::MutexLock lock(&push->mu);
    push->requests = std::move(requests);
    push->next.assign(push->tasks.size(), 0);
    push->in_flight.assign(push->tasks.size(), 0);
    push->stopped.assign(push->tasks.size(), false);
    push->oldest.assign(push->tasks.size(), 0);
    for (const SliceTask& task : push->tasks) push->answered.emplace_back(task.parts.size(), false);
    push->parts_left = parts;
  }
  for (size_t t = 0; t < push->tasks.size(); ++t) SendSliceParts(push, t);
}

void PsClient::Impl::SendSliceParts(const std::shared_ptr<SlicedPush>& push, size_t t) {
  const SliceTask& task = push->tasks[t];
  std::vector<std::pair<size_t, rpc::OutgoingMessage>> launch;
  {
    absl::MutexLock lock(&push->mu);
    size_t& next = push->next[t];
    int& in_flight = push->in_flight[t];
    while (!push->stopped[t] && next < task.parts.size() && in_flight < kSliceWindow &&
           next - push->oldest[t] < kSliceSpan) {
      // The ps claims a shard's update with its first run and closes it with its last: a part
      // opening a shard goes alone, and one closing it after every earlier part was answered.
      if (in_flight > 0 && (task.parts[next - 1].opens || task.parts[next].closes)) break;
      // The seq as the part leaves, not when the push was cut: a ps remembers a client's last 64
      // seqs, and a big push's hundreds of slices must not reach it behind newer ones.
      wire::PushRequest header = push->header;
      header.set_seq(next_seq_.fetch_add(1));  // the part is applied once, whatever the retries
      header.set_model_id(ModelOf(task.k));    // refused if the task's model changed since (a restore)
      rpc::OutgoingMessage message = rpc::OutgoingMessage::Of(header);
      message.tensors = std::move(push->requests[t][next]);
      launch.emplace_back(next, std::move(message));
      ++next;
      ++in_flight;
    }
  }
  rpc::CallOptions options = Control(options_.rpc_timeout_secs);
  for (auto& [p, request] : launch) {
    std::vector<rpc::OutgoingMessage> requests;
    requests.push_back(std::move(request));
    CallAll(
        {channel(task.k)}, rpc::Method::kPush, std::move(requests), options,
        [this, k = task.k](int, const rpc::IncomingMessage& m) -> absl::Status {
          wire::PushResponse response;
          if (absl::Status s = Parse(m, &response, channel(k)->peer_name()); !s.ok()) return s;
          NoteModel(k, response.model_id());
          return absl::OkStatus();
        },
        [this, push, t, p = p](std::vector<absl::Status>& statuses) { SlicePushed(push, t, p, Combine(statuses)); },
        retrier_.get());
  }
}

void PsClient::Impl::SlicePushed(const std::shared_ptr<SlicedPush>& push, size_t t, size_t p, const absl::Status& s) {
  const SliceTask& task = push->tasks[t];
  std::vector<size_t> given_up;  // parts never sent after a failure: their pulls end here
  bool finished = false;
  absl::Status status;
  {
    absl::MutexLock lock(&push->mu);
    --push->in_flight[t];
    --push->parts_left;
    push->answered[t][p] = true;
    while (push->oldest[t] < task.parts.size() && push->answered[t][push->oldest[t]]) ++push->oldest[t];
    if (!s.ok()) {
      if (push->status.ok()) push->status = s;
      if (!push->stopped[t]) {
        push->stopped[t] = true;
        for (size_t q = push->next[t]; q < task.parts.size(); ++q) {
          given_up.push_back(q);
          --push->parts_left;
        }
        push->next[t] = task.parts.size();
      }
    }
    finished = push->parts_left == 0;
    status = push->status;
  }
  if (s.ok()) {
    PullSlice(push, t, p);
  } else {
    given_up.push_back(p);
  }
  for (size_t q : given_up) {
    for (int v : task.parts[q].run_vars) push->pulls->Done(v, s);
  }
  if (!finished) return SendSliceParts(push, t);
  if (!status.ok()) return push->done(status);
  push->done(PushResult{});
}

void PsClient::Impl::PullSlice(const std::shared_ptr<SlicedPush>& push, size_t t, size_t p) {
  const SliceTask& task = push->tasks[t];
  const SlicePart& part = task.parts[p];
  if (part.runs.empty()) return;
  wire::PullRequest pull;
  int64_t bytes = 0;
  for (const SliceTarget& run : part.runs) {
    wire::ShardSlice* slice = pull.add_slices();
    slice->set_shard(run.target.shard->name);
    slice->set_offset(run.offset);
    slice->set_count(run.count);
    bytes += run.count * static_cast<int64_t>(sizeof(float));
  }
  rpc::CallOptions options = Control(options_.rpc_timeout_secs);
  options.pull_direction = true;  // the pull channel: beside the pushes, not behind them
  std::vector<rpc::OutgoingMessage> requests;
  requests.push_back(rpc::OutgoingMessage::Of(pull));
  CallAll(
      {channel(task.k)}, rpc::Method::kPull, std::move(requests), options,
      [this, push, t, p](int, const rpc::IncomingMessage& m) -> absl::Status {
        const int k = push->tasks[t].k;
        wire::PullResponse response;
        if (absl::Status s = Parse(m, &response, channel(k)->peer_name()); !s.ok()) return s;
        NoteModel(k, response.model_id());
        return AssembleAnswer(k, m, push->tasks[t].parts[p].runs, nullptr);
      },
      [push, t, p](std::vector<absl::Status>& statuses) {
        const absl::Status s = Combine(statuses);
        for (int v : push->tasks[t].parts[p].run_vars) push->pulls->Done(v, s);
      },
      retrier_.get(), {bytes});
}

}  // namespace psflow::ps
