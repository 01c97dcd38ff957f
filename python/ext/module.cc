// psflow._psflow: the C++ extension under the `psflow` Python package
// (docs/design.md#the-worker-session-and-the-python-package). Thin: every behaviour is psflow's C++ (cluster parsing,
// flags, the ps task, the worker session, the data order, the MNIST reader); this file only translates types and
// errors. Calls that wait release the GIL. See python/psflow/__init__.py for the Python-facing API.
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "binding.h"
#include "rpc/tuning.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

// Each class is also the Python built-in exception its status means, so `except ValueError` catches
// a bad argument as it would from any Python library; the rest derive from psflow.Error alone.
struct ErrorClass {
  absl::StatusCode code;
  const char* name;
  PyObject* builtin;  // nullptr: no built-in means the same thing
};

const std::vector<ErrorClass>& ErrorClasses() {
  static const std::vector<ErrorClass> classes = {
      {absl::StatusCode::kCancelled, "CancelledError", nullptr},
      {absl::StatusCode::kUnknown, "UnknownError", PyExc_RuntimeError},
      {absl::StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {absl::StatusCode::kDeadlineExceeded, "DeadlineExceededError", PyExc_TimeoutError},
      {absl::StatusCode::kNotFound, "NotFoundError", PyExc_LookupError},
      {absl::StatusCode::kAlreadyExists, "AlreadyExistsError", nullptr},
      {absl::StatusCode::kPermissionDenied, "PermissionDeniedError", PyExc_PermissionError},
      {absl::StatusCode::kResourceExhausted, "ResourceExhaustedError", nullptr},
      {absl::StatusCode::kFailedPrecondition, "FailedPreconditionError", PyExc_RuntimeError},
      {absl::StatusCode::kAborted, "AbortedError", PyExc_RuntimeError},
      {absl::StatusCode::kOutOfRange, "OutOfRangeError", nullptr},
      {absl::StatusCode::kUnimplemented, "UnimplementedError", PyExc_NotImplementedError},
      {absl::StatusCode::kInternal, "InternalError", PyExc_RuntimeError},
      {absl::StatusCode::kUnavailable, "UnavailableError", PyExc_ConnectionError},
      {absl::StatusCode::kDataLoss, "DataLossError", PyExc_OSError},
      {absl::StatusCode::kUnauthenticated, "UnauthenticatedError", PyExc_PermissionError},
  };
  return classes;
}

// Class objects, owned by the module (kept alive by it for the process's life).
PyObject* g_error = nullptr;
PyObject* g_error_by_code[32] = {};

}  // namespace

void RegisterErrors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc("psflow.Error", "Base of every psflow error; .code is the absl status code name.",
                                      PyExc_Exception, nullptr);
  m.attr("Error") = py::handle(g_error);
  for (const ErrorClass& e : ErrorClasses()) {
    const std::string qualified = std::string("psflow.") + e.name;
    PyObject* bases = e.builtin != nullptr ? PyTuple_Pack(2, g_error, e.builtin) : PyTuple_Pack(1, g_error);
    PyObject* cls = PyErr_NewException(qualified.c_str(), bases, nullptr);
    Py_DECREF(bases);
    PyObject_SetAttrString(cls, "code", py::str(absl::StatusCodeToString(e.code)).ptr());
    g_error_by_code[static_cast<int>(e.code)] = cls;
    m.attr(e.name) = py::handle(cls);
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const int code = static_cast<int>(e.status().code());
      PyObject* cls = code >= 0 && code < 32 && g_error_by_code[code] != nullptr ? g_error_by_code[code] : g_error;
      PyErr_SetString(cls, std::string(e.status().message()).c_str());
    }
  });
}

}  // namespace psflow::python

PYBIND11_MODULE(_psflow, m) {
  using namespace psflow::python;
#ifndef PSFLOW_VERSION
#define PSFLOW_VERSION "0.1.0"
#endif
  m.attr("__version__") = PSFLOW_VERSION;
  m.doc() = "psflow's C++ core (cluster, flags, ps task, worker session); use the psflow package";
  psflow::rpc::TuneAllocatorForLargeMessages();
  // As in the psflow binary: Debian's abseil's deadlock detection costs 5x per lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  RegisterErrors(m);
  RegisterCluster(m);
  RegisterFlags(m);
  RegisterServer(m);
  RegisterData(m);
  RegisterCtrData(m);
  RegisterSession(m);
  RegisterTableFields(m);
  RegisterOptim(m);
  RegisterCheckpoint(m);
  RegisterEvaluator(m);
  RegisterCtrFiles(m);
}
