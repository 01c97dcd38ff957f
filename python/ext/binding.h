// Shared helpers of the psflow Python extension (python/ext/*.cc): absl::Status -> Python
// exception (the psflow.Error family, one class per status code, carrying the status's one-line
// message), and the registration functions of each part of the module.
#ifndef PSFLOW_PYTHON_EXT_BINDING_H_
#define PSFLOW_PYTHON_EXT_BINDING_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
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
// A call's ids, one span per table: `ids` a list of one 1-D int64 array (or None) per table, or
// one C-contiguous int64 array of one row per table (psflow.torch hands a batch's columns over
// so: one array, not one per table). Arrays are read in place (the caller keeps `ids` alive); one
// of another layout is converted once and kept in `keep`. InvalidArgument naming what is wrong.
std::vector<absl::Span<const int64_t>> TableSpans(const char* what, int num_tables, const pybind11::object& ids,
                                                  std::vector<pybind11::object>* keep);
// The groups of tables a session's binding made (TablesGroup), kept beside the session: how many,
// and whether each table's rows are a group's (so a lookup need not work it out again).
struct TableGroups {
  int count = 0;
  std::vector<bool> grouped;  // by table index; tables past its end are in no group
  bool Grouped(int t) const { return static_cast<size_t>(t) < grouped.size() && grouped[static_cast<size_t>(t)]; }
};
// Lookup with the tables' ids (TableSpans; None: LookupPrefetched, the last prefetch's); returns one (rows float32 [U,
// dim], index int64 [batch]) per table (None for a grouped table), then one (rows float32 [U_first + ..., dim], index
// int64 [batch, count] or None) per group of tables (TablesGroup; the index: example i's row of each table of the group
// in those rows, None when its tables were given different numbers of ids), the rows moved out of the session without a
// copy.
pybind11::list TablesLookup(train::WorkerSession& session, const pybind11::object& ids, const TableGroups& groups);
// out = (in % m).T for in [rows, cols] int64 and m >= 1 (Python's remainder, in [0, m)), out [cols, rows]:
// a DLRM's [batch, fields] ids as one row of ids per table (by multiplication, not division).
void RemainderTransposed(const int64_t* in, int64_t rows, int64_t cols, int64_t m, int64_t* out);
// WorkerSession::GroupTables(first, count): a table collection's rows in one buffer; the group's index.
// Recorded in `groups`.
int TablesGroup(train::WorkerSession& session, int first, int count, TableGroups* groups);
// Python objects lent to the C++ session, whose last owner may go on any thread (the tables'
// gradients, which a push Step leaves in flight reads after step() returned): Lend's owner, once
// the session lets go of it, hands the object back here, and the thread holding the GIL drops it
// at the next Release. Thread-safe.
class LentObjects : public std::enable_shared_from_this<LentObjects> {
 public:
  // An owner keeping `object` alive (GIL held).
  std::shared_ptr<const void> Lend(pybind11::object object);
  // Drops the objects handed back (GIL held).
  void Release();

 private:
  absl::Mutex mu_;
  std::vector<PyObject*> returned_ ABSL_GUARDED_BY(mu_);
};
// The unique rows' gradients [U, dim] of the tables the step used, for the next Step: `grads` a
// list of (table index, float32 array [U, dim]) or, psflow.torch's own, (table index, owner,
// address, count): `count` float32 values at `address` (an int), which `owner` (a C-contiguous
// float32 tensor) holds. `dims`: the tables' dims. Lent, not copied (a C-contiguous float32 array
// is read in place, anything else converted once), all checked first.
// `groups`: a list of (group index, owner, address, count): a group's gradients [U_first + ...,
// dim] (count values) in one tensor, split into its tables' rows in place.
void TablesSetGrads(train::WorkerSession& session, const std::vector<int64_t>& dims, const pybind11::list& grads,
                    const pybind11::list& groups, const TableGroups& table_groups, LentObjects& lent);

}  // namespace psflow::python

#endif  // PSFLOW_PYTHON_EXT_BINDING_H_
