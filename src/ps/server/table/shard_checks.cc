// Checks shared by the table shards (shard_checks.h), and the factory of table_shard.h.
#include "ps/server/table/shard_checks.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/id_positions.h"
#include "core/simd_dispatch.h"
#include "ps/server/table/row_store.h"

namespace psflow::ps::table {

absl::Status CheckRowsSize(const TableConfig& config, std::string_view what, size_t num_ids, size_t num_floats) {
  if (num_floats == num_ids * static_cast<size_t>(config.spec.dim)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': ", std::string(what), " has ",
                                                 num_floats, " floats for ", num_ids, " ids of dim ", config.spec.dim));
}

absl::Status CheckFinite(const TableConfig& config, absl::Span<const int64_t> ids, absl::Span<const float> rows) {
  // A search for the culprit only when something is wrong.
  if (!simd::AnyNonFinite(rows.data(), static_cast<int64_t>(rows.size()))) return absl::OkStatus();
  const size_t dim = static_cast<size_t>(config.spec.dim);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (size_t k = 0; k < dim; ++k) {
      if (!std::isfinite(rows[i * dim + k])) {
        return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': gradient row of id ", ids[i],
                                                       " holds ", rows[i * dim + k], "; nothing applied"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckUnique(const TableConfig& config, absl::Span<const int64_t> ids) {
  IdPositions& seen = IdPositions::ForThisThread();  // reused: no table built per call
  seen.Reset(static_cast<int64_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!seen.Insert(ids[i], static_cast<int64_t>(i)).second) {
      return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': id ", ids[i],
                                                     " listed twice in one push (sum its rows first)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPart(const TableConfig& config, int num_slots, const RowsPart& part) {
  const size_t n = part.ids.size();
  if (auto s = CheckRowsSize(config, "a part's values", n, part.values.size()); !s.ok()) return s;
  if (part.slots.size() != static_cast<size_t>(num_slots)) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': a part has ", part.slots.size(),
                                                   " slots, the rule needs ", num_slots));
  }
  for (const std::vector<float>& slot : part.slots) {
    if (auto s = CheckRowsSize(config, "a part's slot", n, slot.size()); !s.ok()) return s;
  }
  if (part.count.size() != n || part.last_step.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': a part has ", n, " ids but ",
                                                   part.count.size(), " counts and ", part.last_step.size(),
                                                   " last steps"));
  }
  for (size_t i = 1; i < n; ++i) {
    if (part.ids[i] <= part.ids[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", config.spec.name, "': a part's ids do not ascend at id ", part.ids[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckScanOptions(const TableConfig& config, const ScanOptions& options) {
  if (options.save_id < 0 || options.save_id >= RowMeta::kMaxGen) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': save id ", options.save_id,
                                                   " is not in [0, ", RowMeta::kMaxGen, ")"));
  }
  if (options.increment && (options.changed_since < 0 || options.changed_since >= options.save_id)) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': an increment for save ",
                                                   options.save_id, " since save ", options.changed_since,
                                                   " (it must follow an earlier save)"));
  }
  return absl::OkStatus();
}

absl::Status CannotIncrement(const TableConfig& config, int64_t changed_since, int64_t known_since) {
  return absl::FailedPreconditionError(
      absl::StrCat("table '", config.spec.name, "': this shard has not tracked its changes since save ", changed_since,
                   known_since < 0 ? std::string(" (it was made or restored since, or saved without tracking)")
                                   : absl::StrCat(" (only since save ", known_since, ")"),
                   ": the save must be full"));
}

}  // namespace psflow::ps::table
