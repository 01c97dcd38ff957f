#include "ps/client_state.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "proto/psflow.pb.h"
#include "ps/routing.h"

namespace psflow::ps {

absl::Status ValidateSnapshot(const ModelSnapshot& state, const dist::PlacementPlan& plan, size_t num_slots) {
  absl::flat_hash_map<std::string, const dist::VariableSpec*> specs;
  for (const dist::VariableSpec& v : plan.variables) specs[v.name] = &v;
  absl::flat_hash_set<std::string> seen;
  for (const VariableSnapshot& v : state.variables) {
    auto it = specs.find(v.name);
    if (it == specs.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the checkpoint's variable '", v.name,
                                                     "' is not a variable of the model"));
    }
    if (!seen.insert(v.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("the checkpoint lists variable '", v.name, "' twice"));
    }
    const Shape& shape = it->second->shape;
    if (v.value.shape() != shape) {
      return absl::InvalidArgumentError(absl::StrCat("the checkpoint's '", v.name, "' has shape ",
                                                     ShapeToString(v.value.shape()), " but the model's is ",
                                                     ShapeToString(shape)));
    }
    if (v.slots.size() != num_slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the checkpoint has ", v.slots.size(), " optimizer slots for '", v.name, "' but the optimizer has ",
          num_slots, " (was it written with another --optimizer?)"));
    }
    for (size_t s = 0; s < v.slots.size(); ++s) {
      if (v.slots[s].shape() != shape) {
        return absl::InvalidArgumentError(absl::StrCat("the checkpoint's slot ", s, " of '", v.name,
                                                       "' has shape ", ShapeToString(v.slots[s].shape()),
                                                       " but the variable's is ", ShapeToString(shape)));
      }
    }
  }
  for (const dist::VariableSpec& v : plan.variables) {
    if (!seen.contains(v.name)) {
      return absl::InvalidArgumentError(absl::StrCat("the checkpoint has no variable '", v.name, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelSnapshot> AssembleSnapshot(const dist::PlacementPlan& plan,
                                               const std::vector<std::optional<rpc::IncomingMessage>>& answers,
                                               const std::vector<std::string>& peer_names, int64_t global_step) {
  ModelSnapshot state;
  state.global_step = global_step;
  absl::flat_hash_map<std::string, size_t> index;
  for (const dist::VariableSpec& v : plan.variables) {
    index[v.name] = state.variables.size();
    VariableSnapshot& snapshot = state.variables.emplace_back();
    snapshot.name = v.name;
    snapshot.value = Tensor(v.shape);
  }
  // Every task answers with the same number of slots per shard (one optimizer); learned from the
  // first answer, the slot tensors are allocated then.
  std::optional<size_t> num_slots;
  for (int k = 0; k < plan.num_ps; ++k) {
    const std::vector<const dist::ShardSpec*> shards = plan.ShardsOn(k);
    if (shards.empty() || !answers[k].has_value()) continue;
    const rpc::IncomingMessage& r = *answers[k];
    wire::PullResponse header;
    const int per_shard = r.num_tensors() / static_cast<int>(shards.size());
    if (!r.ParseHeader(&header).ok() || r.num_tensors() % static_cast<int>(shards.size()) != 0 || per_shard < 1 ||
        header.updates_size() != static_cast<int>(shards.size()) ||
        (num_slots.has_value() && *num_slots != static_cast<size_t>(per_shard - 1))) {
      return absl::DataLossError(absl::StrCat(peer_names[k], ": answered a state pull with ", r.num_tensors(),
                                              " tensors and ", header.updates_size(), " update counts for ",
                                              shards.size(), " shards"));
    }
    if (!num_slots.has_value()) {
      num_slots = static_cast<size_t>(per_shard - 1);
      for (VariableSnapshot& v : state.variables) v.slots.assign(*num_slots, Tensor(v.value.shape()));
    }
    for (size_t j = 0; j < shards.size(); ++j) {
      VariableSnapshot& v = state.variables[index.at(shards[j]->variable)];
      const int first = static_cast<int>(j) * per_shard;
      absl::Status s = AssembleShard(r, first, *shards[j], &v.value);
      for (int slot = 0; s.ok() && slot + 1 < per_shard; ++slot) {
        s = AssembleShard(r, first + 1 + slot, *shards[j], &v.slots[slot]);
      }
      if (!s.ok()) return absl::DataLossError(absl::StrCat(peer_names[k], ": ", s.message()));
      v.updates = std::max(v.updates, header.updates(static_cast<int>(j)));
    }
  }
  return state;
}

}  // namespace psflow::ps
