#include "ps/client/snapshot_validation.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "proto/psflow.pb.h"
#include "ps/client/routing.h"

namespace psflow::ps {

absl::Status ValidateSnapshot(const ModelSnapshot& state, const dist::PlacementPlan& plan, size_t num_slots) {
  absl::flat_hash_map<std::string, const dist::VariableSpec*> specs;
  for (const dist::VariableSpec& v : plan.variables) specs[v.name] = &v;
  absl::flat_hash_set<std::string> seen;
  for (const VariableSnapshot& v : state.variables) {
    auto it = specs.find(v.name);
    if (it == specs.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint's variable '", v.name, "' is not a variable of the model"));
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
      return absl::InvalidArgumentError(absl::StrCat("the checkpoint has ", v.slots.size(), " optimizer slots for '",
                                                     v.name, "' but the optimizer has ", num_slots,
                                                     " (was it written with another --optimizer?)"));
    }
    for (size_t s = 0; s < v.slots.size(); ++s) {
      if (v.slots[s].shape() != shape) {
        return absl::InvalidArgumentError(absl::StrCat("the checkpoint's slot ", s, " of '", v.name, "' has shape ",
                                                       ShapeToString(v.slots[s].shape()), " but the variable's is ",
                                                       ShapeToString(shape)));
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

}  // namespace psflow::ps
