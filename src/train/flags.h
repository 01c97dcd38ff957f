// The flags of `psflow train`, declared once (docs/design.md#command-line-and-summary): one row per
// flag — its name, the TrainOptions member it sets (whose C++ type is the flag's type and whose
// initial value is its default), its help, the values it accepts and, for the flags whose default
// is the model's, the nn::ModelDefaults member that fills it. Everything else reads this table:
//   - ResolveTrainOptions (train/options.cc) validates and fills defaults row by row;
//   - the CLI11 definitions of `train`, `local` and psflow::cli::ParseFlags (cli/train_flags.cc);
//   - the Python psflow.Flags attributes (python/ext/cluster_flags.cc).
// Adding a flag is one TrainOptions member plus one row here; a TrainOptions member without a row
// fails to compile (the member count is checked in flags.cc). The --table_<field> flags are made
// from dist::TableFields() (a table field added there is a flag here, and a keyword argument of
// psflow.torch's modules). Internal; the table is immutable.
#ifndef PSFLOW_TRAIN_FLAGS_H_
#define PSFLOW_TRAIN_FLAGS_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "psflow/nn/model.h"
#include "psflow/train/options.h"

namespace psflow::train {

// A table option: --table_<field> for a row of dist::TableFields(), kept as text in
// TrainOptions::table_options (absent: left out). Its rows are made from that table, not written here.
struct TableOptionField {
  absl::string_view field;  // "admit_after"
  bool integer = false;     // the field's type is "int"
};

// The TrainOptions member a flag sets; std::optional members are the ones the model defaults.
using FlagField =
    std::variant<bool TrainOptions::*, int TrainOptions::*, int64_t TrainOptions::*, uint64_t TrainOptions::*,
                 double TrainOptions::*, std::string TrainOptions::*, std::optional<int> TrainOptions::*,
                 std::optional<int64_t> TrainOptions::*, std::optional<float> TrainOptions::*, TableOptionField>;

// The nn::ModelDefaults member that fills a flag left out (monostate: the flag has its own default).
using ModelDefaultField = std::variant<std::monostate, std::string nn::ModelDefaults::*, float nn::ModelDefaults::*,
                                       int nn::ModelDefaults::*, int64_t nn::ModelDefaults::*>;

// The values a flag accepts, checked on every given value. Numbers: finite (when `finite`) and in
// [min, max], min excluded when `above_min`. Strings: one of the space-separated `one_of` (empty:
// any). `must_be` completes the error "--flag=value must be <must_be>" (empty: no check).
struct FlagRule {
  absl::string_view must_be;
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool above_min = false;
  bool finite = false;
  absl::string_view one_of;
};
// The rules of the table, by what they say.
constexpr FlagRule AtLeast(double min, absl::string_view must_be) {
  FlagRule rule;
  rule.must_be = must_be;
  rule.min = min;
  return rule;
}
constexpr FlagRule Between(double min, double max, absl::string_view must_be) {
  FlagRule rule = AtLeast(min, must_be);
  rule.max = max;
  return rule;
}
constexpr FlagRule Positive(absl::string_view must_be = "positive") {
  FlagRule rule = AtLeast(0, must_be);
  rule.above_min = true;
  return rule;
}
constexpr FlagRule Finite(FlagRule rule) {
  rule.finite = true;
  return rule;
}
constexpr FlagRule OneOf(absl::string_view choices, absl::string_view must_be) {
  FlagRule rule;
  rule.must_be = must_be;
  rule.one_of = choices;
  return rule;
}

struct Flag {
  absl::string_view name;  // "train_steps": given as --train_steps=VALUE
  FlagField field;
  absl::string_view help;
  FlagRule rule = {};
  ModelDefaultField model_default = {};
};

// Every flag of `psflow train`, in --help order (the table options last, in dist::TableFields() order).
std::span<const Flag> TrainFlags();
// The row named `name` (without "--"), or nullptr.
const Flag* FindFlag(absl::string_view name);

// The flag's value in `options` as text that parses back to the same value ("" for an unset
// std::optional): shortest round-trip form for numbers, "true"/"false" for booleans.
std::string FlagValueText(const Flag& flag, const TrainOptions& options);

// Sets the flag from command-line text; InvalidArgument "--batch_size=many must be an integer"
// (or "a number", "a non-negative integer", "true or false") when the text is not of its type.
absl::Status SetFlagFromText(const Flag& flag, absl::string_view text, TrainOptions* options);

// The flag as one command-line argument: "--name=value", or "--name" for a flag that is on.
std::string FlagArg(const Flag& flag, const TrainOptions& options);
// FlagArg of every flag whose value is set and non-empty (what `psflow train` needs to rebuild
// `options`).
std::vector<std::string> FlagArgs(const TrainOptions& options);

// InvalidArgument "--flag=value must be ..." for the first given value its row's rule refuses;
// `defaults` (the --model's) adds "; leave it out for the model's default (X)" for model flags.
absl::Status CheckFlagRules(const TrainOptions& options, const nn::ModelDefaults& defaults);
// Fills every model flag left out from `defaults`.
void FillModelDefaults(const nn::ModelDefaults& defaults, TrainOptions* options);
// The default a model gives the flag as text, or "" when the flag has no model default.
std::string ModelDefaultText(const Flag& flag, const nn::ModelDefaults& defaults);

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_FLAGS_H_
