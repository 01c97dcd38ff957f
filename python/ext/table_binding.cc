// The worker session's embedding tables from Python (include/psflow/train/session.h: Lookup,
// table_batch, Prefetch), used by psflow.torch.Embedding / EmbeddingBag through psflow.WorkerSession.
// Thin: a table's declaration is turned into a dist::TableSpec field by field through the one
// table of fields (psflow/dist/table_spec.h; the plan refuses a bad whole), which also gives
// psflow.torch its keyword arguments and their defaults (_table_fields). Ids
// cross as int64 numpy arrays read in place, a Lookup's rows [U, dim] and inverse index [batch] are
// moved out of the session's TableBatch into numpy arrays without a copy (the session refills its
// buffers next Lookup), the unique rows' gradients are lent to the session without a copy (held
// until the push has read them: LentObjects).
// Dedup, routing, pulls, the update rules and the prefetch all stay in the C++ session.
// Thread safety: none of its own; callers hold the session's busy guard (session_binding.cc).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "binding.h"
#include "psflow/dist/table_spec.h"
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

// Whether `a` is a C-contiguous int64 array of `nd` dimensions (read in place).
bool Int64Array(py::handle a, int nd) {
  if (!py::isinstance<py::array>(a)) return false;
  const auto* p = py::detail::array_proxy(a.ptr());
  const auto* d = py::detail::array_descriptor_proxy(p->descr);
  return p->nd == nd && d->kind == 'i' && d->elsize == 8 &&
         (p->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_) != 0;
}

}  // namespace

std::vector<absl::Span<const int64_t>> TableSpans(const char* what, int num_tables, const py::object& ids,
                                                  std::vector<py::object>* keep) {
  std::vector<absl::Span<const int64_t>> spans;
  if (py::isinstance<py::array>(ids)) {  // one row per table
    const py::array a = py::reinterpret_borrow<py::array>(ids);
    if (!Int64Array(a, 2) || a.shape(0) != num_tables) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          what, ": the ids are a ", py::str(a.dtype()).cast<std::string>(), " array of shape ",
          py::str(py::tuple(py::cast(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim())))).cast<std::string>(),
          "; pass one 1-D int64 array (or None) per table, or a C-contiguous int64 array of ", num_tables, " rows")));
    }
    const auto* data = static_cast<const int64_t*>(a.data());
    const auto n = static_cast<size_t>(a.shape(1));
    for (int t = 0; t < num_tables; ++t) spans.emplace_back(data + static_cast<size_t>(t) * n, n);
    return spans;
  }
  const py::list list = ids.cast<py::list>();
  if (static_cast<int>(list.size()) != num_tables) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat(what, ": ", list.size(), " id arrays for ", num_tables, " tables; give one per table")));
  }
  spans.reserve(static_cast<size_t>(num_tables));
  for (int t = 0; t < num_tables; ++t) {
    py::handle item = list[static_cast<size_t>(t)];
    if (item.is_none()) {
      spans.emplace_back();
      continue;
    }
    if (Int64Array(item, 1)) {  // the usual case: read in place (the list holds it)
      const auto* p = py::detail::array_proxy(item.ptr());
      spans.emplace_back(reinterpret_cast<const int64_t*>(p->data), static_cast<size_t>(p->dimensions[0]));
      continue;
    }
    py::array a = item.cast<py::array>();
    if (!a.dtype().is(py::dtype::of<int64_t>()) || a.ndim() != 1) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(what, ": table ", t, "'s ids are a ",
                                                                py::str(a.dtype()).cast<std::string>(), " array of ",
                                                                a.ndim(), " dimensions; pass a 1-D int64 array")));
    }
    Ids c = Ids::ensure(a);
    spans.emplace_back(c.data(), c.size());
    keep->push_back(std::move(c));
  }
  return spans;
}

namespace {

// A numpy array owning `value` (moved to the heap; freed with the array): no copy.
template <typename T, typename E>
py::array Own(T value, std::vector<py::ssize_t> shape) {
  auto* held = new T(std::move(value));
  py::capsule owner(held, [](void* p) { delete static_cast<T*>(p); });
  return py::array_t<E>(shape, held->data(), owner);
}

// A Python value as a table field's text form (dist::SetTableField reads it): str as is, int as
// its digits; anything else (bool, float, ...) as its repr, which SetTableField refuses by name.
std::string FieldText(const py::handle& value) {
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::int_>(value) && !py::isinstance<py::bool_>(value)) return py::str(value).cast<std::string>();
  return py::repr(value).cast<std::string>();
}

