// psflow/dist/table_spec.cc — an embedding table's one spec (psflow/dist/table_spec.h): the
// initializer's spelling, the check of a whole spec, and the table of fields set by name.
#include "psflow/dist/table_spec.h"

#include <charconv>
#include <cmath>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/check.h"

namespace psflow::dist {
namespace {

constexpr std::string_view kInitForms =
    "zeros, constant:V, uniform:MIN:MAX, normal:MEAN:STDDEV, truncated_normal:MEAN:STDDEV";

// Shortest text that parses back to the same float.
std::string FloatText(float v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::string("nan");
}

template <typename T>
bool ParseInt(std::string_view text, T* out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

bool IsRule(std::string_view name) {
  for (absl::string_view rule : absl::StrSplit(absl::string_view(kTableRules.data(), kTableRules.size()), ' ')) {
    if (rule == absl::string_view(name.data(), name.size())) return true;
  }
  return false;
}

// The one table of fields: name, help, type; reading and writing each in one place below.
// clang-format off
constexpr TableField kFields[] = {
  {"initializer", "a row's initial distribution: zeros | constant:V | uniform:MIN:MAX | normal:MEAN:STD | "
                  "truncated_normal:MEAN:STD (drawn on the ps from (seed, id))", "text",
   "one of zeros, constant:V, uniform:MIN:MAX, normal:MEAN:STDDEV, truncated_normal:MEAN:STDDEV"},
  {"seed", "the initializer's seed: row `id`'s initial value is a function of (seed, id) only", "int",
   "a non-negative integer"},
  {"partition_strategy", "fixed tables: div (contiguous id ranges per shard) | mod (id % shards)", "text",
   "div or mod"},
  {"admit_after", "dynamic tables: an id's gradients are applied from its K-th push on (0, 1: at once)", "int",
   "an integer >= 0"},
  {"steps_to_live", "dynamic tables: rows not updated for S global steps are removed (0: never)", "int",
   "an integer >= 0"},
  {"max_rows", "dynamic tables: rows kept over all ps tasks, the least recently updated removed first "
               "(0: unbounded)", "int", "an integer >= 0"},
  {"evict_every", "dynamic tables: removal passes run every N global steps (and before a checkpoint)", "int",
   "an integer >= 1"},
  {"sparse_optimizer", "this table's update rule: sgd | momentum | adagrad | ftrl | adam | rmsprop "
                       "(empty: the job's --sparse_optimizer)", "text",
   "one of sgd, momentum, adagrad, ftrl, adam, rmsprop (or empty: the job's)"},
  {"storage", "where the rows live on the ps: memory | disk", "text", "memory or disk"},
};
// clang-format on

const TableField* FindField(std::string_view name) {
  for (const TableField& f : kFields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// "table 'NAME': ", or "" for a table not named yet.
std::string Who(const TableSpec& spec) {
  return spec.name.empty() ? std::string() : absl::StrCat("table '", spec.name, "': ");
}

}  // namespace

absl::StatusOr<TableInitializer> TableInitializer::Parse(std::string_view text) {
  const std::vector<std::string> parts = absl::StrSplit(absl::string_view(text.data(), text.size()), ':');
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer '", std::string(text), "' is not one of ", std::string(kInitForms)));
  };
  std::vector<float> numbers;
  for (size_t i = 1; i < parts.size(); ++i) {
    float v;
    if (!absl::SimpleAtof(parts[i], &v) || !std::isfinite(v)) return bad();
    numbers.push_back(v);
  }
  absl::StatusOr<InitKind> kind = ParseInitKind(parts[0]);
  if (!kind.ok()) return bad();
  TableInitializer init;
  init.kind = *kind;
  const size_t want = init.kind == InitKind::kZeros ? 0 : init.kind == InitKind::kConstant ? 1 : 2;
  if (numbers.size() != want) return bad();
  switch (init.kind) {
    case InitKind::kZeros:
      break;
    case InitKind::kConstant:
      init.value = numbers[0];
      break;
    case InitKind::kUniform:
      init.minval = numbers[0];
      init.maxval = numbers[1];
      break;
    case InitKind::kNormal:
    case InitKind::kTruncatedNormal:
      init.mean = numbers[0];
      init.stddev = numbers[1];
      break;
  }
  if (init.minval > init.maxval || init.stddev < 0.0f) return bad();
  return init;
}

std::string TableInitializer::ToString() const {
  const std::string name(InitKindName(kind));
  switch (kind) {
    case InitKind::kZeros:
      return name;
    case InitKind::kConstant:
      return absl::StrCat(name, ":", FloatText(value));
    case InitKind::kUniform:
      return absl::StrCat(name, ":", FloatText(minval), ":", FloatText(maxval));
    case InitKind::kNormal:
    case InitKind::kTruncatedNormal:
      return absl::StrCat(name, ":", FloatText(mean), ":", FloatText(stddev));
  }
  return name;
}

std::string_view TableKindName(TableKind kind) { return kind == TableKind::kDynamic ? "dynamic" : "fixed"; }
std::string_view TableStorageName(TableStorage storage) { return storage == TableStorage::kDisk ? "disk" : "memory"; }
std::string_view InitKindName(InitKind kind) {
  switch (kind) {
    case InitKind::kZeros:
      return "zeros";
    case InitKind::kConstant:
      return "constant";
    case InitKind::kUniform:
      return "uniform";
    case InitKind::kNormal:
      return "normal";
    case InitKind::kTruncatedNormal:
      return "truncated_normal";
  }
  return "?";
}

absl::StatusOr<TableKind> ParseTableKind(std::string_view text) {
  if (text == "fixed") return TableKind::kFixed;
  if (text == "dynamic") return TableKind::kDynamic;
  return absl::InvalidArgumentError(absl::StrCat("kind '", std::string(text), "' is not fixed or dynamic"));
}

absl::StatusOr<TableStorage> ParseTableStorage(std::string_view text) {
  if (text == "memory") return TableStorage::kMemory;
  if (text == "disk") return TableStorage::kDisk;
  return absl::InvalidArgumentError(absl::StrCat("storage '", std::string(text), "' is not memory or disk"));
}

absl::StatusOr<InitKind> ParseInitKind(std::string_view text) {
  for (InitKind k :
       {InitKind::kZeros, InitKind::kConstant, InitKind::kUniform, InitKind::kNormal, InitKind::kTruncatedNormal}) {
    if (InitKindName(k) == text) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("initializer kind '", std::string(text), "' is not one of ",
                                                 "zeros, constant, uniform, normal, truncated_normal"));
}

absl::Status ValidateTableSpec(const TableSpec& t) {
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("table '", t.name, "': ", what));
  };
  if (t.name.empty()) return absl::InvalidArgumentError("a table without a name: give every table a name");
  if (t.dim < 1) return bad(absl::StrCat("dim ", t.dim, " must be >= 1"));
  if (!t.dynamic() && t.num_embeddings < 1) {
    return bad(absl::StrCat("a fixed table needs num_embeddings >= 1 (got ", t.num_embeddings, ")"));
  }
  const TableInitializer& i = t.initializer;
  if (!std::isfinite(i.value) || !std::isfinite(i.minval) || !std::isfinite(i.maxval) || !std::isfinite(i.mean) ||
      !std::isfinite(i.stddev) || !(i.stddev >= 0.0f) || !(i.minval <= i.maxval)) {
    return bad("initializer parameters must be finite, with stddev >= 0 and minval <= maxval");
  }
  const TableLifecycle& l = t.lifecycle;
  if (l.admit_after < 0 || l.steps_to_live < 0 || l.max_rows < 0 || l.evict_every < 1) {
    return bad(absl::StrCat("admit_after, steps_to_live and max_rows must be >= 0 and evict_every >= 1, got ",
                            l.admit_after, ", ", l.steps_to_live, ", ", l.max_rows, ", ", l.evict_every));
  }
  if (!t.dynamic() && (l.admit_after > 1 || l.steps_to_live > 0 || l.max_rows > 0)) {
    return bad(
        "admit_after, steps_to_live and max_rows are for dynamic tables only; drop them or declare the "
        "table dynamic");
  }
  if (!t.sparse_optimizer.empty() && !IsRule(t.sparse_optimizer)) {
    return bad(absl::StrCat("sparse_optimizer '", t.sparse_optimizer, "' is not one of ",
                            absl::StrJoin(absl::StrSplit(std::string(kTableRules), ' '), ", "),
                            " (or empty: the job's)"));
  }
  return absl::OkStatus();
}

std::span<const TableField> TableFields() { return kFields; }

std::string TableFieldText(const TableSpec& spec, std::string_view field) {
  const TableLifecycle& l = spec.lifecycle;
  if (field == "initializer") return spec.initializer.ToString();
  if (field == "seed") return absl::StrCat(spec.initializer.seed);
  if (field == "partition_strategy") return std::string(TableStrategyName(spec.strategy));
  if (field == "admit_after") return absl::StrCat(l.admit_after);
  if (field == "steps_to_live") return absl::StrCat(l.steps_to_live);
  if (field == "max_rows") return absl::StrCat(l.max_rows);
  if (field == "evict_every") return absl::StrCat(l.evict_every);
  if (field == "sparse_optimizer") return spec.sparse_optimizer;
  if (field == "storage") return std::string(TableStorageName(spec.storage));
  CHECK(false) << "no table field '" << field << "' (dist/table_spec.cc kFields)";
  return "";
}

std::string TableFieldDefault(std::string_view field) { return TableFieldText(TableSpec{}, field); }

absl::Status SetTableField(TableSpec* spec, std::string_view field, std::string_view text) {
  const TableField* row = FindField(field);
  if (row == nullptr) {
    std::vector<std::string> names;
    for (const TableField& f : kFields) names.emplace_back(f.name);
    return absl::InvalidArgumentError(
        absl::StrCat(Who(*spec), "no option '", std::string(field), "'; the options are ", absl::StrJoin(names, ", ")));
  }
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(Who(*spec), std::string(field), "=", std::string(text), " must be ", std::string(row->must_be)));
  };
  TableLifecycle& l = spec->lifecycle;
  int64_t* count = field == "admit_after"     ? &l.admit_after
                   : field == "steps_to_live" ? &l.steps_to_live
                   : field == "max_rows"      ? &l.max_rows
                   : field == "evict_every"   ? &l.evict_every
                                              : nullptr;
  if (count != nullptr) {
    int64_t v = 0;
    if (!ParseInt(text, &v) || v < (field == "evict_every" ? 1 : 0)) return bad();
    *count = v;
  } else if (field == "seed") {
    uint64_t v = 0;
    if (!ParseInt(text, &v)) return bad();
    spec->initializer.seed = v;
  } else if (field == "initializer") {
    absl::StatusOr<TableInitializer> init = TableInitializer::Parse(text);
    if (!init.ok()) return bad();
    init->seed = spec->initializer.seed;
    spec->initializer = *init;
  } else if (field == "partition_strategy") {
    absl::StatusOr<TableStrategy> s = ParseTableStrategy(text);
    if (!s.ok()) return bad();
    spec->strategy = *s;
  } else if (field == "sparse_optimizer") {
    if (!text.empty() && !IsRule(text)) return bad();
    spec->sparse_optimizer = std::string(text);
  } else if (field == "storage") {
    absl::StatusOr<TableStorage> s = ParseTableStorage(text);
    if (!s.ok()) return bad();
    spec->storage = *s;
  }
  return absl::OkStatus();
}

}  // namespace psflow::dist
