// psflow._CheckpointWatcher: the evaluator task of programs/eval/evaluator.h for a Python script (a PyTorch
// evaluator started by `psflow local --evaluator -- python3 ...` or by TF_CONFIG's task type
// "evaluator"). next() waits (GIL released) for the next new checkpoint and hands its variables to
// Python as numpy copies; report() prints the metrics line and writes them under --logdir/eval/.
// Used from one Python thread (the object is not thread-safe; python/psflow/evaluator.py wraps it).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "binding.h"
#include "programs/eval/evaluator.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

class CheckpointWatcherBinding {
 public:
  explicit CheckpointWatcherBinding(const Flags& flags)
      : options_(flags.options),
        log_([](const std::string& line) { std::cout << line << std::endl; }),
        watcher_(WatchFor(flags.options)) {
    if (options_.checkpoint_dir.empty()) {
      throw StatusError(absl::InvalidArgumentError(
          "the evaluator needs --checkpoint_dir=DIR: the directory the chief saves checkpoints to"));
    }
    reporter_ = ValueOrThrow(train::EvalReporter::Create(options_.logdir, log_, options_.env));
  }

  // None when training ended; else (global_step, path, {variable name: numpy array}).
  py::object Next() {
    absl::StatusOr<std::optional<ckpt::Checkpoint>> next;
    {
      py::gil_scoped_release release;
      next = watcher_.Next(log_);
    }
    std::optional<ckpt::Checkpoint> checkpoint = ValueOrThrow(std::move(next));
    if (!checkpoint.has_value()) return py::none();
    py::dict variables;
    for (const auto& [name, tensor] : checkpoint->contents.tensors) {
      if (name.find("/slot/") != std::string::npos) continue;  // optimizer slots: not the model's
      py::array_t<float> array(std::vector<py::ssize_t>(tensor.shape().begin(), tensor.shape().end()));
      std::memcpy(array.mutable_data(), tensor.data(), tensor.bytes());
      variables[py::str(name)] = array;
    }
    return py::make_tuple(checkpoint->global_step, checkpoint->path, variables);
  }

  void Report(int64_t global_step, const std::string& path, const py::dict& metrics) {
    train::Metrics values;
    for (const auto& [key, value] : metrics) {
      try {
        values.emplace_back(py::str(key), value.cast<double>());
      } catch (const py::cast_error&) {
        throw StatusError(absl::InvalidArgumentError(absl::StrCat(
            "evaluate() returned a non-number for '", std::string(py::str(key)), "': return {name: float}")));
      }
    }
    ThrowIfError(reporter_->Report(global_step, path, values));
  }

  void Finish() {
    log_(absl::StrCat("evaluator: training ended at global step ", watcher_.last_step(), "; evaluated ",
                      reporter_->reported(), " checkpoint(s)"));
  }

 private:
  static train::WatchOptions WatchFor(const train::TrainOptions& o) {
    train::WatchOptions watch;
    watch.checkpoint_dir = o.checkpoint_dir;
    watch.timeout_secs = o.eval_timeout_secs;
    return watch;
  }

  const train::TrainOptions options_;
  const train::LogSink log_;
  train::CheckpointWatcher watcher_;
  std::unique_ptr<train::EvalReporter> reporter_;
};

}  // namespace

void RegisterEvaluator(py::module_& m) {
  py::class_<CheckpointWatcherBinding>(m, "_CheckpointWatcher")
      .def(py::init<const Flags&>(), py::arg("flags"))
      .def("next", &CheckpointWatcherBinding::Next)
      .def("report", &CheckpointWatcherBinding::Report, py::arg("global_step"), py::arg("path"), py::arg("metrics"))
      .def("finish", &CheckpointWatcherBinding::Finish);
}

}  // namespace psflow::python
