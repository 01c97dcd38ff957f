// PsServer: pushes. HandlePush (the entry: parse, admit, validate) hands each push to its mode: async
// mode applies it on arrival (with --staleness_aware_lr, a dense push of staleness τ at lr / max(1, τ));
// sync mode (SyncReplicasOptimizer) gives it to the sync accumulator
// (ps/server/sync_accumulator.h), which holds the push's call open (its Responder) until the step's
// quorum is complete and its mean applied — no thread blocks per waiting worker; hybrid sync
// (--table_sync=async) applies the push's table rows and gathers its prefetch on arrival, and only its dense
// gradients wait. Every answer
// leaves through PushAnswer (the exit). Push deduplication (ps/server/push_dedup.h: client id + sequence
// number) plugs in at the entry, right after the header is parsed: it wraps the Responder, so
// both modes and the accumulator answer through it unchanged. A push may come in parts
// (more_parts on every part but the last): async applies each on arrival and steps with the last;
// sync stages the parts per worker (Shard::Stage) and counts them with the last part, which is
// the push the accumulator sees (so a sync step still applies one mean per variable, of whole
// pushes only).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "ps/common/wire_config.h"
#include "ps/server/ps_server_impl.h"

namespace psflow::ps {

absl::StatusOr<rpc::OutgoingMessage> PsServer::Impl::PushAnswer(const std::vector<std::shared_ptr<Shard>>& pulls,
                                                                int64_t step, bool stale, uint64_t model_id,
                                                                const std::vector<TableBlock>* prefetch) {
  wire::PushResponse header;
  header.set_step(step);
  header.set_stale(stale);
  header.set_model_id(model_id);
  rpc::OutgoingMessage message = rpc::OutgoingMessage::Of(header);
  for (const std::shared_ptr<Shard>& shard : pulls) {
    std::shared_ptr<const FloatBuffer> snapshot = shard->Snapshot();
    rpc::OutgoingTensor t;
    t.meta.set_name(shard->name());
    t.meta.set_dtype(rpc::WireDtypeName(shard->wire_dtype()));  // --wire_dtype
    for (int64_t d : shard->shape()) t.meta.add_shape(d);
    t.data = snapshot->data();
    t.num_floats = static_cast<int64_t>(snapshot->size());
    t.owner = std::move(snapshot);  // sent without a copy; an update meanwhile copies first
    message.tensors.push_back(std::move(t));
  }
  if (prefetch != nullptr) {
    if (absl::Status s = PsTables::AppendGathered(*prefetch, &message); !s.ok()) return s;
  }
  return message;
}

void PsServer::Impl::HandlePush(const rpc::IncomingMessage& request, rpc::Responder responder) {
  std::shared_ptr<const Model> m = model();
  wire::PushRequest header;
  if (absl::Status s = request.ParseHeader(&header); !s.ok()) return responder.Respond(s);
  if (m == nullptr || !initialized()) {
    return responder.Respond(absl::FailedPreconditionError(kNotInitializedMessage));
  }
  // Computed from the values of a model this task no longer holds (the chief restored it since,
  // or this is a new process): applied, it would mix a step the restore undid into the steps
  // trained again (a retry that reached the restored task, a late call). Its worker takes this as
  // a restart: it waits for the chief and pulls, and trains that step again from the restored values.
  if (header.model_id() != 0 && header.model_id() != m->id) {
    Log(absl::StrCat("ps task ", options_.task_index, ": refused a push from worker ", header.worker_index(),
                     " (step tag ", header.step_tag(), ") computed before the model was initialized again"));
    return responder.Respond(absl::FailedPreconditionError(kNotInitializedMessage));
  }
  std::optional<rpc::Responder> admitted = AdmitPush(m, header, std::move(responder));
  if (!admitted.has_value()) return;
  responder = *std::move(admitted);
  if (Finished(*m)) return responder.Respond(FinishedError());
  ValidPush push;
  if (absl::Status valid = ValidatePush(*m, request, header, &push); !valid.ok()) {
    pushes_refused_.fetch_add(1);
    return responder.Respond(absl::InvalidArgumentError(
        absl::StrCat("refused push from worker ", header.worker_index(), ": ", valid.message())));
  }
  if (const int w = header.worker_index();
      w >= 0 && w < num_pushed_flags_ && !pushed_[w].load(std::memory_order_relaxed)) {
    pushed_[w].store(true, std::memory_order_relaxed);
  }
  if (m->config.sync) {
    PushInSyncMode(*m, push.gradients, header, std::move(push.pulls), std::move(push.tables), std::move(responder));
  } else {
    PushInAsyncMode(*m, push.gradients, header, std::move(push.pulls), std::move(push.tables), std::move(responder));
  }
}

std::optional<rpc::Responder> PsServer::Impl::AdmitPush(const std::shared_ptr<const Model>& m,
                                                        const wire::PushRequest& header, rpc::Responder responder) {
  // A retried push (its answer was lost) is answered with the first answer, never applied twice.
  return dedup_.Admit(header.client_id(), header.seq(), std::move(responder), [m, &header](const std::string& first) {
    std::vector<std::shared_ptr<Shard>> pulls;
    for (const std::string& name : header.pull_shards()) {
      if (auto it = m->by_name.find(name); it != m->by_name.end()) pulls.push_back(it->second);
    }
    // A retry's prefetch rows are gathered again (the current rows, as a late pull reads them).
    absl::StatusOr<std::vector<TableBlock>> prefetch = m->tables->Decode(header.table_prefetch(), nullptr, 0);
    absl::StatusOr<rpc::OutgoingMessage> answer = PushAnswer(pulls, 0, false, 0, prefetch.ok() ? &*prefetch : nullptr);
    // A disk table that failed to gather (the task is ending): the first answer without the rows.
    if (!answer.ok()) answer = PushAnswer(pulls, 0, false, 0, nullptr);
    answer->header = first;
    return *std::move(answer);
  });
}

absl::Status PsServer::Impl::ValidatePush(const Model& m, const rpc::IncomingMessage& request,
                                          const wire::PushRequest& header, ValidPush* push) {
  // The last table_pushes_size() tensors are the table blocks' rows; the others dense gradients.
  const int num_dense = request.num_tensors() - header.table_pushes_size();
  if (num_dense < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(header.table_pushes_size(), " table blocks but only ", request.num_tensors(), " tensors"));
  }
  push->tables = std::make_shared<TablePush>();
  if (absl::Status s = DecodeTableBlocks(m, request, header, num_dense, push->tables.get()); !s.ok()) return s;
  if (absl::Status s = DecodeGradients(m, request, header, num_dense, &push->gradients); !s.ok()) return s;
  if (header.more_parts() && m.config.sync && header.client_id() == 0) {
    return absl::InvalidArgumentError(
        "a sync push in parts from a client without an id (its parts could not be told apart)");
  }
  for (const std::string& name : header.pull_shards()) {
    auto it = m.by_name.find(name);
    if (it == m.by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("asks to pull unknown shard '", name, "'"));
    }
    push->pulls.push_back(it->second);
  }
  return absl::OkStatus();
}

