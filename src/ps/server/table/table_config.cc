// Parsing and validation of table declarations (table_config.h).
#include "ps/server/table/table_config.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace psflow::ps::table {

absl::StatusOr<InitializerSpec> ParseInitializer(std::string_view flag) {
  const std::vector<std::string> parts = absl::StrSplit(absl::string_view(flag.data(), flag.size()), ':');
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "initializer '", std::string(flag),
        "' is not one of zeros, constant:V, uniform:MIN:MAX, normal:MEAN:STDDEV, "
        "truncated_normal:MEAN:STDDEV"));
  };
  std::vector<float> numbers;
  for (size_t i = 1; i < parts.size(); ++i) {
    float v;
    if (!absl::SimpleAtof(parts[i], &v) || !std::isfinite(v)) return bad();
    numbers.push_back(v);
  }
  InitializerSpec spec;
  const std::string& kind = parts[0];
  if (kind == "zeros" && numbers.empty()) {
    spec.kind = InitKind::kZeros;
  } else if (kind == "constant" && numbers.size() == 1) {
    spec.kind = InitKind::kConstant;
    spec.value = numbers[0];
  } else if (kind == "uniform" && numbers.size() == 2) {
    spec.kind = InitKind::kUniform;
    spec.minval = numbers[0];
    spec.maxval = numbers[1];
  } else if ((kind == "normal" || kind == "truncated_normal") && numbers.size() == 2) {
    spec.kind = kind == "normal" ? InitKind::kNormal : InitKind::kTruncatedNormal;
    spec.mean = numbers[0];
    spec.stddev = numbers[1];
  } else {
    return bad();
  }
  if (spec.minval > spec.maxval || spec.stddev < 0.0f) return bad();
  return spec;
}

absl::Status ValidateTableConfig(const TableConfig& c) {
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("table '", c.name, "': ", what));
  };
  if (c.name.empty()) return absl::InvalidArgumentError("a table needs a non-empty name");
  if (c.dim < 1) return bad(absl::StrCat("dim must be >= 1, got ", c.dim));
  const InitializerSpec& i = c.initializer;
  if (!std::isfinite(i.value) || !std::isfinite(i.minval) || !std::isfinite(i.maxval) ||
      !std::isfinite(i.mean) || !std::isfinite(i.stddev) || !(i.stddev >= 0.0f) ||
      !(i.minval <= i.maxval)) {
    return bad("initializer parameters must be finite, with stddev >= 0 and minval <= maxval");
  }
  const TableLifecycle& l = c.lifecycle;
  if (l.admit_after < 0 || l.steps_to_live < 0 || l.max_rows < 0 || l.evict_every < 1) {
    return bad(absl::StrCat("admit_after, steps_to_live and max_rows must be >= 0 and evict_every >= 1, got ",
                            l.admit_after, ", ", l.steps_to_live, ", ", l.max_rows, ", ", l.evict_every));
  }
  if (c.kind == TableKind::kFixed) {
    if (auto s = dist::ValidateFixedLayout(c.name, c.layout); !s.ok()) return s;
    if (l.admit_after > 1 || l.steps_to_live > 0 || l.max_rows > 0) {
      return bad("admit_after, steps_to_live and max_rows apply to dynamic tables only; drop them "
                 "or declare the table dynamic");
    }
  }
  return absl::OkStatus();
}

}  // namespace psflow::ps::table
