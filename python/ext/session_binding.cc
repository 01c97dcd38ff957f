// psflow._Session: the C++ WorkerSession (psflow/train/session.h) over parameter memory owned
// here. Each parameter's value and dense gradient are psflow Tensors handed to Python as numpy
// views (the Python side points torch's .data and .grad at them), so the session pulls into and
// pushes from the very memory PyTorch computes with: no copy per step beyond the wire decode.
// The memory lives as long as the session or any view of it (the views hold a reference).
// Every call that waits releases the GIL.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "binding.h"
#include "psflow/train/session.h"
#include "psflow/train/summary.h"

namespace py = pybind11;

namespace psflow::python {

namespace {

struct ParamMemory {
  std::string name;
  Tensor value, grad;
  std::optional<RowSparse> sparse;
  bool dense_ready = false;
};

// Shared by the session and by every numpy view of the memory.
struct Memory {
  std::vector<std::unique_ptr<ParamMemory>> params;
};

// Refuses a second thread entering the session while a call runs (the GIL is released inside).
class BusyGuard {
 public:
  explicit BusyGuard(std::atomic<bool>& busy) : busy_(busy) {
    if (busy_.exchange(true)) {
      throw StatusError(absl::FailedPreconditionError(
          "another thread is inside a call of this worker session; drive a session from one thread"));
    }
  }
  ~BusyGuard() { busy_ = false; }

 private:
  std::atomic<bool>& busy_;
};

class PySession {
 public:
  PySession(const train::TrainOptions& options, const std::vector<std::string>& names,
            const std::vector<std::vector<int64_t>>& shapes, const std::vector<bool>& trainable,
            const std::string& model_name, const py::object& evaluate,
            const std::optional<optim::OptimizerConfig>& optimizer, const std::vector<py::dict>& table_specs,
            bool waits_for_values)
      : memory_(std::make_shared<Memory>()) {
    if (names.size() != shapes.size() || names.size() != trainable.size()) {
      throw StatusError(absl::InvalidArgumentError("_Session: names, shapes and trainable differ in length"));
    }
    std::vector<train::SessionParameter> params;
    for (size_t i = 0; i < names.size(); ++i) {
      auto p = std::make_unique<ParamMemory>();
      p->name = names[i];
      for (int64_t d : shapes[i]) {
        if (d < 0)
          throw StatusError(
              absl::InvalidArgumentError(absl::StrCat("parameter '", names[i], "' has a negative dimension")));
      }
      p->value = Tensor(Shape(shapes[i]));
      if (trainable[i]) p->grad = Tensor(Shape(shapes[i]));
      train::SessionParameter sp{p->name, &p->value, trainable[i] ? &p->grad : nullptr,
                                 trainable[i] ? &p->sparse : nullptr, &p->dense_ready};
      params.push_back(sp);
      memory_->params.push_back(std::move(p));
    }
    std::vector<dist::TableSpec> tables;
    for (const py::dict& d : table_specs) tables.push_back(TableSpecFromPython(d));
    train::WorkerSession::Options session_options;
    session_options.train = options;
    session_options.model_name = model_name;
    session_options.optimizer = optimizer;
    session_options.waits_for_values = waits_for_values;
    session_options.log = [](const std::string& line) { std::cout << line << std::endl; };
    if (!evaluate.is_none()) {
      evaluate_ = evaluate;
      session_options.evaluate = [this] { return CallEvaluate(); };
    }
    py::gil_scoped_release release;
    session_ =
        ValueOrThrow(train::WorkerSession::Create(std::move(session_options), std::move(params), std::move(tables)));
  }

  py::array_t<float> View(size_t i, bool grad) {
    ParamMemory& p = Param(i);
    Tensor& t = grad ? p.grad : p.value;
    if (grad && t.empty() && !p.value.empty()) {
      throw StatusError(absl::FailedPreconditionError(absl::StrCat("parameter '", p.name, "' has no gradient memory")));
    }
    py::capsule owner(new std::shared_ptr<Memory>(memory_),
                      [](void* m) { delete static_cast<std::shared_ptr<Memory>*>(m); });
    std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
    if (p.value.size() == 0) shape = std::vector<py::ssize_t>(p.value.shape().begin(), p.value.shape().end());
    return py::array_t<float>(shape, t.data(), owner);
  }