absl::Status PsServer::Impl::DecodeTableBlocks(const Model& m, const rpc::IncomingMessage& request,
                                               const wire::PushRequest& header, int num_dense, TablePush* tables) {
  if (header.table_pushes_size() == 0 && header.table_prefetch_size() == 0) return absl::OkStatus();
  if (header.more_parts()) return absl::InvalidArgumentError("table rows in a push's part other than its last");
  absl::StatusOr<std::vector<TableBlock>> rows = m.tables->Decode(header.table_pushes(), &request, num_dense);
  absl::StatusOr<std::vector<TableBlock>> prefetch = m.tables->Decode(header.table_prefetch(), nullptr, 0);
  if (!rows.ok()) return rows.status();
  if (!prefetch.ok()) return prefetch.status();
  tables->rows = *std::move(rows);
  tables->prefetch = *std::move(prefetch);
  return absl::OkStatus();
}

absl::Status PsServer::Impl::DecodeGradients(const Model& m, const rpc::IncomingMessage& request,
                                             const wire::PushRequest& header, int num_dense,
                                             std::vector<ShardGradient>* gradients) {
  gradients->resize(static_cast<size_t>(num_dense));
  absl::flat_hash_map<std::string, int> seen;
  for (int i = 0; i < num_dense; ++i) {
    const std::string& name = request.meta(i).name();
    auto it = m.by_name.find(name);
    if (it == m.by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("gradient for unknown shard '", name, "'"));
    }
    if (!seen.emplace(name, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("two gradients for shard '", name, "' in one push"));
    }
    ShardGradient& g = (*gradients)[i];
    if (absl::Status s = it->second->DecodeGradient(request, i, &g); !s.ok()) return s;
    g.client_id = header.client_id();
    g.worker = header.worker_index();
    if (g.slice && (m.config.sync || header.client_id() == 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice of shard '", name, "': only async pushes from clients with an id come in parts"));
    }
  }
  return absl::OkStatus();
}

