// PsServer: pushes. HandlePush (the entry: parse, validate) hands each push to its mode: async
// mode applies it on arrival; sync mode (SyncReplicasOptimizer) gives it to the sync accumulator
// (ps/server/sync_accumulator.h), which holds the push's call open (its Responder) until the step's
// quorum is complete and its mean applied — no thread blocks per waiting worker. Every answer
// leaves through PushAnswer (the exit). Push deduplication (ps/server/push_dedup.h: client id + sequence
// number) plugs in at the entry, right after the header is parsed: it wraps the Responder, so
// both modes and the accumulator answer through it unchanged.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ps/server/ps_server_impl.h"
#include "ps/common/wire_config.h"
#include "core/check.h"

namespace psflow::ps {

rpc::OutgoingMessage PsServer::Impl::PushAnswer(const std::vector<std::shared_ptr<Shard>>& pulls,
                                                int64_t step, bool stale) {
  wire::PushResponse header;
  header.set_step(step);
  header.set_stale(stale);
  rpc::OutgoingMessage message = rpc::OutgoingMessage::Of(header);
  for (const std::shared_ptr<Shard>& shard : pulls) {
    std::shared_ptr<const FloatBuffer> snapshot = shard->Snapshot();
    rpc::OutgoingTensor t;
    t.meta.set_name(shard->name());
    for (int64_t d : shard->shape()) t.meta.add_shape(d);
    t.data = snapshot->data();
    t.num_floats = static_cast<int64_t>(snapshot->size());
    t.owner = std::move(snapshot);  // sent without a copy; an update meanwhile copies first
    message.tensors.push_back(std::move(t));
  }
  return message;
}

void PsServer::Impl::HandlePush(const rpc::IncomingMessage& request, rpc::Responder responder) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr || !initialized()) {
    return responder.Respond(absl::FailedPreconditionError(kNotInitializedMessage));
  }
  wire::PushRequest header;
  if (absl::Status s = request.ParseHeader(&header); !s.ok()) return responder.Respond(s);
  // A retried push (its answer was lost) is answered with the first answer, never applied twice.
  std::optional<rpc::Responder> admitted =
      dedup_.Admit(header.client_id(), header.seq(), std::move(responder), [m, &header](const std::string& first) {
        std::vector<std::shared_ptr<Shard>> pulls;
        for (const std::string& name : header.pull_shards()) {
          if (auto it = m->by_name.find(name); it != m->by_name.end()) pulls.push_back(it->second);
        }
        rpc::OutgoingMessage answer = PushAnswer(pulls, 0, false);
        answer.header = first;
        return answer;
      });
  if (!admitted.has_value()) return;
  responder = *std::move(admitted);
  if (Finished(*m)) return responder.Respond(FinishedError());

  // Validate (and copy off the wire) everything before applying anything: a refused push changes
  // nothing.
  std::vector<ShardGradient> gradients(static_cast<size_t>(request.num_tensors()));
  absl::Status valid = absl::OkStatus();
  absl::flat_hash_map<std::string, int> seen;
  for (int i = 0; i < request.num_tensors() && valid.ok(); ++i) {
    const std::string& name = request.meta(i).name();
    auto it = m->by_name.find(name);
    if (it == m->by_name.end()) {
      valid = absl::InvalidArgumentError(absl::StrCat("gradient for unknown shard '", name, "'"));
    } else if (!seen.emplace(name, i).second) {
      valid = absl::InvalidArgumentError(absl::StrCat("two gradients for shard '", name, "' in one push"));
    } else {
      valid = it->second->DecodeGradient(request, i, &gradients[i]);
      gradients[i].client_id = header.client_id();
      if (valid.ok() && gradients[i].slice && (m->config.sync || header.client_id() == 0)) {
        valid = absl::InvalidArgumentError(absl::StrCat(
            "slice of shard '", name, "': only async pushes from clients with an id come in parts"));
      }
    }
  }
  if (valid.ok() && header.more_parts() && m->config.sync) {
    valid = absl::InvalidArgumentError("a push in parts in sync mode (a sync step counts whole pushes)");
  }
  std::vector<std::shared_ptr<Shard>> pulls;
  for (const std::string& name : header.pull_shards()) {
    if (!valid.ok()) break;
    auto it = m->by_name.find(name);
    if (it == m->by_name.end()) {
      valid = absl::InvalidArgumentError(absl::StrCat("asks to pull unknown shard '", name, "'"));
    } else {
      pulls.push_back(it->second);
    }
  }
  if (!valid.ok()) {
    pushes_refused_.fetch_add(1);
    return responder.Respond(absl::InvalidArgumentError(
        absl::StrCat("refused push from worker ", header.worker_index(), ": ", valid.message())));
  }
  if (const int w = header.worker_index(); w >= 0 && w < num_pushed_flags_ && !pushed_[w].load(std::memory_order_relaxed)) {
    pushed_[w].store(true, std::memory_order_relaxed);
  }
  if (m->config.sync) {
    PushInSyncMode(*m, gradients, header, std::move(pulls), std::move(responder));
  } else {
    PushInAsyncMode(*m, gradients, header, std::move(pulls), std::move(responder));
  }
}