  void Open() {
    BusyGuard guard(busy_);
    py::gil_scoped_release release;
    ThrowIfError(session_->Open());
  }

  // `dense_ready[i]`: parameter i's dense gradient memory holds this step's gradient. `sparse`:
  // (i, rows int64 [n], values float32 [n, ...]) row-sparse gradients (coalesced by the caller).
  // Afterwards the pushed dense gradients are zeroed and the sparse ones dropped.
  void Step(double loss, double accuracy, const std::vector<bool>& dense_ready,
            const std::vector<std::tuple<size_t, py::array_t<int64_t, py::array::c_style | py::array::forcecast>,
                                         py::array_t<float, py::array::c_style | py::array::forcecast>>>& sparse) {
    BusyGuard guard(busy_);
    if (dense_ready.size() != memory_->params.size()) {
      throw StatusError(absl::InvalidArgumentError("_Session.step: dense_ready has the wrong length"));
    }
    for (size_t i = 0; i < dense_ready.size(); ++i) memory_->params[i]->dense_ready = dense_ready[i];
    for (const auto& [i, rows, values] : sparse) {
      ParamMemory& p = Param(i);
      if (p.grad.empty() && p.value.size() > 0) {
        throw StatusError(absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' is not trainable")));
      }
      const Shape& shape = p.value.shape();
      if (shape.empty() || values.ndim() < 1 || rows.ndim() != 1 || values.shape(0) != rows.shape(0) ||
          values.size() != rows.shape(0) * (p.value.size() / std::max<int64_t>(shape[0], 1))) {
        throw StatusError(absl::InvalidArgumentError(
            absl::StrCat("the row-sparse gradient of '", p.name, "' does not match its shape ", ShapeToString(shape))));
      }
      RowSparse g;
      g.rows.assign(rows.data(), rows.data() + rows.size());
      Shape values_shape = shape;
      values_shape[0] = rows.shape(0);
      g.values = Tensor::Uninitialized(values_shape);
      std::copy_n(values.data(), values.size(), g.values.data());
      p.sparse = std::move(g);
    }
    absl::Status status;
    raised_.reset();
    {
      py::gil_scoped_release release;
      status = session_->Step(loss, accuracy);
      for (auto& p : memory_->params) {
        if (p->dense_ready) p->grad.SetZero();
        p->dense_ready = false;
        p->sparse.reset();
      }
    }
    RethrowRaised();
    ThrowIfError(status);
  }

  // --overlap: parameter i's dense gradient memory holds its final gradient of this step (a
  // gradient hook, during backward): pushed in the next early part.
  void GradientReady(size_t i) {
    BusyGuard guard(busy_);
    ParamMemory& p = Param(i);
    p.dense_ready = true;
    py::gil_scoped_release release;
    ThrowIfError(session_->GradientReady(static_cast<int>(i)));
  }
  // The same for a bucket of parameters in one call (python/psflow/overlap.py's hooks): one GIL
  // release, the early part sent once the bucket's last gradient is given.
  void GradientsReady(const std::vector<int>& indices) {
    BusyGuard guard(busy_);
    for (int i : indices) Param(static_cast<size_t>(i)).dense_ready = true;
    py::gil_scoped_release release;
    for (int i : indices) ThrowIfError(session_->GradientReady(i));
  }
  // Waits for the values of these parameters (a forward pre-hook), or of all (`indices` empty).
  void WaitForValues(const std::vector<int>& indices) {
    py::gil_scoped_release release;
    if (indices.empty()) return session_->WaitForValues();
    for (int i : indices) session_->WaitForValues(i);
  }

  // Tables (table_binding.cc). Lookup also runs inside close()'s evaluate (the chief's final rows).
  py::list Lookup(const py::list& ids) {
    if (evaluating_) return TablesLookup(*session_, ids);
    BusyGuard guard(busy_);
    return TablesLookup(*session_, ids);
  }
  void Prefetch(const py::list& next_ids) {
    BusyGuard guard(busy_);
    TablesPrefetch(*session_, next_ids);
  }
  void SetTableGrads(int t, const py::array& grads) {
    BusyGuard guard(busy_);
    TablesSetGrads(*session_, t, grads);
  }

  py::object Close() {
    BusyGuard guard(busy_);
    std::function<absl::StatusOr<train::SessionEval>()> eval;
    if (evaluate_) eval = [this] { return CallEvaluate(); };
    absl::StatusOr<train::RunSummary> summary;
    raised_.reset();
    {
      py::gil_scoped_release release;
      summary = session_->Close(eval);
    }
    RethrowRaised();
    const train::RunSummary s = ValueOrThrow(std::move(summary));
    return py::module_::import("json").attr("loads")(train::SummaryToJson(s));
  }

  void LogScalars(const std::vector<std::pair<std::string, double>>& scalars) {
    BusyGuard guard(busy_);
    ThrowIfError(session_->LogScalars(scalars));
  }

  void AddClicks(const py::array_t<float, py::array::c_style | py::array::forcecast>& labels,
                 const py::array_t<float, py::array::c_style | py::array::forcecast>& probabilities) {
    BusyGuard guard(busy_);
    ThrowIfError(
        session_->AddClicks(absl::MakeConstSpan(labels.data(), static_cast<size_t>(labels.size())),
                            absl::MakeConstSpan(probabilities.data(), static_cast<size_t>(probabilities.size()))));
  }

  // `aborted`: the failure was the job being aborted elsewhere (psflow.AbortedError).
  void Abort(const std::string& reason, bool aborted) {
    py::gil_scoped_release release;
    session_->Abort(aborted ? absl::AbortedError(reason) : absl::CancelledError(reason));
  }

  train::WorkerSession& session() { return *session_; }

 private:
  // The script's evaluate (python/psflow/session.py checks what it returns and hands over a list
  // of (name, float)), called by the C++ session with the GIL released. A Python exception is kept
  // for RethrowRaised and reported to the session as Cancelled.
  absl::StatusOr<train::SessionEval> CallEvaluate() {
    py::gil_scoped_acquire acquire;
    evaluating_ = true;  // the tables' Lookup may run inside it (the chief's final rows)
    struct Done {
      bool& flag;
      ~Done() { flag = false; }
    } done{evaluating_};
    try {
      // (scalars, ctr or None): psflow/session.py's checked evaluate.
      py::tuple result = evaluate_();
      train::SessionEval e;
      e.scalars = result[0].cast<std::vector<std::pair<std::string, double>>>();
      if (!result[1].is_none()) {  // a ctr model's test figures (the summary's `ctr` block)
        py::dict c = result[1];
        train::CtrFigures f;
        f.test_examples = c["test_examples"].cast<int64_t>();
        f.test_log_loss = c["test_log_loss"].cast<double>();
        f.test_auc = c["test_auc"].cast<double>();
        f.bayes_log_loss = c["bayes_log_loss"].cast<double>();
        f.bayes_auc = c["bayes_auc"].cast<double>();
        e.ctr = f;
      }
      return e;
    } catch (py::error_already_set& e) {
      raised_ = std::make_shared<py::error_already_set>(std::move(e));
      return absl::CancelledError("evaluate() raised");
    } catch (const py::cast_error& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "evaluate(): not a dict of name -> number (and optionally ctr: {test_examples, test_log_loss, test_auc, "
          "bayes_log_loss, bayes_auc}): ",
          e.what()));
    }
  }
  void RethrowRaised() {
    if (raised_) {
      auto raised = std::move(raised_);
      throw *raised;
    }
  }

