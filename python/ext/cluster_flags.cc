// psflow.ClusterSpec, psflow.Flags / parse_flags, psflow.Server: the cluster description, the
// `psflow train` flags (parsed by the CLI's own CLI11 definitions, src/cli/train_flags.cc) and the
// C++ ps task run inside the Python process.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "binding.h"
#include "cli/train_flags.h"
#include "nlohmann/json.hpp"
#include "psflow/dist/cluster.h"
#include "psflow/dist/slurm.h"
#include "psflow/train/options.h"
#include "psflow/train/ps_task.h"
#include "train/cluster_setup.h"

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

// Parses `args` ("--flag=value" strings, as on a command line) into `options` with the CLI's own
// flag definitions; unknown arguments go to `unparsed` when given, else are an error naming `source`.
void ParseLayer(const std::vector<std::string>& args, const std::string& source, train::TrainOptions* options,
                std::vector<std::string>* unparsed) {
  if (args.empty()) return;
  CLI::App app{"psflow flags"};
  app.set_help_flag();  // --help belongs to the script
  app.allow_extras(true);
  app.allow_config_extras(false);
  cli::AddTrainFlags(&app, options);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what())));
  }
  std::vector<std::string> extras = app.remaining();
  if (extras.empty()) return;
  if (unparsed == nullptr) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(
        source, ": '", extras.front(), "' is not a psflow train flag (see psflow train --help)")));
  }
  unparsed->insert(unparsed->end(), extras.begin(), extras.end());
}

std::string FlagValue(const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "true" : "false";
  return py::str(value);
}

Flags ParseFlags(const std::optional<std::vector<std::string>>& argv, const std::optional<py::dict>& defaults) {
  Flags flags;
  // 1. the script's own defaults for psflow flags;
  if (defaults.has_value()) {
    std::vector<std::string> args;
    for (const auto& [key, value] : *defaults) {
      args.push_back(absl::StrCat("--", std::string(py::str(key)), "=", FlagValue(value)));
    }
    ParseLayer(args, "parse_flags defaults", &flags.options, nullptr);
  }
  // 2. the flags `psflow local` was given before `--` (a JSON array of strings);
  if (const std::string env = EnvOr("PSFLOW_FLAGS"); !env.empty()) {
    std::vector<std::string> args;
    try {
      args = nlohmann::json::parse(env).get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("PSFLOW_FLAGS must be a JSON array of strings such as [\"--train_steps=100\"]: ", e.what())));
    }
    ParseLayer(args, "PSFLOW_FLAGS", &flags.options, nullptr);
  }
  // 3. the command line, whose unknown flags belong to the script.
  std::vector<std::string> args;
  if (argv.has_value()) {
    args = *argv;
  } else {
    py::list sys_argv = py::module_::import("sys").attr("argv");
    for (size_t i = 1; i < sys_argv.size(); ++i) args.push_back(py::str(sys_argv[i]));
  }
  ParseLayer(args, "flags", &flags.options, &flags.unparsed);
  ThrowIfError(train::ResolveTrainOptions(&flags.options));
  // TF_CONFIG (Kubeflow) or the Slurm step (srun) gives the role when the flags do not.
  train::TrainOptions& o = flags.options;
  const bool environment = !EnvOr("TF_CONFIG").empty() || dist::SlurmStep::FromEnvironment().has_value();
  if ((environment || !o.slurm_jobs.empty()) && o.ps_hosts.empty() && o.worker_hosts.empty()) {
    auto resolved = ValueOrThrow(train::ResolveTaskCluster(o));
    if (!resolved.first.empty()) {
      o.job_name = resolved.second.job;
      o.task_index = resolved.second.index;
    }
  }
  return flags;
}

// --- Server ------------------------------------------------------------------------------------

