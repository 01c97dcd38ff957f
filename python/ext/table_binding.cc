// The worker session's embedding tables from Python (include/psflow/train/session.h: Lookup,
// table_batch, Prefetch), used by psflow.torch.Embedding / EmbeddingBag through psflow.WorkerSession.
// Thin: a table's declaration is turned into a dist::TableSpec (the plan refuses a bad one), ids
// cross as int64 numpy arrays read in place, a Lookup's rows [U, dim] and inverse index [batch] are
// moved out of the session's TableBatch into numpy arrays without a copy (the session refills its
// buffers next Lookup), the unique rows' gradients are copied once into the session's grads.
// Dedup, routing, pulls, the update rules and the prefetch all stay in the C++ session.
// Thread safety: none of its own; callers hold the session's busy guard (session_binding.cc).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "binding.h"
#include "psflow/train/session.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

using Ids = py::array_t<int64_t, py::array::c_style>;

template <typename T>
T Get(const py::dict& d, const char* key, T fallback) {
  if (!d.contains(key) || d[key].is_none()) return fallback;
  return d[key].cast<T>();
}

// One span per table over int64 numpy arrays (None: no ids). The arrays are kept in `keep`.
std::vector<absl::Span<const int64_t>> Spans(const char* what, int num_tables, const py::list& ids,
                                             std::vector<Ids>* keep) {
  if (static_cast<int>(ids.size()) != num_tables) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat(what, ": ", ids.size(), " id arrays for ", num_tables, " tables; give one per table")));
  }
  std::vector<absl::Span<const int64_t>> spans;
  for (int t = 0; t < num_tables; ++t) {
    if (ids[t].is_none()) {
      spans.emplace_back();
      continue;
    }
    py::array a = ids[t].cast<py::array>();
    if (!a.dtype().is(py::dtype::of<int64_t>()) || a.ndim() != 1) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          what, ": table ", t, "'s ids are a ", py::str(a.dtype()).cast<std::string>(), " array of ", a.ndim(),
          " dimensions; pass a 1-D int64 array")));
    }
    keep->push_back(Ids::ensure(a));
    spans.emplace_back(keep->back().data(), keep->back().size());
  }
  return spans;
}

// A numpy array owning `value` (moved to the heap; freed with the array): no copy.
template <typename T, typename E>
py::array Own(T value, std::vector<py::ssize_t> shape) {
  auto* held = new T(std::move(value));
  py::capsule owner(held, [](void* p) { delete static_cast<T*>(p); });
  return py::array_t<E>(shape, held->data(), owner);
}

}  // namespace

dist::TableSpec TableSpecFromPython(const py::dict& d) {
  dist::TableSpec spec;
  spec.name = Get<std::string>(d, "name", "");
  spec.dim = Get<int64_t>(d, "dim", 0);
  const int64_t n = Get<int64_t>(d, "num_embeddings", -1);
  spec.dynamic = n < 0;
  if (!spec.dynamic) spec.num_embeddings = n;
  const std::string strategy = Get<std::string>(d, "partition_strategy", "div");
  if (strategy == "div") {
    spec.strategy = dist::TableStrategy::kDiv;
  } else if (strategy == "mod") {
    spec.strategy = dist::TableStrategy::kMod;
  } else {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(
        "table '", spec.name, "': partition_strategy is '", strategy, "'; use \"div\" or \"mod\"")));
  }
  spec.initializer = Get<std::string>(d, "initializer", spec.initializer);
  spec.seed = Get<uint64_t>(d, "seed", 0);
  spec.admit_after = Get<int64_t>(d, "admit_after", 0);
  spec.steps_to_live = Get<int64_t>(d, "steps_to_live", 0);
  spec.max_rows = Get<int64_t>(d, "max_rows", 0);
  spec.evict_every = Get<int64_t>(d, "evict_every", 100);
  return spec;
}

py::list TablesLookup(train::WorkerSession& session, const py::list& ids) {
  std::vector<Ids> keep;
  const auto spans = Spans("lookup", session.num_tables(), ids, &keep);
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = session.Lookup(spans);
  }
  ThrowIfError(status);
  py::list out;
  for (int t = 0; t < session.num_tables(); ++t) {
    train::TableBatch& b = session.table_batch(t);
    const py::ssize_t u = static_cast<py::ssize_t>(b.ids.size());
    const py::ssize_t dim = b.rows.shape().size() == 2 ? b.rows.shape()[1] : 0;
    py::array rows = Own<Tensor, float>(std::move(b.rows), {u, dim});
    b.rows = Tensor();
    const py::ssize_t n = static_cast<py::ssize_t>(b.index.size());
    py::array index = Own<std::vector<int64_t>, int64_t>(std::vector<int64_t>(b.index), {n});
    out.append(py::make_tuple(rows, index));
  }
  return out;
}

void TablesPrefetch(train::WorkerSession& session, const py::list& next_ids) {
  std::vector<Ids> keep;
  const auto spans = Spans("prefetch", session.num_tables(), next_ids, &keep);
  ThrowIfError(session.Prefetch(spans));
}

void TablesSetGrads(train::WorkerSession& session, int t, const py::array& grads) {
  if (t < 0 || t >= session.num_tables()) throw py::index_error("table index out of range");
  train::TableBatch& b = session.table_batch(t);
  const auto g = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(grads);
  const int64_t u = static_cast<int64_t>(b.ids.size());
  if (!g || g.ndim() != 2 || g.shape(0) != u) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(
        "table ", t, ": the gradient is not [", u, ", dim] for the batch's ", u, " unique ids")));
  }
  b.grads = Tensor::Uninitialized({u, static_cast<int64_t>(g.shape(1))});
  std::copy_n(g.data(), g.size(), b.grads.data());
}

}  // namespace psflow::python