  ParamMemory& Param(size_t i) {
    if (i >= memory_->params.size()) throw py::index_error("parameter index out of range");
    return *memory_->params[i];
  }

  std::shared_ptr<Memory> memory_;
  std::unique_ptr<train::WorkerSession> session_;
  std::atomic<bool> busy_{false};
  py::object evaluate_;                            // None or the checked evaluate
  std::shared_ptr<py::error_already_set> raised_;  // what evaluate raised inside the last call
  bool evaluating_ = false;                        // inside close()'s evaluate (the GIL holder's thread)
};

}  // namespace

train::WorkerSession& SessionOf(const py::object& session) { return session.cast<PySession&>().session(); }

void RegisterSession(py::module_& m) {
  py::class_<PySession>(m, "_Session", "The C++ worker session over memory it owns (use psflow.WorkerSession).")
      .def(py::init([](const Flags& flags, const std::vector<std::string>& names,
                       const std::vector<std::vector<int64_t>>& shapes, const std::vector<bool>& trainable,
                       const std::string& model_name, const py::object& evaluate,
                       const std::optional<py::dict>& optimizer, const std::vector<py::dict>& tables,
                       bool waits_for_values) {
             std::optional<optim::OptimizerConfig> config;
             if (optimizer.has_value()) config = OptimizerConfigFromDict(*optimizer);
             return std::make_unique<PySession>(flags.options, names, shapes, trainable, model_name, evaluate, config,
                                                tables, waits_for_values);
           }),
           py::arg("flags"), py::arg("names"), py::arg("shapes"), py::arg("trainable"), py::arg("model_name"),
           py::arg("evaluate") = py::none(), py::arg("optimizer") = py::none(),
           py::arg("tables") = std::vector<py::dict>(), py::arg("waits_for_values") = false)
      .def("gradient_ready", &PySession::GradientReady, py::arg("index"))
      .def("gradients_ready", &PySession::GradientsReady, py::arg("indices"))
      .def("wait_for_values", &PySession::WaitForValues, py::arg("indices"))
      .def("lookup", &PySession::Lookup, py::arg("ids"))
      .def("prefetch", &PySession::Prefetch, py::arg("next_ids"))
      .def("set_table_grads", &PySession::SetTableGrads, py::arg("table"), py::arg("grads"))
      .def_property_readonly("num_tables", [](PySession& s) { return s.session().num_tables(); })
      .def(
          "value", [](PySession& s, size_t i) { return s.View(i, false); }, py::arg("index"))
      .def(
          "grad", [](PySession& s, size_t i) { return s.View(i, true); }, py::arg("index"))
      .def("open", &PySession::Open)
      .def("should_stop", [](PySession& s) { return s.session().ShouldStop(); })
      .def("step", &PySession::Step, py::arg("loss"), py::arg("accuracy"), py::arg("dense_ready"), py::arg("sparse"))
      .def("close", &PySession::Close)
      .def("log_scalars", &PySession::LogScalars, py::arg("scalars"))
      .def("add_clicks", &PySession::AddClicks, py::arg("labels"), py::arg("probabilities"))
      .def("abort", &PySession::Abort, py::arg("reason"), py::arg("aborted") = false)
      .def_property_readonly("is_open", [](PySession& s) { return s.session().is_open(); })
      .def_property_readonly("is_chief", [](PySession& s) { return s.session().is_chief(); })
      .def_property_readonly("worker_index", [](PySession& s) { return s.session().worker_index(); })
      .def_property_readonly("num_workers", [](PySession& s) { return s.session().num_workers(); })
      .def_property_readonly("num_ps", [](PySession& s) { return s.session().num_ps(); })
      .def_property_readonly("sync", [](PySession& s) { return s.session().sync(); })
      .def_property_readonly("global_step", [](PySession& s) { return s.session().global_step(); })
      .def_property_readonly("learning_rate", [](PySession& s) { return s.session().learning_rate(); })
      .def_property_readonly("local_step", [](PySession& s) { return s.session().local_step(); })
      .def_property_readonly("data_step", [](PySession& s) { return s.session().data_step(); })
      .def_property_readonly("data_worker_index", [](PySession& s) { return s.session().data_worker_index(); })
      .def_property_readonly("data_num_workers", [](PySession& s) { return s.session().data_num_workers(); })
      .def_property_readonly("placement", [](PySession& s) { return s.session().PlacementListing(); });
}

}  // namespace psflow::python