void JoinServer(const train::TrainOptions& options) {
  train::PsTaskControl control;
  const std::string no_tf_config;  // the ClusterSpec given replaces TF_CONFIG
  control.tf_config = &no_tf_config;
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
            return ValueOrThrow(train::ResolveTaskCluster(flags.options)).first;
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
  py::class_<Flags> flags(m, "Flags", "Every psflow train flag as an attribute; .unparsed: the script's own flags.");
  flags.def(py::init<>())
      .def_readwrite("unparsed", &Flags::unparsed)
      .def("__repr__", [](const Flags& f) {
        // Flags whose default comes from the model are unset (None) until resolved.
        auto text = [](const std::optional<auto>& v) { return v.has_value() ? absl::StrCat(*v) : std::string("None"); };
        return absl::StrCat("Flags(job_name='", f.options.job_name, "', task_index=", f.options.task_index,
                            ", train_steps=", text(f.options.train_steps), ", batch_size=", text(f.options.batch_size),
                            ", ...)");
      });
  // One attribute per TrainOptions field (psflow/train/options.h).
  static std::vector<std::string> names;
#define PSFLOW_FLAG(name)                                                                    \
  flags.def_property(#name, [](const Flags& f) { return f.options.name; },                  \
                     [](Flags& f, decltype(train::TrainOptions::name) v) { f.options.name = v; }); \
  names.push_back(#name)
  PSFLOW_FLAG(job_name); PSFLOW_FLAG(task_index); PSFLOW_FLAG(ps_hosts); PSFLOW_FLAG(worker_hosts);
  PSFLOW_FLAG(slurm_jobs); PSFLOW_FLAG(slurm_port_base);
  PSFLOW_FLAG(model); PSFLOW_FLAG(hidden_units); PSFLOW_FLAG(data_dir); PSFLOW_FLAG(train_steps);
  PSFLOW_FLAG(batch_size); PSFLOW_FLAG(optimizer); PSFLOW_FLAG(learning_rate); PSFLOW_FLAG(lr_decay_steps);
  PSFLOW_FLAG(lr_decay_rate); PSFLOW_FLAG(lr_staircase); PSFLOW_FLAG(sync_replicas);
  PSFLOW_FLAG(replicas_to_aggregate); PSFLOW_FLAG(total_num_replicas); PSFLOW_FLAG(sync_timeout_secs);
  PSFLOW_FLAG(partitioner); PSFLOW_FLAG(placement); PSFLOW_FLAG(log_device_placement); PSFLOW_FLAG(local_replicas);
  PSFLOW_FLAG(checkpoint_dir); PSFLOW_FLAG(save_checkpoint_steps); PSFLOW_FLAG(save_checkpoint_secs);
  PSFLOW_FLAG(logdir); PSFLOW_FLAG(save_summaries_steps); PSFLOW_FLAG(metrics_json); PSFLOW_FLAG(metrics_port);
  PSFLOW_FLAG(seed); PSFLOW_FLAG(intra_op_threads); PSFLOW_FLAG(log_every); PSFLOW_FLAG(init_timeout_secs);
  PSFLOW_FLAG(rpc_timeout_secs); PSFLOW_FLAG(ps_timeout_secs); PSFLOW_FLAG(worker_timeout_secs);
  PSFLOW_FLAG(max_message_mb); PSFLOW_FLAG(transport); PSFLOW_FLAG(cluster_secret_file); PSFLOW_FLAG(tls_cert);
  PSFLOW_FLAG(tls_key); PSFLOW_FLAG(tls_ca); PSFLOW_FLAG(insecure);
#undef PSFLOW_FLAG
  flags.def(
      "as_dict",
      [](const py::object& self) {
        py::dict d;
        for (const std::string& name : names) d[py::str(name)] = self.attr(name.c_str());
        return d;
      },
      "Every psflow train flag and its value.");
  flags.def(
      "as_argv",
      [](const py::object& self) {
        // The flags as `psflow train` arguments (for starting C++ tasks with the same flags).
        std::vector<std::string> argv;
        for (const std::string& name : names) {
          py::object v = self.attr(name.c_str());
          if (v.is_none() || (py::isinstance<py::str>(v) && v.cast<std::string>().empty())) continue;
          argv.push_back(absl::StrCat("--", name, "=", FlagValue(v)));
        }
        return argv;
      },
      "The flags as psflow train command-line arguments (--name=value).");

  m.def("parse_flags", &ParseFlags, py::arg("argv") = py::none(), py::arg("defaults") = py::none(),
        R"doc(Every psflow train flag, parsed by psflow train's own flag code.

Precedence, lowest first: psflow's defaults (the --model's), `defaults` (the script's own dict,
e.g. {"batch_size": 100}), $PSFLOW_FLAGS (JSON array set by `psflow local`), then `argv`
(default sys.argv[1:]). $TF_CONFIG, or else the Slurm step (srun; --slurm_jobs), gives
job_name/task_index when --ps_hosts/--worker_hosts are absent. Flags psflow does not know are returned in .unparsed for the script's own parser. Invalid
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
