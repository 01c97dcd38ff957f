#include "train/checkpointing.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "psflow/ckpt/safetensors.h"

namespace psflow::train {

absl::Status SaveVariables(const std::string& dir, const std::string& model, const std::vector<Var>& params,
                           int64_t global_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create --checkpoint_dir=", dir, ": ", ec.message()));
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const Var& p : params) tensors.emplace_back(p->name, &p->value);
  return ckpt::WriteSafetensors(absl::StrCat(dir, "/model.ckpt-", global_step, ".safetensors"), tensors,
                                {{"model", model}, {"global_step", absl::StrCat(global_step)}});
}

}  // namespace psflow::train
