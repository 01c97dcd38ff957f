// psflow.BatchSampler (the data order of DESIGN.md §4: worker i's slice of each global batch, the
// sampler `psflow train` uses) and psflow.load_mnist (psflow's IDX reader and split).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>

#include "binding.h"
#include "psflow/data/batcher.h"
#include "psflow/data/mnist.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

py::array_t<int64_t> ToArray(const std::vector<int64_t>& v) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

// Hands a Dataset's vectors to numpy without a copy: the arrays keep the Dataset alive.
py::dict DatasetDict(std::shared_ptr<data::Dataset> d) {
  py::capsule owner(new std::shared_ptr<data::Dataset>(d),
                    [](void* p) { delete static_cast<std::shared_ptr<data::Dataset>*>(p); });
  py::dict out;
  out["images"] = py::array_t<float>({d->num_examples, d->example_size}, d->images.data(), owner);
  py::array_t<int64_t> labels(d->num_examples);
  std::copy(d->labels.begin(), d->labels.end(), labels.mutable_data());
  out["labels"] = labels;
  return out;
}

class PyBatchSampler {
 public:
  PyBatchSampler(int64_t num_examples, int64_t batch_size, int worker_index, int num_workers, uint64_t seed) {
    ThrowIfError(data::BatchSampler::ValidateArgs(num_examples, batch_size, worker_index, num_workers));
    sampler_ = std::make_unique<data::BatchSampler>(num_examples, batch_size, worker_index, num_workers, seed);
  }
  py::array_t<int64_t> Batch(int64_t step) {
    if (step < 0) throw StatusError(absl::InvalidArgumentError("BatchSampler.batch: step must not be negative"));
    sampler_->BatchAt(step, &indices_);
    return ToArray(indices_);
  }

 private:
  std::unique_ptr<data::BatchSampler> sampler_;
  std::vector<int64_t> indices_;
};

}  // namespace

void RegisterData(py::module_& m) {
  py::class_<PyBatchSampler>(m, "BatchSampler", R"doc(Worker `worker_index`'s slice of each global batch.

batch(step) -> int64 array of batch_size example indices of global batch `step`: the same examples
psflow train's worker takes (sync: step = the global step; async: the worker's local step).)doc")
      .def(py::init<int64_t, int64_t, int, int, uint64_t>(), py::arg("num_examples"), py::arg("batch_size"),
           py::arg("worker_index") = 0, py::arg("num_workers") = 1, py::arg("seed") = 0)
      .def("batch", &PyBatchSampler::Batch, py::arg("step"));
  m.def(
      "load_mnist",
      [](const std::string& dir) {
        data::MnistData mnist;
        {
          py::gil_scoped_release release;
          mnist = ValueOrThrow(data::LoadMnist(dir));
        }
        py::dict out;
        out["train"] = DatasetDict(std::make_shared<data::Dataset>(std::move(mnist.train)));
        out["validation"] = DatasetDict(std::make_shared<data::Dataset>(std::move(mnist.validation)));
        out["test"] = DatasetDict(std::make_shared<data::Dataset>(std::move(mnist.test)));
        return out;
      },
      py::arg("data_dir"),
      R"doc(MNIST from the four IDX files of `data_dir`, split as psflow train does: {"train", "validation",
"test"} each {"images": float32 [n, 784] in [0, 1], "labels": int64 [n]}.)doc");
}

}  // namespace psflow::python
