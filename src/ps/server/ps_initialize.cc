// PsServer: Initialize — the chief installs the model: the training config and optimizer, and the
// shards with their values (and, restoring a checkpoint, their optimizer slots and update counts).
//
// A model bigger than the chief's part size (PsClient::Options::max_part_bytes) comes as several
// Initialize calls, in order: every part repeats the header (config, shard list) and carries
// element runs of the shards' tensors (TensorMeta.slice, .slot: 0 the values, j slot j - 1).
// The first part stages the model's buffers, each part copies its runs into them, and the last
// installs the model — so the ps holds the model and one part, not the model twice while a whole
// Initialize message is copied out (docs/memory.md). A retried part copies the same bytes again.
#include "absl/strings/str_cat.h"
#include "core/random_id.h"
#include "ps/common/wire_config.h"
#include "ps/server/ps_server_impl.h"

namespace psflow::ps {
namespace {

// The answer to an Initialize: empty, or the error.
absl::StatusOr<rpc::OutgoingMessage> Answer(const absl::Status& status) {
  if (!status.ok()) return status;
  return rpc::OutgoingMessage::Of(wire::Empty());
}

}  // namespace

absl::StatusOr<std::shared_ptr<PsServer::Impl::Model>> PsServer::Impl::NewModel(const wire::InitializeRequest& init) {
  auto model = std::make_shared<Model>();
  model->id = RandomNonZeroId();  // differs from a restarted task's last process's too
  absl::StatusOr<TrainingConfig> config = FromWire(init.config());
  if (!config.ok()) return config.status();
  model->config = *std::move(config);
  model->config_wire = init.config();
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> optimizer = optim::MakeOptimizer(model->config.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  model->optimizer = *std::move(optimizer);
  for (const optim::ParameterGroup& group : model->config.optimizer.groups) {
    if (group.variables.empty()) continue;
    auto rule = optim::MakeOptimizer(optim::ConfigForVariable(model->config.optimizer, group.variables[0]));
    if (!rule.ok()) return rule.status();
    for (const std::string& v : group.variables) model->rule_by_variable[v] = rule->get();
    model->group_rules.push_back(*std::move(rule));
  }
  if (model->config.sync && (model->config.replicas_to_aggregate < 1 ||
                             model->config.total_num_replicas < model->config.replicas_to_aggregate)) {
    return absl::InvalidArgumentError(absl::StrCat("sync mode needs 1 <= replicas_to_aggregate (",
                                                   model->config.replicas_to_aggregate, ") <= total_num_replicas (",
                                                   model->config.total_num_replicas, ")"));
  }
  absl::StatusOr<rpc::WireDtype> wire_dtype = rpc::ParseWireDtype(model->config.wire_dtype);
  if (!wire_dtype.ok())
    return absl::InvalidArgumentError(absl::StrCat("Initialize: --wire_dtype: ", wire_dtype.status().message()));
  model->wire_dtype = *wire_dtype;
  model->signature = init.model_signature();
  model->fingerprint = init.model_fingerprint();
  model->holds_global_step = init.holds_global_step();
  absl::StatusOr<std::unique_ptr<PsTables>> tables =
      PsTables::Create(init, options_.task_index, disk_.get(), [this](const absl::Status& s) { FailTask(s); });
  if (!tables.ok()) return absl::InvalidArgumentError(absl::StrCat("Initialize: ", tables.status().message()));
  model->tables = *std::move(tables);
  return model;
}

void PsServer::Impl::AddShard(Model& model, const wire::ShardInfo& info, FloatBuffer values, optim::SlotState state) {
  const Shape shape(info.shape().begin(), info.shape().end());
  auto shard = std::make_shared<Shard>(info.name(), shape, std::move(values), std::move(state));
  shard->set_wire_dtype(model.wire_dtype);
  model.by_name[info.name()] = shard;
  if (auto it = model.rule_by_variable.find(info.variable().empty() ? info.name() : info.variable());
      it != model.rule_by_variable.end()) {
    model.rule_by_shard[shard.get()] = it->second;
  }
  model.shards.push_back(std::move(shard));
  model.shard_infos.push_back(info);
  model.num_params += NumElements(shape);
}

void PsServer::Impl::HandleInitialize(const rpc::IncomingMessage& request, rpc::Responder responder) {
  wire::InitializeRequest init;
  if (absl::Status s = request.ParseHeader(&init); !s.ok()) return responder.Respond(s);
  if (init.first_seq() != 0) return responder.Respond(Answer(InitializePart(request, init)));
  absl::StatusOr<std::shared_ptr<Model>> model_or = NewModel(init);
  if (!model_or.ok()) return responder.Respond(model_or.status());
  std::shared_ptr<Model> model = *std::move(model_or);
  // With slots (a restore), each shard's value is followed by its optimizer slots.
  const int per_shard = init.with_slots() ? 1 + static_cast<int>(model->optimizer->slot_names().size()) : 1;
  if (request.num_tensors() != init.shards_size() * per_shard) {
    return responder.Respond(
        absl::InvalidArgumentError(absl::StrCat("Initialize lists ", init.shards_size(), " shards (", per_shard,
                                                " tensors each) but carries ", request.num_tensors(), " tensors")));
  }
  for (int i = 0; i < init.shards_size(); ++i) {
    const wire::ShardInfo& info = init.shards(i);
    const int first = i * per_shard;
    const wire::TensorMeta& meta = request.meta(first);
    const Shape shape(info.shape().begin(), info.shape().end());
    const Shape got(meta.shape().begin(), meta.shape().end());
    if (meta.name() != info.name() || meta.sparse() || got != shape) {
      return responder.Respond(absl::InvalidArgumentError(
          absl::StrCat("Initialize: tensor ", i, " is '", meta.name(), "' ", ShapeToString(got), " but shard ", i,
                       " is '", info.name(), "' ", ShapeToString(shape))));
    }
    if (model->by_name.contains(info.name())) {
      return responder.Respond(
          absl::InvalidArgumentError(absl::StrCat("Initialize: shard '", info.name(), "' listed twice")));
    }
    FloatBuffer values(static_cast<size_t>(request.num_floats(first)));
    request.CopyTo(first, values.data());
    optim::SlotState state = model->optimizer->NewState(NumElements(shape));
    if (init.with_slots()) {
      for (int j = 1; j < per_shard; ++j) {
        const wire::TensorMeta& slot = request.meta(first + j);
        if (Shape(slot.shape().begin(), slot.shape().end()) != shape || slot.sparse()) {
          return responder.Respond(absl::InvalidArgumentError(
              absl::StrCat("Initialize: slot '", model->optimizer->slot_names()[j - 1], "' of shard '", info.name(),
                           "' does not have the shard's shape ", ShapeToString(shape))));
        }
        request.CopyTo(first + j, state.slots[j - 1].data());
      }
      state.updates = info.updates();
    }
    AddShard(*model, info, std::move(values), std::move(state));
  }
  responder.Respond(Answer(Install(std::move(model), init.client_id(), init.seq(), /*first_seq=*/0)));
}

absl::Status PsServer::Impl::InitializePart(const rpc::IncomingMessage& request, const wire::InitializeRequest& init) {
  absl::MutexLock lock(&init_mu_);
  {
    absl::MutexLock state_lock(&mu_);
    if (init.client_id() == last_init_client_ && init.first_seq() == last_init_first_seq_) {
      return absl::OkStatus();  // a late or retried part of the Initialize installed last
    }
  }
  if (staged_ == nullptr || staged_->client_id != init.client_id() || staged_->first_seq != init.first_seq()) {
    // The first part (or a new Initialize replacing one that never finished): stage the buffers.
    absl::StatusOr<std::shared_ptr<Model>> model = NewModel(init);
    if (!model.ok()) return model.status();
    auto staged = std::make_unique<StagedModel>();
    staged->client_id = init.client_id();
    staged->first_seq = init.first_seq();
    staged->with_slots = init.with_slots();
    staged->model = *std::move(model);
    for (const wire::ShardInfo& info : init.shards()) {
      if (staged->index.contains(info.name())) {
        return absl::InvalidArgumentError(absl::StrCat("Initialize: shard '", info.name(), "' listed twice"));
      }
      const int64_t n = NumElements(Shape(info.shape().begin(), info.shape().end()));
      staged->index[info.name()] = staged->shards.size();
      StagedModel::Buffers& b = staged->shards.emplace_back();
      b.info = info;
      b.values.resize(static_cast<size_t>(n));
      b.state = staged->model->optimizer->NewState(n);
      b.filled.assign(1 + (staged->with_slots ? b.state.slots.size() : 0), 0);
    }
    staged_ = std::move(staged);
  }
  StagedModel& staged = *staged_;
  for (int i = 0; i < request.num_tensors(); ++i) {
    const wire::TensorMeta& meta = request.meta(i);
    auto it = staged.index.find(meta.name());
    if (it == staged.index.end() || meta.sparse()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Initialize part: tensor '", meta.name(), "' is not a dense tensor of a listed shard"));
    }
    StagedModel::Buffers& b = staged.shards[it->second];
    const int64_t size = static_cast<int64_t>(b.values.size());
    const int64_t n = request.num_floats(i);
    const int64_t offset = meta.slice() ? meta.slice_offset() : 0;
    if (meta.slot() < 0 || meta.slot() >= static_cast<int>(b.filled.size()) || offset < 0 || offset > size - n ||
        (!meta.slice() && n != size)) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize part: tensor '", meta.name(), "' slot ", meta.slot(),
                                                     " elements [", offset, ", ", offset + n,
                                                     ") do not fit the shard's ", size, " elements"));
    }
    // Runs come in order: a retried part writes again what it wrote; a gap means a lost part.
    if (offset > b.filled[meta.slot()]) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize part: '", meta.name(), "' slot ", meta.slot(),
                                                     " jumps to element ", offset, " before ", b.filled[meta.slot()],
                                                     " arrived"));
    }
    float* to = meta.slot() == 0 ? b.values.data() : b.state.slots[meta.slot() - 1].data();
    request.CopyTo(i, to + offset);
    b.filled[meta.slot()] = std::max(b.filled[meta.slot()], offset + n);
  }
  if (init.more_parts()) return absl::OkStatus();

  std::unique_ptr<StagedModel> done = std::move(staged_);
  for (StagedModel::Buffers& b : done->shards) {
    for (size_t j = 0; j < b.filled.size(); ++j) {
      if (b.filled[j] != static_cast<int64_t>(b.values.size())) {
        return absl::InvalidArgumentError(absl::StrCat("Initialize: the last part came but shard '", b.info.name(),
                                                       "' ", j == 0 ? "values" : absl::StrCat("slot ", j), " has ",
                                                       b.filled[j], " of ", b.values.size(), " elements"));
      }
    }
    if (done->with_slots) b.state.updates = b.info.updates();
    AddShard(*done->model, b.info, std::move(b.values), std::move(b.state));
  }
  return Install(std::move(done->model), init.client_id(), init.seq(), init.first_seq());
}

absl::Status PsServer::Impl::Install(std::shared_ptr<Model> model, uint64_t client_id, uint64_t seq,
                                     uint64_t first_seq) {
  {
    // A retried Initialize whose first attempt was applied: not applied again (it would wipe out
    // what was trained since, were it late).
    absl::MutexLock lock(&mu_);
    if (client_id != 0 && client_id == last_init_client_ && seq == last_init_seq_) return absl::OkStatus();
    last_init_client_ = client_id;
    last_init_seq_ = seq;
    last_init_first_seq_ = first_seq;
  }
  // A re-initialization (the chief restoring a checkpoint) starts over: held calls of the old model
  // are answered "not initialized", which workers take as "wait for the chief, then pull".
  model->sync_epoch = sync_.Reconfigure(SyncConfig(model), absl::FailedPreconditionError(kNotInitializedMessage));
  absl::MutexLock lock(&mu_);
  initialized_.store(false, std::memory_order_release);
  uninitialized_since_nanos_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
  step_.store(model->config.initial_global_step);
  model_.store(std::move(model), std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace psflow::ps
