// psflow.optim's bridge to optim::OptimizerConfig (psflow/optim/optimizer.h): the dict psflow.optim
// builds from torch.optim-shaped arguments becomes the config the ps tasks run (one implementation
// of every rule and schedule: src/optim), and `_learning_rate_at` reads a schedule through the very
// function the ps tasks use.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "binding.h"
#include "psflow/optim/optimizer.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

optim::ParameterGroup GroupFromDict(const py::dict& d) {
  optim::ParameterGroup g;
  for (const auto& [key_obj, value] : d) {
    const std::string key = py::str(key_obj);
    if (key == "variables") {
      g.variables = value.cast<std::vector<std::string>>();
    } else if (key == "learning_rate") {
      if (!value.is_none()) g.learning_rate = value.cast<float>();
    } else if (key == "lr_scale") {
      g.lr_scale = value.cast<float>();
    } else if (key == "weight_decay") {
      if (!value.is_none()) g.weight_decay = value.cast<float>();
    } else {
      throw StatusError(
          absl::InvalidArgumentError(absl::StrCat("optimizer config: unknown parameter group key '", key, "'")));
    }
  }
  return g;
}

}  // namespace

optim::OptimizerConfig OptimizerConfigFromDict(const py::dict& d) {
  optim::OptimizerConfig c;
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    const py::handle value = item.second;  // a named variable: lambdas may capture it (clang)
    auto f = [value] { return value.cast<float>(); };
    auto i = [value] { return value.cast<int64_t>(); };
    if (key == "name")
      c.name = value.cast<std::string>();
    else if (key == "convention")
      c.convention = value.cast<std::string>();
    else if (key == "learning_rate")
      c.learning_rate = f();
    else if (key == "momentum")
      c.momentum = f();
    else if (key == "nesterov")
      c.nesterov = value.cast<bool>();
    else if (key == "initial_accumulator")
      c.initial_accumulator = f();
    else if (key == "adagrad_epsilon")
      c.adagrad_epsilon = f();
    else if (key == "beta1")
      c.beta1 = f();
    else if (key == "beta2")
      c.beta2 = f();
    else if (key == "adam_epsilon")
      c.adam_epsilon = f();
    else if (key == "rms_decay")
      c.rms_decay = f();
    else if (key == "rms_momentum")
      c.rms_momentum = f();
    else if (key == "rms_epsilon")
      c.rms_epsilon = f();
    else if (key == "weight_decay")
      c.weight_decay = f();
    else if (key == "schedule")
      c.schedule = value.cast<std::string>();
    else if (key == "decay_steps")
      c.decay_steps = i();
    else if (key == "decay_rate")
      c.decay_rate = f();
    else if (key == "staircase")
      c.staircase = value.cast<bool>();
    else if (key == "cosine_steps")
      c.cosine_steps = i();
    else if (key == "min_learning_rate")
      c.min_learning_rate = f();
    else if (key == "boundaries")
      c.boundaries = value.cast<std::vector<int64_t>>();
    else if (key == "values")
      c.values = value.cast<std::vector<float>>();
    else if (key == "warmup_steps")
      c.warmup_steps = i();
    else if (key == "warmup_start_factor")
      c.warmup_start_factor = f();
    else if (key == "groups") {
      for (const py::handle& g : value) c.groups.push_back(GroupFromDict(g.cast<py::dict>()));
    } else {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat("optimizer config: unknown key '", key, "'")));
    }
  }
  // MakeOptimizer validates the whole config (rule, schedule, groups) with its one-line errors.
  ValueOrThrow(optim::MakeOptimizer(c));
  return c;
}

void RegisterOptim(py::module_& m) {
  m.def(
      "_learning_rate_at",
      [](const py::dict& config, int64_t step, const std::string& variable) {
        const optim::OptimizerConfig c = OptimizerConfigFromDict(config);
        return optim::LearningRateAt(variable.empty() ? c : optim::ConfigForVariable(c, variable), step);
      },
      py::arg("config"), py::arg("step"), py::arg("variable") = "",
      "The learning rate at a global step under an optimizer config (the ps tasks' function); with "
      "`variable`, that variable's parameter group's.");
  m.def(
      "_check_optimizer", [](const py::dict& config) { OptimizerConfigFromDict(config); }, py::arg("config"),
      "Raises psflow.InvalidArgumentError when the ps tasks would refuse this optimizer config.");
}

}  // namespace psflow::python
