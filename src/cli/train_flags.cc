// The flag table as CLI11 options (cli/train_flags.h). CLI11 reads the text; the table's
// SetFlagFromText turns it into the member's type with the house error, so every number flag says
// "--flag=abc must be an integer" (or "a number") rather than CLI11's "Could not convert".
#include "cli/train_flags.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "psflow/nn/model.h"
#include "train/flags.h"

namespace psflow::cli {
namespace {

bool Contains(std::initializer_list<absl::string_view> names, absl::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// CLI11's name for the flag's type in --help ("--batch_size INT").
std::string TypeName(const train::Flag& flag) {
  return std::visit(
      [](auto member) -> std::string {
        if constexpr (std::is_same_v<decltype(member), train::TableOptionField>) {
          return member.integer ? "INT" : "TEXT";
        } else {
          using Field = std::remove_cvref_t<decltype(std::declval<train::TrainOptions&>().*member)>;
          if constexpr (std::is_same_v<Field, std::string>) {
            return "TEXT";
          } else if constexpr (std::is_same_v<Field, uint64_t>) {
            return "UINT";
          } else if constexpr (std::is_same_v<Field, double> || std::is_same_v<Field, std::optional<float>>) {
            return "FLOAT";
          } else {
            return "INT";
          }
        }
      },
      flag.field);
}

// " (default: the model's: softmax X, mlp Y, cnn Z, vgg19 W[, registered models])", or "". A
// model that leaves a table flag unset (no tables) is not listed; the flag's own fallback is named.
std::string ModelDefaultsHelp(const train::Flag& flag) {
  if (std::holds_alternative<std::monostate>(flag.model_default)) return "";
  const std::string name(flag.name);
  const char* fallback = name == "sparse_optimizer"       ? "--optimizer's rule"
                         : name == "sparse_learning_rate" ? "--learning_rate"
                                                          : nullptr;
  std::string listed;
  for (const std::string& model : nn::ModelNames()) {
    auto defaults = nn::DefaultsFor(model);
    if (!defaults.ok()) continue;
    const std::string text = train::ModelDefaultText(flag, *defaults);
    if (fallback != nullptr && (text.empty() || text == "0")) continue;
    absl::StrAppend(&listed, listed.empty() ? "" : ", ", model, " ", text);
  }
  if (fallback == nullptr) return absl::StrCat(" (default: the model's: ", listed, ")");
  return absl::StrCat(" (default: ", fallback, listed.empty() ? "" : absl::StrCat("; the model's: ", listed), ")");
}

void AddModelSettings(CLI::App* app, train::TrainOptions* o) {
  // Every registered model's settings (the --model is not known yet); ResolveTrainOptions refuses
  // one that is not the chosen model's. Two models may share a setting's name.
  std::vector<std::string> added;
  for (const std::string& model : nn::ModelNames()) {
    auto defaults = nn::DefaultsFor(model);
    if (!defaults.ok()) continue;
    for (const nn::ModelSetting& s : defaults->settings) {
      const std::string name = absl::StrCat("--", s.name);
      if (train::FindFlag(s.name) != nullptr || std::find(added.begin(), added.end(), name) != added.end()) continue;
      added.push_back(name);
      app->add_option_function<std::string>(
             name, [o, setting = s.name](const std::string& text) { o->model_settings[setting] = text; },
             absl::StrCat(s.help, " (a setting of --model=", model, ")"))
          ->type_name("TEXT")
          ->default_str(s.default_value)
          ->group("Model settings");
    }
  }
}

}  // namespace

void AddTrainFlags(CLI::App* app, train::TrainOptions* o, std::initializer_list<absl::string_view> only) {
  // A flag given twice takes the last value (scripts append overrides: run_mnist.sh --train_steps=500).
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  for (const train::Flag& flag : train::TrainFlags()) {
    if (only.size() > 0 && !Contains(only, flag.name)) continue;
    const std::string name = absl::StrCat("--", flag.name);
    const std::string help = absl::StrCat(flag.help, ModelDefaultsHelp(flag));
    const bool is_bool = std::holds_alternative<bool train::TrainOptions::*>(flag.field);
    app->add_option_function<std::string>(
           name,
           [&flag, o](const std::string& text) {
             if (absl::Status s = train::SetFlagFromText(flag, text, o); !s.ok()) {
               throw FlagValueError(std::string(s.message()));
             }
           },
           help)
        ->type_name(TypeName(flag))
        ->default_str(train::FlagValueText(flag, *o));
    if (is_bool) {
      // A flag: --name alone is --name=true (CLI11 passes the default text for a bare flag, and
      // shows no value in --help for a flag taking none).
      app->get_option(name)->type_size(0)->default_str("true");
    }
  }
  AddModelSettings(app, o);
}

std::vector<std::string> GivenFlagArgs(const CLI::App& app, const train::TrainOptions& options,
                                       std::initializer_list<absl::string_view> except) {
  std::vector<std::string> args;
  for (const train::Flag& flag : train::TrainFlags()) {
    const std::string name = absl::StrCat("--", flag.name);
    const CLI::Option* option = app.get_option_no_throw(name);
    if (Contains(except, flag.name) || option == nullptr || option->count() == 0) continue;
    args.push_back(train::FlagArg(flag, options));
  }
  for (const auto& [name, value] : options.model_settings) args.push_back(absl::StrCat("--", name, "=", value));
  return args;
}

}  // namespace psflow::cli