void PsServer::Impl::PushInAsyncMode(const Model& m, std::vector<ShardGradient>& gradients,
                                     const wire::PushRequest& header, std::vector<std::shared_ptr<Shard>> pulls,
                                     std::shared_ptr<TablePush> tables, rpc::Responder responder) {
  int64_t step = step_.load(std::memory_order_acquire);
  if (m.holds_global_step && !header.more_parts()) {  // a push in parts steps with its last part
    // Claim this push's step first, so concurrent pushes never carry the step past train_steps.
    do {
      if (m.config.train_steps > 0 && step >= m.config.train_steps) return responder.Respond(FinishedError());
    } while (!step_.compare_exchange_weak(step, step + 1, std::memory_order_acq_rel));
    ++step;
  }
  // Staleness τ: global steps applied between the pull this gradient was computed from (its step
  // tag) and this apply. The global step's ps knows them (its claimed step is update `step`, so
  // step - 1 came before); another measures against the newest step tag it has seen.
  int64_t newest = newest_tag_.load(std::memory_order_relaxed);
  while (header.step_tag() > newest &&
         !newest_tag_.compare_exchange_weak(newest, header.step_tag(), std::memory_order_relaxed)) {
  }
  newest = std::max(newest, header.step_tag());
  const int64_t now = !m.holds_global_step ? newest : header.more_parts() ? step : step - 1;
  const int64_t tau = std::max<int64_t>(0, now - header.step_tag());
  if (!header.more_parts()) {
    staleness_[std::min<int64_t>(tau, kStalenessBuckets - 1)].fetch_add(1, std::memory_order_relaxed);
  }
  // --staleness_aware_lr (Zhang et al., IJCAI'16): the dense rate divided by max(1, τ).
  const float lr_divisor = m.config.staleness_aware_lr ? static_cast<float>(std::max<int64_t>(1, tau)) : 1.0f;
  for (ShardGradient& g : gradients) {
    const optim::Optimizer& rule = m.RuleFor(g.shard);
    g.shard->Apply(g, rule, optim::LearningRateAt(rule.config(), header.step_tag()) / lr_divisor);
  }
  // Table rows: the rule's learning rate and the rows' last update at the step the gradient was
  // computed at (the dense rate's step; a ps without the global step knows no other).
  if (absl::Status s = m.tables->ApplyAsync(tables->rows, std::max(header.step_tag(), step)); !s.ok()) {
    pushes_refused_.fetch_add(1);
    return responder.Respond(s);
  }
  absl::StatusOr<rpc::OutgoingMessage> answer =
      PushAnswer(pulls, m.holds_global_step && !header.more_parts() ? step : step_.load(), /*stale=*/false, m.id,
                 &tables->prefetch);
  if (!answer.ok()) return responder.Respond(answer.status());
  responder.Respond(*std::move(answer));
}

