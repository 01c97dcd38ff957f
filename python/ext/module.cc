// psflow._psflow: the C++ extension under the `psflow` Python package (docs/design.md#the-worker-session-and-the-python-package). Thin: every
// behaviour is psflow's C++ (cluster parsing, flags, the ps task, the worker session, the data
// order, the MNIST reader); this file only translates types and errors. Calls that wait release the
// GIL. See python/psflow/__init__.py for the Python-facing API.
#include <pybind11/pybind11.h>

#include "absl/synchronization/mutex.h"
#include "binding.h"
#include "rpc/tuning.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

struct ErrorClass {
  absl::StatusCode code;
  const char* name;
};

constexpr ErrorClass kErrorClasses[] = {
    {absl::StatusCode::kCancelled, "CancelledError"},
    {absl::StatusCode::kUnknown, "UnknownError"},
    {absl::StatusCode::kInvalidArgument, "InvalidArgumentError"},
    {absl::StatusCode::kDeadlineExceeded, "DeadlineExceededError"},
    {absl::StatusCode::kNotFound, "NotFoundError"},
    {absl::StatusCode::kAlreadyExists, "AlreadyExistsError"},
    {absl::StatusCode::kPermissionDenied, "PermissionDeniedError"},
    {absl::StatusCode::kResourceExhausted, "ResourceExhaustedError"},
    {absl::StatusCode::kFailedPrecondition, "FailedPreconditionError"},
    {absl::StatusCode::kAborted, "AbortedError"},
    {absl::StatusCode::kOutOfRange, "OutOfRangeError"},
    {absl::StatusCode::kUnimplemented, "UnimplementedError"},
    {absl::StatusCode::kInternal, "InternalError"},
    {absl::StatusCode::kUnavailable, "UnavailableError"},
    {absl::StatusCode::kDataLoss, "DataLossError"},
    {absl::StatusCode::kUnauthenticated, "UnauthenticatedError"},
};

// Class objects, owned by the module (kept alive by it for the process's life).
PyObject* g_error = nullptr;
PyObject* g_error_by_code[32] = {};

}  // namespace

void RegisterErrors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc("psflow.Error",
                                      "Base of every psflow error; .code is the absl status code name.",
                                      PyExc_Exception, nullptr);
  m.attr("Error") = py::handle(g_error);
  for (const ErrorClass& e : kErrorClasses) {
    const std::string qualified = std::string("psflow.") + e.name;
    PyObject* cls = PyErr_NewException(qualified.c_str(), g_error, nullptr);
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
}
