// psflow._read_checkpoint: a checkpoint of psflow's (docs/design.md's checkpoints: one safetensors
// file per save, every variable whole under its own name) read by psflow's C++ reader
// (psflow/ckpt/checkpoint.h: structure and checksum checked) and handed to Python as numpy arrays
// that own the reader's memory (no copy): float32 tensors, and int64 ones (an embedding table's
// ids, last steps and counts, docs/tables.md#semantics). psflow.read_checkpoint / load_checkpoint
// (python/psflow/checkpoint.py) are built on it; an incremental checkpoint is read with its chain
// (psflow/ckpt/checkpoint_chain.h: its tables merged). psflow._read_table_rows: some rows of one table,
// by id, streamed from the file by train/table_checkpoint.h's ReadTableRows (the table is never
// held in memory), for psflow.read_table_rows. Stateless; the GIL is released while files are read.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "binding.h"
#include "ps/server/table/row_init.h"
#include "ps/server/table/table_config.h"
#include "psflow/ckpt/checkpoint.h"
#include "train/table_checkpoint.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

py::array_t<float> ToArray(Tensor t) {
  auto* owned = new Tensor(std::move(t));
  py::capsule owner(owned, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(owned->shape().begin(), owned->shape().end());
  return py::array_t<float>(shape, owned->data(), owner);
}

py::array_t<int64_t> ToArray(std::vector<int64_t> v) {
  auto* owned = new std::vector<int64_t>(std::move(v));
  py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<int64_t>*>(p); });
  return py::array_t<int64_t>(std::vector<py::ssize_t>{static_cast<py::ssize_t>(owned->size())}, owned->data(), owner);
}

bool IsDirectory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

absl::Status NoCheckpointIn(const std::string& dir, const std::vector<std::string>& skipped) {
  std::string why = skipped.empty() ? "no model.ckpt-STEP.safetensors file in it" : skipped.front();
  return absl::NotFoundError(absl::StrCat("no readable checkpoint in ", dir, ": ", why,
                                          "; give a --checkpoint_dir a job saved into, or a file"));
}

absl::Status NoSuchFile(const std::string& path) {
  return absl::NotFoundError(absl::StrCat(
      "checkpoint ", path, " does not exist; give a checkpoint directory or a model.ckpt-STEP.safetensors file"));
}

// A directory: its newest checkpoint that passes its checksum (as a restore takes it); a file: that
// file, checked.
ckpt::Checkpoint ReadPath(const std::string& path) {
  if (IsDirectory(path)) {
    std::vector<std::string> skipped;
    auto latest = ValueOrThrow(ckpt::LoadLatestCheckpoint(path, &skipped));
    if (!latest.has_value()) throw StatusError(NoCheckpointIn(path, skipped));
    return *std::move(latest);
  }
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw StatusError(NoSuchFile(path));
  return ValueOrThrow(ckpt::ReadCheckpoint(path));
}

// The same, opened for streamed reading (header and checksum pass only).
ckpt::OpenedCheckpoint OpenPath(const std::string& path) {
  if (IsDirectory(path)) {
    std::vector<std::string> skipped;
    auto latest = ValueOrThrow(ckpt::OpenLatestCheckpoint(path, &skipped));
    if (!latest.has_value()) throw StatusError(NoCheckpointIn(path, skipped));
    return *std::move(latest);
  }
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw StatusError(NoSuchFile(path));
  return ValueOrThrow(ckpt::OpenCheckpointFile(path));
}

// Rows of `ids` (any order, repeats allowed) of table `name`, its kind and dim taken from the file:
// [ids, dim] float32 and, per id, whether the file holds its row. A dynamic id the file lacks (never
// admitted, or evicted) gets the initial value `initializer` and `seed` give it, as a ps's lookup
// would (zeros when no initializer is given).
struct TableRows {
  std::string path;
  int64_t global_step = 0;
  Tensor rows;
  std::vector<uint8_t> found;
};