// Sets every field of TableFields() that `options` gives (None: the default); a key that is not
// one is refused by SetTableField, naming the known ones.
void SetFields(const py::dict& options, dist::TableSpec* spec) {
  for (const auto& [key, value] : options) {
    if (value.is_none()) continue;
    ThrowIfError(dist::SetTableField(spec, key.cast<std::string>(), FieldText(value)));
  }
}

}  // namespace

dist::TableSpec TableSpecFromPython(const py::dict& d) {
  dist::TableSpec spec;
  py::dict options;
  for (const auto& [key, value] : d) {
    const std::string k = key.cast<std::string>();
    if (k == "name") {
      spec.name = value.is_none() ? "" : value.cast<std::string>();
    } else if (k == "dim") {
      spec.dim = value.cast<int64_t>();
    } else if (k == "num_embeddings") {
      spec.kind = value.is_none() ? dist::TableKind::kDynamic : dist::TableKind::kFixed;
      if (!value.is_none()) spec.num_embeddings = value.cast<int64_t>();
    } else {
      options[key] = value;
    }
  }
  SetFields(options, &spec);
  return spec;
}

// (x % m).T for x [rows, cols] and m > 0 as Python and torch take it (each result in [0, m)), by
// multiplication with a 64-bit reciprocal (Granlund and Montgomery, 1994: for n < 2^63 and l = ceil(log2 m), the
// quotient is floor(n * ceil(2^(63+l) / m) / 2^(63+l)), exactly) instead of a 64-bit division per id.
void RemainderTransposed(const int64_t* in, int64_t rows, int64_t cols, int64_t m, int64_t* out) {
  const auto um = static_cast<uint64_t>(m);
  if (um == 1) {
    std::fill_n(out, rows * cols, 0);
    return;
  }
  int l = 1;  // ceil(log2 m), m >= 2
  while ((uint64_t{1} << l) < um) ++l;
  const auto magic = static_cast<uint64_t>(((__uint128_t{1} << (63 + l)) + um - 1) / um);  // < 2^64: 2^l < 2m
  const int shift = l - 1;  // (n * magic) >> (63 + l) is the high word shifted by l - 1
  // In blocks of 8 rows: each block's rows are read once into the cache, and each output row gets
  // a whole cache line of it at a time (a column at a time would read the input one cache line
  // per id; a row at a time would write 8 KiB-apart lines, all in one cache set).
  constexpr int64_t kBlock = 8;
  for (int64_t i0 = 0; i0 < rows; i0 += kBlock) {
    const int64_t i1 = std::min(rows, i0 + kBlock);
    for (int64_t j = 0; j < cols; ++j) {
      int64_t* o = out + j * rows;
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t x = in[i * cols + j];
        // n < 2^63: x itself, or -x - 1 for x < 0 (whose remainder is m - 1 - (n % m)).
        const uint64_t n = x >= 0 ? static_cast<uint64_t>(x) : static_cast<uint64_t>(-(x + 1));
        const auto q = static_cast<uint64_t>((static_cast<__uint128_t>(n) * magic) >> 64) >> shift;
        const uint64_t r = n - q * um;
        o[i] = static_cast<int64_t>(x >= 0 ? r : um - 1 - r);
      }
    }
  }
}

namespace {

// Whether a [rows, cols] == b.T for b [cols, rows] (int64, C-contiguous), in blocks of 8 rows as
// RemainderTransposed reads them.
bool EqualTransposed(const int64_t* a, const int64_t* b, int64_t rows, int64_t cols) {
  constexpr int64_t kBlock = 8;
  for (int64_t i0 = 0; i0 < rows; i0 += kBlock) {
    const int64_t i1 = std::min(rows, i0 + kBlock);
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t* column = b + j * rows;
      bool same = true;
      for (int64_t i = i0; i < i1; ++i) same &= a[i * cols + j] == column[i];
      if (!same) return false;
    }
  }
  return true;
}

}  // namespace

