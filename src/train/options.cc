// Resolution and validation of TrainOptions (psflow/train/options.h), row by row of the flag table
// (train/flags.h). One rule for every invalid value: InvalidArgument "--flag=value must be <what it
// must be>[; the fix]", which the CLI prints as one line and exits 2 (usage error) for; nothing is
// silently replaced or ignored.
#include "psflow/train/options.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ps/server/table/sparse_rule.h"
#include "psflow/dist/partition.h"
#include "psflow/dist/slurm.h"
#include "psflow/nn/model.h"
#include "train/flags.h"
#include "train/sparse_rule_config.h"

namespace psflow::train {
namespace {

// The given settings must be the --model's; its left-out ones take their defaults.
absl::Status ResolveModelSettings(const nn::ModelDefaults& defaults, TrainOptions* o) {
  for (const auto& setting : o->model_settings) {
    const std::string& name = setting.first;  // a named variable: lambdas may capture it (clang)
    const bool known = std::any_of(defaults.settings.begin(), defaults.settings.end(),
                                   [&](const nn::ModelSetting& s) { return s.name == name; });
    if (known) continue;
    std::vector<std::string> owners;
    for (const std::string& model : nn::ModelNames()) {
      auto d = nn::DefaultsFor(model);
      if (d.ok() && std::any_of(d->settings.begin(), d->settings.end(),
                                [&](const nn::ModelSetting& s) { return s.name == name; })) {
        owners.push_back(model);
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, "=", setting.second, " is a setting of model ", absl::StrJoin(owners, " and "),
        ", not of --model=", o->model, "; leave it out or choose --model=", owners.empty() ? "" : owners[0]));
  }
  for (const nn::ModelSetting& s : defaults.settings) {
    if (FindFlag(s.name) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("model ", o->model, " declares a setting --", s.name,
                                                     " but that is a psflow flag; rename the setting"));
    }
    auto [it, left_out] = o->model_settings.emplace(s.name, s.default_value);
    if (!s.check) continue;
    if (absl::Status c = s.check(it->second); !c.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", s.name, "=", it->second, " must be ", c.message(),
                                                     left_out ? " (the model's default)" : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveTrainOptions(TrainOptions* o) {
  auto defaults = nn::DefaultsFor(o->model);
  if (!defaults.ok()) return defaults.status();
  // Each given value against its flag's rule (train/flags.cc), then the model's values for the
  // flags left out, then the rules between flags.
  if (absl::Status s = CheckFlagRules(*o, *defaults); !s.ok()) return s;
  // Training files without --train_steps train until the files (--num_epochs passes) end.
  if (!o->train_files.empty() && !o->train_steps.has_value()) o->train_steps = kUntilTheDataEnds;
  FillModelDefaults(*defaults, o);
  if (absl::Status s = ResolveModelSettings(*defaults, o); !s.ok()) return s;
  // The dense rule first: the tables' rule defaults to it, and a bad --optimizer is named as such.
  auto optimizer = optim::MakeOptimizer(OptimizerConfigFrom(*o));
  if (!optimizer.ok()) return optimizer.status();
  // The tables' rule defaults to the dense one when a table rule of that name exists; a dense-only
  // rule (adamw) leaves it unset, so a model without tables trains, and one with tables is refused
  // where they are declared, naming both flags.
  const std::vector<std::string> table_rules = {"sgd", "momentum", "adagrad", "ftrl", "adam", "rmsprop"};
  const bool sparse_given = !o->sparse_optimizer.empty();
  if (!sparse_given && absl::c_linear_search(table_rules, o->optimizer)) o->sparse_optimizer = o->optimizer;
  if (sparse_given && !absl::c_linear_search(table_rules, o->sparse_optimizer)) {
    return absl::InvalidArgumentError(absl::StrCat("--sparse_optimizer=", o->sparse_optimizer,
                                                   " must be one of sgd, momentum, adagrad, ftrl, adam, rmsprop"));
  }
  // The partitioner and placement are read where the variables are placed (each task); checked here
  // too, so a bad one is refused before anything trains or any task starts (psflow local).
  if (auto partitioner = dist::ParsePartitioner(o->partitioner); !partitioner.ok()) return partitioner.status();
  if (auto placement = dist::ParsePlacement(o->placement); !placement.ok()) return placement.status();
  if (*o->sparse_learning_rate == 0.0f) o->sparse_learning_rate = o->learning_rate;
  if (!o->slurm_jobs.empty()) {
    if (auto jobs = dist::ParseSlurmJobs(o->slurm_jobs); !jobs.ok()) return jobs.status();
  }
  if (o->local_replicas > *o->batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("--local_replicas=", o->local_replicas,
                                                   " must be at most --batch_size=", *o->batch_size,
                                                   ": each replica needs at least one example"));
  }
  if (o->table_sync == "async" && !o->sync_replicas) {
    return absl::InvalidArgumentError(
        "--table_sync=async needs --sync_replicas (hybrid: dense variables sync, tables async); without it "
        "training is asynchronous already, tables included");
  }
  if (o->staleness_aware_lr && o->sync_replicas) {
    return absl::InvalidArgumentError(
        "--staleness_aware_lr is for asynchronous training; with --sync_replicas stale gradients are dropped "
        "(leave out one of the two)");
  }
  const auto storage = o->table_options.find("storage");
  const bool disk_tables = storage != o->table_options.end() && storage->second == "disk";
  if (disk_tables && o->table_dir.empty()) {
    return absl::InvalidArgumentError(
        "--table_storage=disk needs --table_dir: an existing directory the ps tasks "
        "may write (each keeps its tables in ps_<task> inside it)");
  }
  if (disk_tables && o->model == "ctr" && o->ctr_vocab > 0) {
    return absl::InvalidArgumentError(absl::StrCat("--table_storage=disk holds dynamic tables only; --ctr_vocab=",
                                                   o->ctr_vocab, " makes fixed tables (use --ctr_vocab=0)"));
  }
  if (!o->sparse_optimizer.empty()) {
    auto rule = ps::table::SparseRule::Make(SparseRuleConfigFrom(*o));
    if (!rule.ok()) return rule.status();
  }
  return absl::OkStatus();
}

nn::ModelConfig ModelConfigFrom(const TrainOptions& o) {
  nn::ModelConfig config{o.model, o.hidden_units, o.seed, o.model_settings};
  // Options never resolved (psflow eval's few flags) still give the model every setting.
  if (auto defaults = nn::DefaultsFor(o.model); defaults.ok()) {
    for (const nn::ModelSetting& s : defaults->settings) config.settings.emplace(s.name, s.default_value);
  }
  return config;
}

optim::OptimizerConfig OptimizerConfigFrom(const TrainOptions& o) {
  optim::OptimizerConfig config;
  config.name = o.optimizer;
  config.learning_rate = o.learning_rate.value_or(config.learning_rate);
  config.decay_steps = o.lr_decay_steps.value_or(0);
  config.decay_rate = o.lr_decay_rate.value_or(1.0f);
  config.staircase = o.lr_staircase;
  return config;
}

ps::table::SparseRuleConfig SparseRuleConfigFrom(const TrainOptions& o) {
  ps::table::SparseRuleConfig config;
  config.optimizer = OptimizerConfigFrom(o);
  config.optimizer.name = o.sparse_optimizer.empty() ? o.optimizer : o.sparse_optimizer;
  config.optimizer.learning_rate = o.sparse_learning_rate.value_or(config.optimizer.learning_rate);
  config.ftrl_l1 = static_cast<float>(o.ftrl_l1);
  config.ftrl_l2 = static_cast<float>(o.ftrl_l2);
  return config;
}

}  // namespace psflow::train