TableRows ReadRows(const std::string& path, const std::string& name, std::vector<int64_t> ids,
                   const std::string& initializer, uint64_t seed) {
  std::optional<ps::table::RowInitializer> initial;
  if (!initializer.empty()) {
    auto spec = ps::table::ParseInitializer(initializer);
    if (!spec.ok()) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat("table '", name, "': ", spec.status().message())));
    }
    initial.emplace(*spec, seed);
  }
  ckpt::OpenedCheckpoint c = OpenPath(path);
  // The table's kind and size from its chain's full save (an increment lists only changed rows).
  const ckpt::SafetensorsReader& reader = *c.chain().front();
  const ckpt::TensorEntry* values = reader.Find(name);
  if (values == nullptr || values->dtype != ckpt::Dtype::kF32 || values->shape.size() != 2) {
    std::vector<std::string> tables;
    for (const ckpt::TensorEntry& e : reader.tensors()) {
      if (e.dtype == ckpt::Dtype::kF32 && e.shape.size() == 2 && e.name.find('/') == std::string::npos) {
        tables.push_back(e.name);
      }
    }
    throw StatusError(absl::NotFoundError(absl::StrCat(
        c.path, " has no table '", name, "'; its [rows, dim] tensors are: ", absl::StrJoin(tables, ", "))));
  }
  dist::TableSpec spec;
  spec.name = name;
  spec.dim = values->shape[1];
  spec.kind = reader.Find(name + "/ids") != nullptr ? dist::TableKind::kDynamic : dist::TableKind::kFixed;
  if (!spec.dynamic()) {
    spec.num_embeddings = values->shape[0];
    for (int64_t id : ids) {
      if (id < 0 || id >= spec.num_embeddings) {
        throw StatusError(absl::InvalidArgumentError(absl::StrCat(
            "table '", name, "': id ", id, " is outside the vocabulary [0, ", spec.num_embeddings, ") of ", c.path)));
      }
    }
  }
  std::vector<int64_t> unique = ids;
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  std::vector<bool> found;
  Tensor rows = ValueOrThrow(train::ReadTableRows(c, spec, unique, &found));
  TableRows out;
  out.path = c.path;
  out.global_step = c.global_step;
  out.rows = Tensor({static_cast<int64_t>(ids.size()), spec.dim});
  out.found.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const size_t q = std::lower_bound(unique.begin(), unique.end(), ids[i]) - unique.begin();
    std::copy_n(rows.data() + q * spec.dim, spec.dim, out.rows.data() + i * spec.dim);
    out.found[i] = found[q];
    if (!found[q] && initial.has_value()) initial->Fill(ids[i], out.rows.data() + i * spec.dim, spec.dim);
  }
  return out;
}

}  // namespace

void RegisterCheckpoint(py::module_& m) {
  m.def(
      "_read_checkpoint",
      [](const std::string& path) {
        ckpt::Checkpoint c;
        {
          py::gil_scoped_release release;
          c = ReadPath(path);
        }
        py::dict tensors;
        for (auto& [name, t] : c.contents.tensors) tensors[py::str(name)] = ToArray(std::move(t));
        py::dict metadata;
        for (const auto& [k, v] : c.contents.metadata) metadata[py::str(k)] = py::str(v);
        py::dict int64s;
        for (auto& [name, v] : c.contents.int64s) int64s[py::str(name)] = ToArray(std::move(v));
        return py::make_tuple(c.path, c.global_step, tensors, metadata, int64s);
      },
      py::arg("path"),
      R"doc(_read_checkpoint(dir_or_file) -> (path, global_step, {name: float32 array}, {key: str},
{name: int64 array}).)doc");
  m.def(
      "_read_table_rows",
      [](const std::string& path, const std::string& name, const py::array_t<int64_t, py::array::c_style>& ids,
         const std::string& initializer, uint64_t seed) {
        std::vector<int64_t> wanted(ids.data(), ids.data() + ids.size());
        TableRows r;
        {
          py::gil_scoped_release release;
          r = ReadRows(path, name, std::move(wanted), initializer, seed);
        }
        const py::ssize_t n = static_cast<py::ssize_t>(r.found.size());
        py::array_t<bool> found(n);
        std::copy(r.found.begin(), r.found.end(), found.mutable_data());
        return py::make_tuple(r.path, r.global_step, ToArray(std::move(r.rows)), found);
      },
      py::arg("path"), py::arg("name"), py::arg("ids"), py::arg("initializer") = "", py::arg("seed") = 0,
      R"doc(_read_table_rows(dir_or_file, table, int64 ids, initializer="", seed=0) -> (path, global_step,
float32 [ids, dim], bool [ids]: the file holds the id's row).)doc");
}

}  // namespace psflow::python