void RegisterTableFields(py::module_& m) {
  m.def(
      "_equal_transposed",
      [](const py::array& a, const py::array& b) {
        if (!Int64Array(a, 2) || !Int64Array(b, 2)) return false;
        const py::ssize_t rows = a.shape(0), cols = a.shape(1);
        if (b.shape(0) != cols || b.shape(1) != rows) return false;
        return EqualTransposed(static_cast<const int64_t*>(a.data()), static_cast<const int64_t*>(b.data()), rows,
                               cols);
      },
      py::arg("a"), py::arg("b"),
      "Whether a == b.T, for C-contiguous int64 arrays a [rows, cols] and b [cols, rows] (False for any other "
      "dtype, layout or shape): a table collection's ids [batch, tables] against the ids announced per table.");
  m.def(
      "_remainder_transposed",
      [](const Ids& x, int64_t modulus) {
        if (x.ndim() != 2) throw py::value_error("_remainder_transposed: x must be 2-D");
        if (modulus < 1) throw py::value_error("_remainder_transposed: the modulus must be positive");
        const py::ssize_t rows = x.shape(0), cols = x.shape(1);
        py::array_t<int64_t> out({cols, rows});
        const int64_t* in = x.data();
        int64_t* o = out.mutable_data();
        {
          py::gil_scoped_release release;
          RemainderTransposed(in, rows, cols, modulus, o);
        }
        return out;
      },
      py::arg("x"), py::arg("modulus"),
      "(x % modulus).T as a C-contiguous copy, for an int64 [rows, cols] array and modulus >= 1 (Python's "
      "remainder, in [0, modulus)): a DLRM's [batch, fields] ids become one row of ids per table.");
  m.def(
      "_table_fields",
      [] {
        py::list out;
        for (const dist::TableField& f : dist::TableFields()) {
          const std::string text = dist::TableFieldDefault(f.name);
          py::object value = f.type == "int" ? py::object(py::int_(py::str(text)))
                             : text.empty()  ? py::object(py::none())
                                             : py::object(py::str(text));
          out.append(py::make_tuple(std::string(f.name), value, std::string(f.help)));
        }
        return out;
      },
      "[(name, default, help)] of a table's keyword arguments (psflow/dist/table_spec.h's TableFields), "
      "in signature order; psflow.torch's Embedding and EmbeddingBag take them.");
  m.def(
      "_check_table_options",
      [](const std::string& what, const py::dict& options) {
        dist::TableSpec spec;
        try {
          SetFields(options, &spec);
        } catch (const StatusError& e) {
          throw StatusError(absl::Status(e.status().code(), absl::StrCat(what, ": ", e.status().message())));
        }
      },
      py::arg("what"), py::arg("options"),
      "Refuses (psflow.InvalidArgumentError, prefixed by `what`) a table keyword argument that is unknown or "
      "whose value its field cannot read.");
}

int TablesGroup(train::WorkerSession& session, int first, int count, TableGroups* groups) {
  const int g = ValueOrThrow(session.GroupTables(first, count));
  groups->count = g + 1;
  if (groups->grouped.size() < static_cast<size_t>(first + count)) groups->grouped.resize(first + count);
  std::fill_n(groups->grouped.begin() + first, count, true);
  return g;
}

py::list TablesLookup(train::WorkerSession& session, const py::object& ids, const TableGroups& groups) {
  absl::Status status;
  if (ids.is_none()) {  // the ids of the last prefetch, as the session holds them
    py::gil_scoped_release release;
    status = session.LookupPrefetched();
  } else {
    std::vector<py::object> keep;
    const auto spans = TableSpans("lookup", session.num_tables(), ids, &keep);
    py::gil_scoped_release release;
    status = session.Lookup(spans);
  }
  ThrowIfError(status);
  py::list out;
  for (int t = 0; t < session.num_tables(); ++t) {
    train::TableBatch& b = session.table_batch(t);
    if (groups.Grouped(t)) {  // its rows: the group's (below)
      out.append(py::none());
      continue;
    }
    const py::ssize_t u = static_cast<py::ssize_t>(b.ids.size());
    const py::ssize_t dim = b.rows.shape().size() == 2 ? b.rows.shape()[1] : 0;
    py::array rows = Own<Tensor, float>(std::move(b.rows), {u, dim});
    b.rows = Tensor();
    const py::ssize_t n = static_cast<py::ssize_t>(b.index.size());
    py::array index = Own<std::vector<int64_t>, int64_t>(std::move(b.index), {n});  // the binding is the caller
    b.index.clear();
    out.append(py::make_tuple(rows, index));
  }
  for (int g = 0; g < groups.count; ++g) {
    train::TableGroupBatch& gb = session.table_group(g);
    const py::ssize_t u = gb.offsets.back();
    const py::ssize_t dim = gb.rows.shape().size() == 2 ? gb.rows.shape()[1] : 0;
    py::array rows = Own<Tensor, float>(std::move(gb.rows), {u, dim});
    gb.rows = Tensor();
    py::object index = py::none();
    if (gb.has_index) {
      const auto n = static_cast<py::ssize_t>(gb.index.size() / static_cast<size_t>(gb.count));
      index = Own<std::vector<int64_t>, int64_t>(std::move(gb.index), {n, gb.count});
      gb.index.clear();
    }
    out.append(py::make_tuple(rows, index));
  }
  return out;
}

