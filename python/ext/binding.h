// Shared helpers of the psflow Python extension (python/ext/*.cc): absl::Status -> Python
// exception (the psflow.Error family, one class per status code, carrying the status's one-line
// message), and the registration functions of each part of the module.
#ifndef PSFLOW_PYTHON_EXT_BINDING_H_
#define PSFLOW_PYTHON_EXT_BINDING_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "psflow/cli/flags.h"
#include "psflow/dist/partition.h"
#include "psflow/optim/optimizer.h"
#include "psflow/train/options.h"

namespace psflow::train {
class WorkerSession;
}  // namespace psflow::train

namespace psflow::python {

// Thrown by the binding for a failed status; translated to the psflow exception of its code.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError(value.status());
  return *std::move(value);
}

// psflow.Flags: every `psflow train` flag, and the arguments psflow did not know.
using Flags = cli::ParsedFlags;

// psflow.optim's config dict (python/psflow/optim.py) as the ps tasks' config, validated
// (psflow.InvalidArgumentError naming what is wrong). optim_config.cc.
optim::OptimizerConfig OptimizerConfigFromDict(const pybind11::dict& config);

void RegisterErrors(pybind11::module_& m);
void RegisterCluster(pybind11::module_& m);
void RegisterFlags(pybind11::module_& m);
void RegisterServer(pybind11::module_& m);
void RegisterData(pybind11::module_& m);
void RegisterCtrData(pybind11::module_& m);
void RegisterSession(pybind11::module_& m);
void RegisterOptim(pybind11::module_& m);
void RegisterCheckpoint(pybind11::module_& m);
void RegisterEvaluator(pybind11::module_& m);
void RegisterCtrFiles(pybind11::module_& m);

// The C++ worker session of a psflow._Session object (session_binding.cc); TypeError otherwise.
train::WorkerSession& SessionOf(const pybind11::object& session);

// Embedding tables of the worker session (table_binding.cc).
// A table's declaration from a dict: name, dim, num_embeddings (None: dynamic) and any of
// dist::TableFields() by name (None: the default); a bad value is refused naming table and field.
dist::TableSpec TableSpecFromPython(const pybind11::dict& spec);
// _table_fields() and _check_table_options(what, options): psflow.torch's keyword arguments.
void RegisterTableFields(pybind11::module_& m);
// Lookup with one 1-D int64 array (or None) per table; returns one (rows float32 [U, dim],
// index int64 [batch]) per table, moved out of the session without a copy.
pybind11::list TablesLookup(train::WorkerSession& session, const pybind11::list& ids);
// Prefetch's ids, checked (one 1-D int64 array or None per table, an open session) and copied,
// for a Prefetch run later without the GIL (session_binding.cc runs it behind the Python thread).
std::vector<std::vector<int64_t>> TablesIdsForPrefetch(train::WorkerSession& session, const pybind11::list& next_ids);
// Table t's unique rows' gradients [U, dim] for the next Step (copied once).
void TablesSetGrads(train::WorkerSession& session, int t, const pybind11::array& grads);

}  // namespace psflow::python

#endif  // PSFLOW_PYTHON_EXT_BINDING_H_
