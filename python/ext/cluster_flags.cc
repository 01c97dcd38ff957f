// psflow.ClusterSpec, psflow.Flags / parse_flags, psflow.Server: the cluster description, the
// `psflow train` flags (one attribute per row of the flag table, train/flags.h; parsed and layered
// by psflow::cli::ParseFlags, psflow/cli/flags.h) and the C++ ps task run inside the Python process.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <thread>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "binding.h"
#include "psflow/cli/flags.h"
#include "psflow/dist/cluster.h"
#include "psflow/train/options.h"
#include "train/cluster_setup.h"
#include "train/flags.h"
#include "train/ps_task.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

std::string EnvOr(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// --- ClusterSpec -------------------------------------------------------------------------------

dist::ClusterSpec ClusterFromDict(const py::dict& jobs) {
  std::vector<std::string> ps, workers, chief;
  for (const auto& [key, value] : jobs) {
    const std::string job = py::str(key);
    std::vector<std::string> hosts;
    if (py::isinstance<py::str>(value)) {
      hosts.push_back(value.cast<std::string>());
    } else {
      try {
        hosts = value.cast<std::vector<std::string>>();
      } catch (const py::cast_error&) {
        throw StatusError(absl::InvalidArgumentError(
            absl::StrCat("ClusterSpec: job '", job, "' must be a list of \"host:port\" strings")));
      }
    }
    if (job == "ps") {
      ps = hosts;
    } else if (job == "worker") {
      workers = hosts;
    } else if (job == "chief") {
      chief = hosts;
    } else if (job != "evaluator") {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          "ClusterSpec: unsupported job '", job, "'; a psflow cluster has 'ps', 'worker' and optionally 'chief'")));
    }
  }
  if (chief.size() > 1) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("ClusterSpec: 'chief' lists ", chief.size(), " tasks; there is at most one chief")));
  }
  // As in TF_CONFIG: the chief is worker 0 and the workers follow it.
  chief.insert(chief.end(), workers.begin(), workers.end());
  return ValueOrThrow(dist::ClusterSpec::FromHostLists(absl::StrJoin(ps, ","), absl::StrJoin(chief, ",")));
}

py::dict ClusterAsDict(const dist::ClusterSpec& c) {
  py::dict d;
  d["ps"] = c.ps();
  d["worker"] = c.workers();
  return d;
}

// --- Flags -------------------------------------------------------------------------------------

std::string FlagValue(const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "true" : "false";
  return py::str(value);
}

// psflow.parse_flags: the arguments as C++ wants them (the dict of defaults as "--name=value",
// sys.argv[1:] when argv is not given), then psflow::cli::ParseFlags.
Flags ParseFlags(const std::optional<std::vector<std::string>>& argv, const std::optional<py::dict>& defaults) {
  std::vector<std::string> default_args;
  if (defaults.has_value()) {
    for (const auto& item : *defaults) {
      default_args.push_back(absl::StrCat("--", std::string(py::str(item.first)), "=", FlagValue(item.second)));
    }
  }
  std::vector<std::string> args;
  if (argv.has_value()) {
    args = *argv;
  } else {
    py::list sys_argv = py::module_::import("sys").attr("argv");
    for (size_t i = 1; i < sys_argv.size(); ++i) args.push_back(py::str(sys_argv[i]));
  }
  return ValueOrThrow(cli::ParseFlags(args, default_args));
}

// --- Server ------------------------------------------------------------------------------------

void JoinServer(const train::TrainOptions& options) {
  train::PsTaskControl control;
  control.tf_config = "";  // the ClusterSpec given replaces TF_CONFIG
  std::promise<absl::Status> promise;
  std::future<absl::Status> result = promise.get_future();
  auto log = [](const std::string& line) { std::cout << line << std::endl; };
  std::thread task([&] { promise.set_value(train::RunParameterServer(options, log, &control)); });
  bool interrupted = false;
  for (;;) {
    bool ready;
    {
      py::gil_scoped_release release;
      ready = result.wait_for(std::chrono::milliseconds(100)) == std::future_status::ready;
    }
    if (ready) break;
    if (PyErr_CheckSignals() != 0) {  // Ctrl-C (KeyboardInterrupt) or another signal handler raised
      interrupted = true;
      control.stop = true;
      py::gil_scoped_release release;
      result.wait();
      break;
    }
  }
  {
    py::gil_scoped_release release;
    task.join();
  }
  if (interrupted) throw py::error_already_set();
  ThrowIfError(result.get());
}

}  // namespace