SyncAccumulator::Config PsServer::Impl::SyncConfig(std::shared_ptr<const Model> model) const {
  SyncAccumulator::Config c;
  c.replicas_to_aggregate = model->config.replicas_to_aggregate;
  c.total_num_replicas = model->config.total_num_replicas;
  c.timeout = absl::Seconds(model->config.sync_timeout_secs);
  c.expected_workers = ExpectedWorkers(*model);
  c.apply = [model](int count, int64_t step) {
    for (const std::shared_ptr<Shard>& shard : model->shards) {
      const optim::Optimizer& rule = model->RuleFor(shard.get());
      shard->ApplyAccumulated(count, rule, optim::LearningRateAt(rule.config(), step));
    }
    // Hybrid (--table_sync=async): the tables' rows were applied as their pushes arrived.
    if (model->config.table_sync != "async") model->tables->ApplyStep(step);
  };
  return c;
}

void PsServer::Impl::PushInSyncMode(const Model& m, const std::vector<ShardGradient>& gradients,
                                    const wire::PushRequest& header, std::vector<std::shared_ptr<Shard>> pulls,
                                    std::shared_ptr<TablePush> tables, rpc::Responder responder) {
  const int worker = header.worker_index();
  if (header.more_parts()) {
    // A part of a push sent as backward goes: staged apart, counted with the push's last part
    // (so a push that is not counted adds nothing). A part computed at an older step is stale like
    // the push it belongs to: not kept.
    const int64_t step = step_.load(std::memory_order_acquire);
    const bool stale = header.step_tag() < step;
    if (!stale) {
      for (const ShardGradient& g : gradients) g.shard->Stage(g, header.step_tag());
    }
    absl::StatusOr<rpc::OutgoingMessage> answer = PushAnswer({}, step, stale, m.id, nullptr);
    if (!answer.ok()) return responder.Respond(answer.status());
    return responder.Respond(*std::move(answer));
  }
  // Hybrid (Persia's, --table_sync=async): the tables' rows are applied now, as in async mode
  // (whether or not the dense gradients count for the step: a stale or late push's rows too), and
  // the next batch's rows (the prefetch) are gathered now too, while the step waits for its quorum:
  // they hold every push applied before this one's arrival, this one's included. Only the dense
  // gradients wait for the step's quorum, and the answer leaves with the step.
  const bool hybrid = m.config.table_sync == "async";
  if (hybrid) {
    const int64_t at = std::max(header.step_tag(), step_.load(std::memory_order_acquire));
    if (absl::Status s = m.tables->ApplyAsync(tables->rows, at); !s.ok()) {
      pushes_refused_.fetch_add(1);
      return responder.Respond(s);
    }
    rpc::OutgoingMessage rows;
    tables->gathered_status = PsTables::AppendGathered(tables->prefetch, &rows);
    tables->gathered = std::move(rows.tensors);
  }
  sync_.Push(
      m.sync_epoch, worker, header.step_tag(),
      [&gradients, &m, &tables, &header, worker, hybrid] {
        // The push's earlier parts first (each shard's gradient comes in one part or the other).
        for (const std::shared_ptr<Shard>& shard : m.shards) {
          shard->CommitStaged(worker, header.client_id(), header.step_tag());
        }
        for (const ShardGradient& g : gradients) g.shard->Accumulate(g);
        if (!hybrid) m.tables->Accumulate(worker, tables->rows);
      },
      [pulls = std::move(pulls), tables, hybrid, model_id = m.id,
       responder = std::move(responder)](absl::StatusOr<SyncAccumulator::Outcome> outcome) mutable {
        if (!outcome.ok()) return responder.Respond(outcome.status());
        absl::StatusOr<rpc::OutgoingMessage> answer =
            PushAnswer(pulls, outcome->step, outcome->stale, model_id, hybrid ? nullptr : &tables->prefetch);
        if (!answer.ok()) return responder.Respond(answer.status());
        if (hybrid) {  // the rows gathered on arrival, after the dense values as PushAnswer puts them
          if (!tables->gathered_status.ok()) return responder.Respond(tables->gathered_status);
          for (rpc::OutgoingTensor& t : tables->gathered) answer->tensors.push_back(std::move(t));
        }
        responder.Respond(*std::move(answer));
      });
}

}  // namespace psflow::ps
