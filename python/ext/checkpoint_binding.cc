// psflow._read_checkpoint: a checkpoint of psflow's (docs/design.md's checkpoints: one safetensors
// file per save, every variable whole under its own name) read by psflow's C++ reader
// (psflow/ckpt/checkpoint.h: structure and checksum checked) and handed to Python as numpy arrays
// that own the reader's memory (no copy). psflow.read_checkpoint / psflow.load_checkpoint
// (python/psflow/checkpoint.py) are built on it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "binding.h"
#include "psflow/ckpt/checkpoint.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

py::array_t<float> ToArray(Tensor t) {
  auto* owned = new Tensor(std::move(t));
  py::capsule owner(owned, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(owned->shape().begin(), owned->shape().end());
  return py::array_t<float>(shape, owned->data(), owner);
}

// A directory: its newest checkpoint that passes its checksum (as a restore takes it); a file: that
// file, checked.
ckpt::Checkpoint ReadPath(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::string> skipped;
    auto latest = ValueOrThrow(ckpt::LoadLatestCheckpoint(path, &skipped));
    if (!latest.has_value()) {
      std::string why = skipped.empty() ? "no model.ckpt-STEP.safetensors file in it" : skipped.front();
      throw StatusError(absl::NotFoundError(
          absl::StrCat("no readable checkpoint in ", path, ": ", why, "; give a --checkpoint_dir a job saved into, or a file")));
    }
    return *std::move(latest);
  }
  if (!std::filesystem::exists(path, ec)) {
    throw StatusError(absl::NotFoundError(
        absl::StrCat("checkpoint ", path, " does not exist; give a checkpoint directory or a model.ckpt-STEP.safetensors file")));
  }
  return ValueOrThrow(ckpt::ReadCheckpoint(path));
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
        return py::make_tuple(c.path, c.global_step, tensors, metadata);
      },
      py::arg("path"),
      R"doc(_read_checkpoint(dir_or_file) -> (path, global_step, {name: float32 array}, {key: str}).)doc");
}

}  // namespace psflow::python