std::shared_ptr<const void> LentObjects::Lend(py::object object) {
  PyObject* held = object.release().ptr();
  return std::shared_ptr<const void>(held, [self = shared_from_this()](const void* p) {
    absl::MutexLock lock(&self->mu_);
    self->returned_.push_back(static_cast<PyObject*>(const_cast<void*>(p)));
  });
}

void LentObjects::Release() {
  std::vector<PyObject*> returned;
  {
    absl::MutexLock lock(&mu_);
    if (returned_.empty()) return;
    returned.swap(returned_);
  }
  for (PyObject* p : returned) Py_DECREF(p);
}

namespace {

// A gradient lent in place as item[1..3] = (owner, address, count): `count` float32 values at
// `address`, which `owner` (psflow.torch's C-contiguous float32 tensor) holds; the caller holds
// the owner. Refused unless it is [u, dim] for tables [first, last].
absl::Span<const float> LentValues(const py::tuple& item, int first, int last, int64_t u, int64_t dim) {
  const auto count = item[3].cast<int64_t>();
  if (count != u * dim) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(
        first == last ? absl::StrCat("table ", first) : absl::StrCat("tables ", first, "..", last),
        ": the gradient holds ", count, " values, not [", u, ", ", dim, "] for the batch's ", u, " unique ids")));
  }
  return absl::MakeConstSpan(reinterpret_cast<const float*>(item[2].cast<uintptr_t>()), static_cast<size_t>(count));
}

}  // namespace

void TablesSetGrads(train::WorkerSession& session, const std::vector<int64_t>& dims, const py::list& grads,
                    const py::list& groups, const TableGroups& table_groups, LentObjects& lent) {
  using Floats = py::array_t<float, py::array::c_style | py::array::forcecast>;
  std::vector<std::pair<int, absl::Span<const float>>> checked;
  checked.reserve(grads.size());
  py::tuple held(grads.size() + groups.size());
  // A group's gradients [U_first + ..., dim] (its one leaf's): split into its tables' rows, in place.
  for (size_t k = 0; k < groups.size(); ++k) {
    const auto item = groups[k].cast<py::tuple>();
    if (item.size() != 4)
      throw py::value_error("set_tables_grads: give groups as (group index, owner, address, count)");
    const int g = item[0].cast<int>();
    if (g < 0 || g >= table_groups.count) throw py::index_error("table group index out of range");
    const train::TableGroupBatch& gb = session.table_group(g);
    const int64_t dim = dims[static_cast<size_t>(gb.first)];
    const absl::Span<const float> values = LentValues(item, gb.first, gb.first + gb.count - 1, gb.offsets.back(), dim);
    held[grads.size() + k] = item[1];
    for (int j = 0; j < gb.count; ++j) {
      checked.emplace_back(gb.first + j,
                           values.subspan(static_cast<size_t>(gb.offsets[j] * dim),
                                          static_cast<size_t>((gb.offsets[j + 1] - gb.offsets[j]) * dim)));
    }
  }
  for (size_t k = 0; k < grads.size(); ++k) {
    const auto item = grads[k].cast<py::tuple>();
    if (item.size() != 2 && item.size() != 4) {
      throw py::value_error("set_tables_grads: give (table index, array) or (table index, owner, address, count)");
    }
    const int t = item[0].cast<int>();
    if (t < 0 || t >= session.num_tables()) throw py::index_error("table index out of range");
    const int64_t u = static_cast<int64_t>(session.table_batch(t).ids.size());
    const int64_t dim = dims[static_cast<size_t>(t)];
    if (item.size() == 4) {  // psflow.torch's: a float32 C-contiguous tensor, its address and element count
      checked.emplace_back(t, LentValues(item, t, t, u, dim));
      held[k] = item[1];
      continue;
    }
    const auto g = Floats::ensure(item[1]);  // the array itself when float32 and C-contiguous
    if (!g || g.ndim() != 2 || g.shape(0) != u || g.shape(1) != dim) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("table ", t, ": the gradient is not [", u, ", ", dim, "] for the batch's ", u, " unique ids")));
    }
    held[k] = g;
    checked.emplace_back(t, absl::MakeConstSpan(g.data(), static_cast<size_t>(g.size())));
  }
  const std::shared_ptr<const void> owner = lent.Lend(std::move(held));
  for (const auto& [t, values] : checked) {
    train::TableBatch& b = session.table_batch(t);
    b.grads = Tensor();
    b.grads_values = values;
    b.grads_owner = owner;
  }
}

}  // namespace psflow::python
