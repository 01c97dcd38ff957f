// Resolution and validation of TrainOptions (psflow/train/options.h), row by row of the flag table
// (train/flags.h). One rule for every invalid value: InvalidArgument "--flag=value must be <what it
// must be>[; the fix]", which the CLI prints as one line and exits 2 (usage error) for; nothing is
// silently replaced or ignored.
#include "psflow/train/options.h"

#include "absl/strings/str_cat.h"
#include "psflow/nn/model.h"
#include "train/flags.h"

namespace psflow::train {

absl::Status ResolveTrainOptions(TrainOptions* o) {
  auto defaults = nn::DefaultsFor(o->model);
  if (!defaults.ok()) return defaults.status();
  // Each given value against its flag's rule (train/flags.cc), then the model's values for the
  // flags left out, then the rules between flags.
  if (absl::Status s = CheckFlagRules(*o, *defaults); !s.ok()) return s;
  FillModelDefaults(*defaults, o);
  if (o->local_replicas > *o->batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("--local_replicas=", o->local_replicas, " must be at most --batch_size=",
                                                   *o->batch_size, ": each replica needs at least one example"));
  }
  auto optimizer = optim::MakeOptimizer(OptimizerConfigFrom(*o));
  if (!optimizer.ok()) return optimizer.status();
  if (!o->sparse_optimizer.empty()) {
    bool known = false;
    for (const char* rule : {"sgd", "momentum", "adagrad", "adam", "rmsprop", "ftrl"}) known |= o->sparse_optimizer == rule;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("--sparse_optimizer=", o->sparse_optimizer,
                                                     " must be one of sgd, momentum, adagrad, adam, rmsprop, ftrl "
                                                     "(or empty: --optimizer's rule)"));
    }
  }
  return absl::OkStatus();
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

}  // namespace psflow::train