void PsServer::Impl::PushInAsyncMode(const Model& m, std::vector<ShardGradient>& gradients,
                                     const wire::PushRequest& header,
                                     std::vector<std::shared_ptr<Shard>> pulls, rpc::Responder responder) {
  int64_t step = step_.load(std::memory_order_acquire);
  if (m.holds_global_step && !header.more_parts()) {  // a push in parts steps with its last part
    // Claim this push's step first, so concurrent pushes never carry the step past train_steps.
    do {
      if (m.config.train_steps > 0 && step >= m.config.train_steps) return responder.Respond(FinishedError());
    } while (!step_.compare_exchange_weak(step, step + 1, std::memory_order_acq_rel));
    ++step;
  }
  const float lr = optim::DecayedLearningRate(m.config.optimizer, header.step_tag());
  for (ShardGradient& g : gradients) g.shard->Apply(g, *m.optimizer, lr);
  responder.Respond(
      PushAnswer(pulls, m.holds_global_step && !header.more_parts() ? step : step_.load(), /*stale=*/false));
}

SyncAccumulator::Config PsServer::Impl::SyncConfig(std::shared_ptr<const Model> model) const {
  SyncAccumulator::Config c;
  c.replicas_to_aggregate = model->config.replicas_to_aggregate;
  c.total_num_replicas = model->config.total_num_replicas;
  c.timeout = absl::Seconds(model->config.sync_timeout_secs);
  c.expected_workers = ExpectedWorkers(*model);
  c.apply = [model](int count, int64_t step) {
    const float lr = optim::DecayedLearningRate(model->config.optimizer, step);
    for (const std::shared_ptr<Shard>& shard : model->shards) shard->ApplyAccumulated(count, *model->optimizer, lr);
  };
  return c;
}

void PsServer::Impl::PushInSyncMode(const Model& m, const std::vector<ShardGradient>& gradients,
                                    const wire::PushRequest& header, std::vector<std::shared_ptr<Shard>> pulls,
                                    rpc::Responder responder) {
  sync_.Push(
      m.sync_epoch, header.worker_index(), header.step_tag(),
      [&gradients] {
        for (const ShardGradient& g : gradients) g.shard->Accumulate(g);
      },
      [pulls = std::move(pulls), responder = std::move(responder)](
          absl::StatusOr<SyncAccumulator::Outcome> outcome) mutable {
        if (!outcome.ok()) return responder.Respond(outcome.status());
        responder.Respond(PushAnswer(pulls, outcome->step, outcome->stale));
      });
}

}  // namespace psflow::ps
