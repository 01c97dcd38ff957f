// psflow._Session: the C++ WorkerSession (psflow/train/session.h) over parameter memory owned
// here. Each parameter's value and dense gradient are psflow Tensors handed to Python as numpy
// views (the Python side points torch's .data and .grad at them), so the session pulls into and
// pushes from the very memory PyTorch computes with: no copy per step beyond the wire decode.
// The memory lives as long as the session or any view of it (the views hold a reference).
// Every call that waits releases the GIL.
//
// Behind the Python thread (class Behind): the gradients the overlap hooks hand over during
// backward (gradients_ready) and the next batch's prefetch given during the forward (prefetch)
// are handed to the C++ session by a helper thread, so that their routing, encoding and dedup run
// beside PyTorch's compute instead of inside it. Every other call first waits for them, so the
// session is still driven by one thread at a time; a failure among them is raised by that call.
#include <pthread.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sched.h>

#include <atomic>
#include <deque>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

// Session calls run in order by one helper thread (see the file comment). Post and Settle are
// called by the thread holding the GIL; the calls run without it and must not touch Python.
class Behind {
 public:
  Behind() : thread_([this] { Run(); }) {}
  ~Behind() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();  // after the calls posted (Run empties the queue first)
  }
  Behind(const Behind&) = delete;
  Behind& operator=(const Behind&) = delete;

  void Post(std::function<absl::Status()> call) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(call));
    pending_.fetch_add(1, std::memory_order_relaxed);
  }
  // Whether a call posted is still queued or running.
  bool busy() const { return pending_.load(std::memory_order_acquire) > 0; }
  // Waits until every call posted has run; the first failure since the last Settle (OK if none).
  absl::Status Settle() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::atomic<int>* pending) { return pending->load(std::memory_order_relaxed) == 0; }, &pending_));
    absl::Status failure = std::move(failure_);
    failure_ = absl::OkStatus();
    return failure;
  }

 private:
  void Run() {
    // SCHED_BATCH: woken by a Post, the helper takes a free core but does not preempt the Python
    // thread that posted (whose compute it is meant to run beside); on a busy machine it runs when
    // that thread blocks (at the latest in Settle).
    sched_param param{};
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
    (void)pthread_setname_np(pthread_self(), "psflow_behind");  // bench/ctr_vs_pytorch.py reads its CPU
    for (;;) {
      std::function<absl::Status()> call;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Behind* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu_) { return b->stop_ || !b->queue_.empty(); }, this));
        if (queue_.empty()) return;  // stopped, nothing left
        call = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::Status status = call();
      absl::MutexLock lock(&mu_);
      if (!status.ok() && failure_.ok()) failure_ = std::move(status);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<absl::Status()>> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> pending_{0};  // posted and not yet run; changed under mu_
  std::thread thread_;           // last: started once the rest is built
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
    for (const dist::TableSpec& t : tables) table_dims_.push_back(t.dim);
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

  // The GIL is held: the objects lent to the session (the tables' gradients) are dropped here,
  // once the session (and its threads) went.
  ~PySession() {
    behind_.reset();
    session_.reset();
    lent_->Release();
  }
  PySession(const PySession&) = delete;
  PySession& operator=(const PySession&) = delete;

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

  // Waits for the calls running behind (GIL released meanwhile) and raises their first failure.
  void Settle() {
    if (behind_ == nullptr || !behind_->busy()) {
      read_behind_ = py::object();
      if (behind_ != nullptr) ThrowIfError(behind_->Settle());  // a failure of a call that has run
      return;
    }
    absl::Status failure;
    {
      py::gil_scoped_release release;
      failure = behind_->Settle();
    }
    read_behind_ = py::object();  // read no more
    ThrowIfError(failure);
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
    Settle();
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
    lent_->Release();  // the tables' gradients of the pushes answered
    RethrowRaised();
    ThrowIfError(status);
  }

  // --overlap: parameter i's dense gradient memory holds its final gradient of this step (a
  // gradient hook, during backward): pushed in the next early part.
  void GradientReady(size_t i) {
    BusyGuard guard(busy_);
    Settle();
    ParamMemory& p = Param(i);
    p.dense_ready = true;
    py::gil_scoped_release release;
    ThrowIfError(session_->GradientReady(static_cast<int>(i)));
  }
  // The same for a bucket of parameters (python/psflow/overlap.py's hooks), behind this thread:
  // returns at once; the early part is sent by the helper once the bucket's last gradient is given,
  // and a failure is raised by the next call (step()).
  void GradientsReady(const std::vector<int>& indices) {
    BusyGuard guard(busy_);
    for (int i : indices) Param(static_cast<size_t>(i)).dense_ready = true;
    Behind& behind = StartBehind();
    behind.Post([session = session_.get(), indices] {
      for (int i : indices) {
        if (absl::Status s = session->GradientReady(i); !s.ok()) return s;
      }
      return absl::OkStatus();
    });
  }
  // Waits for the values of these parameters (a forward pre-hook), or of all (`indices` empty).
  // Not behind the helper's calls (WorkerSession::WaitForValues may run beside them): a forward
  // does not wait for the next batch's prefetch to be handed over; their failure is the next call's.
  void WaitForValues(const std::vector<int>& indices) {
    py::gil_scoped_release release;
    if (indices.empty()) return session_->WaitForValues();
    for (int i : indices) session_->WaitForValues(i);
  }

  // Tables (table_binding.cc). Lookup also runs inside close()'s evaluate (the chief's final rows).
  py::list Lookup(const py::object& ids) {
    if (evaluating_) return TablesLookup(*session_, ids, table_groups_);
    BusyGuard guard(busy_);
    Settle();
    return TablesLookup(*session_, ids, table_groups_);
  }
  // Tables [first, first + count) as one group (a table collection): before the first lookup.
  int GroupTables(int first, int count) {
    BusyGuard guard(busy_);
    return TablesGroup(*session_, first, count, &table_groups_);
  }
  // The next batch's ids (TableSpans), checked here; the dedup runs behind this thread (the
  // forward goes on meanwhile) and the next call waits for it. A list's arrays are copied; one
  // array of a row per table (psflow.torch's own, made for the call) is read in place behind,
  // kept until the next call has waited for it.
  // `ahead` (given during the forward): in async mode the rows are pulled at once, beside the
  // compute (WorkerSession::PrefetchAhead); else they ride on the step's push.
  void Prefetch(const py::object& next_ids, bool ahead) {
    BusyGuard guard(busy_);
    Settle();
    std::vector<py::object> keep;
    std::vector<absl::Span<const int64_t>> spans = TableSpans("prefetch", session_->num_tables(), next_ids, &keep);
    if (!session_->is_open()) {
      throw StatusError(
          absl::FailedPreconditionError("Prefetch needs an open worker session (after Open(), before Close())"));
    }
    auto prefetch = [session = session_.get(), ahead](const std::vector<absl::Span<const int64_t>>& spans) {
      return ahead ? session->PrefetchAhead(spans) : session->Prefetch(spans);
    };
    if (py::isinstance<py::array>(next_ids)) {
      read_behind_ = next_ids;
      StartBehind().Post([prefetch, spans = std::move(spans)] { return prefetch(spans); });
      return;
    }
    std::vector<std::vector<int64_t>> ids;
    ids.reserve(spans.size());
    for (const absl::Span<const int64_t>& s : spans) ids.emplace_back(s.begin(), s.end());
    StartBehind().Post([prefetch, ids = std::move(ids)] {
      std::vector<absl::Span<const int64_t>> spans(ids.begin(), ids.end());
      return prefetch(spans);
    });
  }
  // Prefetch of (x % modulus).T's first `count` rows, one per table (x [batch, columns] int64:
  // a DLRM's batch of ids, read in place): the remainder is made behind this thread with the
  // prefetch, into the array returned (read it only after settle(): the next call waits for it).
  py::array PrefetchColumns(const py::array_t<int64_t, py::array::c_style>& x, int64_t modulus, int count, bool ahead) {
    BusyGuard guard(busy_);
    Settle();
    if (x.ndim() != 2 || modulus < 1 || count != session_->num_tables() || count > x.shape(1)) {
      throw StatusError(
          absl::InvalidArgumentError(absl::StrCat("prefetch_columns: give an int64 [batch, columns] array of at least ",
                                                  session_->num_tables(), " columns and a positive modulus")));
    }
    if (!session_->is_open()) {
      throw StatusError(
          absl::FailedPreconditionError("Prefetch needs an open worker session (after Open(), before Close())"));
    }
    const int64_t rows = x.shape(0), cols = x.shape(1);
    py::array_t<int64_t> out({cols, rows});
    read_behind_ = py::make_tuple(x, out);  // both read and written behind, until the next Settle
    const int64_t* in = x.data();
    int64_t* o = out.mutable_data();
    std::vector<absl::Span<const int64_t>> spans;
    for (int t = 0; t < count; ++t) spans.emplace_back(o + t * rows, static_cast<size_t>(rows));
    StartBehind().Post([session = session_.get(), in, o, rows, cols, modulus, ahead, spans = std::move(spans)] {
      RemainderTransposed(in, rows, cols, modulus, o);
      return ahead ? session->PrefetchAhead(spans) : session->Prefetch(spans);
    });
    return out;
  }
  // Waits for the calls behind this thread (their failure raised here).
  void SettleBehind() {
    BusyGuard guard(busy_);
    Settle();
  }
  // The unique rows' gradients of the tables the step used (psflow.torch's step), in one call:
  // [(table index, float32 array [U, dim])], lent to the session until its push has read them.
  void SetTablesGrads(const py::list& grads, const py::list& groups) {
    BusyGuard guard(busy_);
    Settle();
    lent_->Release();
    TablesSetGrads(*session_, table_dims_, grads, groups, table_groups_, *lent_);
  }

  py::object Close() {
    BusyGuard guard(busy_);
    Settle();
    std::function<absl::StatusOr<train::SessionEval>()> eval;
    if (evaluate_) eval = [this] { return CallEvaluate(); };
    absl::StatusOr<train::RunSummary> summary;
    raised_.reset();
    {
      py::gil_scoped_release release;
      summary = session_->Close(eval);
    }
    lent_->Release();
    RethrowRaised();
    const train::RunSummary s = ValueOrThrow(std::move(summary));
    return py::module_::import("json").attr("loads")(train::SummaryToJson(s));
  }

  void LogScalars(const std::vector<std::pair<std::string, double>>& scalars) {
    BusyGuard guard(busy_);
    Settle();
    ThrowIfError(session_->LogScalars(scalars));
  }

  void AddClicks(const py::array_t<float, py::array::c_style | py::array::forcecast>& labels,
                 const py::array_t<float, py::array::c_style | py::array::forcecast>& probabilities) {
    BusyGuard guard(busy_);
    Settle();
    ThrowIfError(
        session_->AddClicks(absl::MakeConstSpan(labels.data(), static_cast<size_t>(labels.size())),
                            absl::MakeConstSpan(probabilities.data(), static_cast<size_t>(probabilities.size()))));
  }

  // `aborted`: the failure was the job being aborted elsewhere (psflow.AbortedError).
  void Abort(const std::string& reason, bool aborted) {
    {
      py::gil_scoped_release release;
      if (behind_ != nullptr) (void)behind_->Settle();  // the job ends: their failure says no more
      session_->Abort(aborted ? absl::AbortedError(reason) : absl::CancelledError(reason));
    }
    lent_->Release();
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

  Behind& StartBehind() {
    if (behind_ == nullptr) behind_ = std::make_unique<Behind>();
    return *behind_;
  }

  ParamMemory& Param(size_t i) {
    if (i >= memory_->params.size()) throw py::index_error("parameter index out of range");
    return *memory_->params[i];
  }

  std::shared_ptr<Memory> memory_;
  std::shared_ptr<LentObjects> lent_ = std::make_shared<LentObjects>();  // before session_: outlives it
  std::vector<int64_t> table_dims_;                                      // the tables' dims, in order
  TableGroups table_groups_;                                             // GroupTables' groups
  std::unique_ptr<train::WorkerSession> session_;
  std::unique_ptr<Behind> behind_;  // after session_: stopped (its calls run) before the session goes
  py::object read_behind_;          // an array a call behind reads (Prefetch), until the next Settle
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
      .def("prefetch", &PySession::Prefetch, py::arg("next_ids"), py::arg("ahead") = false)
      .def("set_tables_grads", &PySession::SetTablesGrads, py::arg("grads"), py::arg("groups") = py::list())
      .def("group_tables", &PySession::GroupTables, py::arg("first"), py::arg("count"))
      .def("prefetch_columns", &PySession::PrefetchColumns, py::arg("x"), py::arg("modulus"), py::arg("count"),
           py::arg("ahead") = false)
      .def("settle", &PySession::SettleBehind)
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