void RegisterCluster(py::module_& m) {
  py::class_<dist::ClusterSpec>(m, "ClusterSpec", R"doc(The cluster: ps and worker task addresses.

ClusterSpec({"ps": ["h:p", ...], "worker": ["h:p", ...]}) as tf.train.ClusterSpec (a "chief"
entry becomes worker 0); ClusterSpec.from_flags(flags); ClusterSpec.from_tf_config(text=None).
Bad addresses raise psflow.InvalidArgumentError with psflow train's message.)doc")
      .def(py::init([](const py::dict& jobs) { return ClusterFromDict(jobs); }), py::arg("cluster"))
      .def_static(
          "from_flags",
          [](const Flags& flags) {
            const train::TrainOptions& o = flags.options;
            return ValueOrThrow(train::ResolveTaskCluster(o)).first;
          },
          py::arg("flags"),
          "The cluster of --ps_hosts/--worker_hosts, or else of $TF_CONFIG, or else of the Slurm step (--slurm_jobs).")
      .def_static(
          "from_tf_config",
          [](std::optional<std::string> text) {
            const std::string json = text.has_value() ? *text : EnvOr("TF_CONFIG");
            if (json.empty()) throw StatusError(absl::InvalidArgumentError("TF_CONFIG is not set"));
            return ValueOrThrow(dist::ClusterSpec::FromTfConfig(json)).first;
          },
          py::arg("text") = py::none(), "The cluster of a TF_CONFIG text (default: $TF_CONFIG).")
      .def_property_readonly("num_ps", &dist::ClusterSpec::num_ps)
      .def_property_readonly("num_workers", &dist::ClusterSpec::num_workers)
      .def_property_readonly("ps", &dist::ClusterSpec::ps)
      .def_property_readonly("worker", &dist::ClusterSpec::workers)
      .def("as_dict", &ClusterAsDict)
      .def("__eq__", [](const dist::ClusterSpec& a, const dist::ClusterSpec& b) { return a == b; })
      .def("__repr__", [](const dist::ClusterSpec& c) { return absl::StrCat("ClusterSpec(", c.ToString(), ")"); });
}

void RegisterFlags(py::module_& m) {
  // dynamic_attr: psflow.parse_flags(parser) sets the script's own arguments on the same object.
  py::class_<Flags> flags(m, "Flags", "Every psflow train flag as an attribute; .unparsed: the script's own flags.",
                          py::dynamic_attr());
  flags.def(py::init<>())
      .def(
          "_copy_options",
          [](const Flags& f) {
            return Flags{f.options, f.unparsed};
          },
          "A copy of the psflow flags (not the script's own attributes).")
      .def_readwrite("unparsed", &Flags::unparsed)
      .def("__repr__", [](const Flags& f) {
        // Flags whose default comes from the model are unset (None) until resolved.
        auto text = [&](const char* name) {
          const std::string value = train::FlagValueText(*train::FindFlag(name), f.options);
          return value.empty() ? std::string("None") : value;
        };
        return absl::StrCat("Flags(job_name='", f.options.job_name, "', task_index=", f.options.task_index,
                            ", train_steps=", text("train_steps"), ", batch_size=", text("batch_size"), ", ...)");
      });
  // One attribute per row of the flag table (train/flags.h), of the flag's own type (None for a
  // flag the model defaults, until parse_flags resolves it).
  for (const train::Flag& flag : train::TrainFlags()) {
    std::visit(
        [&](auto member) {
          if constexpr (std::is_same_v<decltype(member), train::TableOptionField>) {
            // A table option: None until given, then an int or a str as its field's type.
            const std::string field(member.field);
            const bool integer = member.integer;
            const train::Flag* row = &flag;
            flags.def_property(
                std::string(flag.name).c_str(),
                [field, integer](const Flags& f) -> py::object {
                  auto it = f.options.table_options.find(field);
                  if (it == f.options.table_options.end()) return py::none();
                  if (integer) return py::int_(py::str(it->second));
                  return py::str(it->second);
                },
                [field, row](Flags& f, const py::object& value) {
                  if (value.is_none()) {
                    f.options.table_options.erase(field);
                    return;
                  }
                  ThrowIfError(train::SetFlagFromText(*row, py::str(value).cast<std::string>(), &f.options));
                },
                std::string(flag.help).c_str());
          } else {
            using Field = std::remove_cvref_t<decltype(std::declval<train::TrainOptions&>().*member)>;
            flags.def_property(
                std::string(flag.name).c_str(), [member](const Flags& f) { return f.options.*member; },
                [member](Flags& f, Field value) { f.options.*member = std::move(value); },
                std::string(flag.help).c_str());
          }
        },
        flag.field);
  }
  flags.def(
      "as_dict",
      [](const py::object& self) {
        py::dict d;
        for (const train::Flag& flag : train::TrainFlags()) {
          const std::string name(flag.name);
          d[py::str(name)] = self.attr(name.c_str());
        }
        return d;
      },
      "Every psflow train flag and its value.");
  flags.def(
      "as_argv", [](const Flags& f) { return train::FlagArgs(f.options); },
      "The flags as psflow train command-line arguments (--name=value; unset and empty ones left out).");

  m.def("_parse_flags", &ParseFlags, py::arg("argv") = py::none(), py::arg("defaults") = py::none(),
        R"doc(Every psflow train flag, parsed by psflow train's own flag code.

Precedence, lowest first: psflow's defaults (the --model's), `defaults` (the script's own dict,
e.g. {"batch_size": 100}), $PSFLOW_FLAGS (JSON array set by `psflow local`), then `argv`
(default sys.argv[1:]). $TF_CONFIG, or else a Slurm step (srun), gives job_name/task_index when --ps_hosts/--worker_hosts are
absent. Flags psflow does not know are returned in .unparsed for the script's own parser. Invalid
values raise psflow.InvalidArgumentError with psflow train's one-line message.)doc");
}

void RegisterServer(py::module_& m) {
  m.def(
      "_join_server",
      [](const dist::ClusterSpec& cluster, const std::string& job_name, int task_index, const Flags& flags) {
        train::TrainOptions options = flags.options;
        options.ps_hosts = absl::StrJoin(cluster.ps(), ",");
        options.worker_hosts = absl::StrJoin(cluster.workers(), ",");
        options.job_name = job_name;
        options.task_index = task_index;
        options.slurm_jobs.clear();  // the cluster is given
        ThrowIfError(train::ResolveTrainOptions(&options));
        JoinServer(options);
      },
      py::arg("cluster"), py::arg("job_name"), py::arg("task_index"), py::arg("flags"),
      "Runs the C++ ps task until training ends (GIL released; Ctrl-C stops it).");
}

}  // namespace psflow::python
