// psflow._CtrFileReader: batches of a job's training files in Criteo's layout for a PyTorch worker
// (psflow.data.CtrFiles), read by the C++ reader (psflow/data/criteo.h) through the same sources as
// `psflow train`'s workers (programs/ctr/ctr_files.h): async, slices from the work queue on ps
// task 0; sync, this worker's part of each global batch of the fixed order, from the session's data
// step on (a resumed job continues where its checkpoint stands). Thin: numpy arrays the C++ fills
// with the GIL released; errors (one line naming file and line) become psflow exceptions.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "binding.h"
#include "programs/ctr/ctr_files.h"
#include "programs/ctr/ctr_single.h"
#include "psflow/train/session.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

class PyCtrFileReader {
 public:
  PyCtrFileReader(py::object session, std::string pattern, int64_t batch_size, int num_fields, int64_t num_epochs,
                  bool shuffle, int file_slices, int64_t max_bad_lines, int num_dense)
      : session_object_(std::move(session)), session_(SessionOf(session_object_)) {
    if (batch_size <= 0 || num_fields <= 0 || num_epochs <= 0 || file_slices <= 0 || max_bad_lines < 0 ||
        num_dense < 0) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("CtrFiles: batch_size=", batch_size, ", num_fields=", num_fields, ", num_epochs=", num_epochs,
                       ", file_slices=", file_slices, " must be positive and max_bad_lines=", max_bad_lines,
                       ", num_dense=", num_dense, " not negative")));
    }
    pattern_ = std::move(pattern);
    batch_ = batch_size;
    fields_ = num_fields;
    dense_ = num_dense;
    epochs_ = num_epochs;
    shuffle_ = shuffle;
    slices_ = file_slices;
    max_bad_ = max_bad_lines;
    // An empty list or a glob matching nothing is refused at once, naming the pattern.
    ThrowIfError(data::ExpandCriteoFiles(pattern_).status());
  }

  // The next batch (ids int64 [B, F], dense float32 [B, D], labels float32 [B]), or None at the end
  // of the data (the rest, under a batch, unused).
  py::object Next() {
    py::array_t<int64_t> ids({batch_, static_cast<int64_t>(fields_)});
    py::array_t<float> dense({batch_, static_cast<int64_t>(dense_)});
    py::array_t<float> labels(batch_);
    absl::Status filled;
    {
      int64_t* i = ids.mutable_data();
      float* d = dense.mutable_data();
      float* l = labels.mutable_data();
      py::gil_scoped_release release;
      filled = Fill(i, d, l);
    }
    if (absl::IsOutOfRange(filled)) return py::none();
    ThrowIfError(filled);
    return py::make_tuple(ids, dense, labels);
  }

  int64_t examples_read() const { return fixed_ ? fixed_->examples_read() : queue_ ? queue_->examples_read() : 0; }
  int64_t bad_lines() const { return fixed_ ? fixed_->bad_lines() : queue_ ? queue_->bad_lines() : 0; }
  int64_t epochs_begun() const { return fixed_ ? fixed_->epochs_begun() : queue_ ? queue_->epochs_begun() : 0; }
  int64_t slices_read() const { return queue_ ? queue_->slices_read() : 0; }

  // Training ended before the files did: the work queue's slice being read goes back (see
  // train::CtrSliceReader::Stop).
  void Stop() {
    if (queue_ == nullptr) return;
    absl::Status stopped;
    {
      py::gil_scoped_release release;
      stopped = queue_->Stop();
    }
    ThrowIfError(stopped);
  }

 private:
  absl::Status Open() {
    if (!session_.is_open()) {
      return absl::FailedPreconditionError(
          "CtrFiles: iterate after the worker session is open (inside `with psflow.WorkerSession(...) as sess:`)");
    }
    train::TrainOptions o = session_.options();
    o.train_files = pattern_;
    o.batch_size = static_cast<int>(batch_);
    o.ctr_fields = fields_;
    o.ctr_dense = dense_;
    o.num_epochs = epochs_;
    o.shuffle_files = shuffle_;
    o.file_slices = slices_;
    o.max_bad_lines = max_bad_;
    if (session_.sync()) {
      auto files = train::CtrFileBatches::Open(o, session_.worker_index(), session_.num_workers());
      if (!files.ok()) return files.status();
      fixed_ = *std::move(files);
      step_ = session_.data_step();  // a resumed job: the checkpoint's global batch
      return absl::OkStatus();
    }
    auto files = data::ExpandCriteoFiles(o.train_files);
    if (!files.ok()) return files.status();
    auto plan = train::MakeCtrWorkPlan(*files, int64_t{slices_} * session_.num_workers(), epochs_, shuffle_, o.seed);
    if (!plan.ok()) return plan.status();
    queue_ = std::make_unique<train::CtrSliceReader>(
        train::QueueSlices(session_, *std::move(plan), o.init_timeout_secs, o.worker_timeout_secs,
                           [](const std::string& line) {
                             py::gil_scoped_acquire acquire;
                             py::print(line);
                           }),
        train::CtrReaderOptions(o));
    return absl::OkStatus();
  }

  absl::Status Fill(int64_t* ids, float* dense, float* labels) {
    if (fixed_ == nullptr && queue_ == nullptr) {
      if (auto s = Open(); !s.ok()) return s;
    }
    if (fixed_ != nullptr) {
      // One batch per global step, from the session's step at the first batch on: the iterator may
      // be asked ahead of the step (sess.batches reads one batch ahead).
      if (auto s = fixed_->Fill(step_, ids, dense, labels); !s.ok()) return s;
      ++step_;
      return absl::OkStatus();
    }
    int64_t have = 0;
    while (have < batch_) {
      auto got = queue_->Read(batch_ - have, ids + have * fields_, dense + have * dense_, labels + have);
      if (!got.ok()) return got.status();
      if (*got == 0) return absl::OutOfRangeError("the work queue is at its end");
      have += *got;
    }
    return absl::OkStatus();
  }

  py::object session_object_;  // keeps the _Session alive
  train::WorkerSession& session_;
  std::string pattern_;
  int64_t batch_ = 0, epochs_ = 1, max_bad_ = 0, step_ = 0;
  int fields_ = 26, dense_ = 13, slices_ = 10;
  bool shuffle_ = false;
  std::unique_ptr<train::CtrFileBatches> fixed_;
  std::unique_ptr<train::CtrSliceReader> queue_;
};

}  // namespace

void RegisterCtrFiles(py::module_& m) {
  m.def(
      "read_ctr_files",
      [](const std::string& pattern, int num_fields, int64_t max_examples, int64_t max_bad_lines, int num_dense) {
        train::TrainOptions o;
        o.test_files = pattern;
        o.ctr_fields = num_fields;
        o.ctr_dense = num_dense;
        o.ctr_test_examples = max_examples;
        o.max_bad_lines = max_bad_lines;
        if (num_fields <= 0 || max_examples <= 0 || max_bad_lines < 0 || num_dense < 0) {
          throw StatusError(absl::InvalidArgumentError(absl::StrCat(
              "read_ctr_files: num_fields=", num_fields, " and max_examples=", max_examples,
              " must be positive, max_bad_lines=", max_bad_lines, " and num_dense=", num_dense, " not negative")));
        }
        data::CtrExamples test;
        {
          py::gil_scoped_release release;
          test = ValueOrThrow(train::ReadCtrTestFiles(o));
        }
        const int64_t n = test.num_examples;
        py::array_t<int64_t> ids({n, static_cast<int64_t>(num_fields)});
        py::array_t<float> dense({n, static_cast<int64_t>(num_dense)});
        py::array_t<float> labels(n);
        std::copy(test.ids.begin(), test.ids.end(), ids.mutable_data());
        std::copy(test.dense.begin(), test.dense.end(), dense.mutable_data());
        std::copy(test.labels.begin(), test.labels.end(), labels.mutable_data());
        py::dict out;
        out["ids"] = ids;
        out["dense"] = dense;
        out["labels"] = labels;
        return out;
      },
      py::arg("pattern"), py::arg("num_fields"), py::arg("max_examples"), py::arg("max_bad_lines") = 0,
      py::arg("num_dense") = 13,
      "read_ctr_files(pattern, num_fields, max_examples, max_bad_lines=0, num_dense=13) -> {'ids', 'dense', "
      "'labels'}: the "
      "first max_examples examples of files in Criteo's layout (a test set), read by the C++ reader.");
  py::class_<PyCtrFileReader>(m, "_CtrFileReader",
                              "Batches of training files in Criteo's layout for a worker session (use "
                              "psflow.data.CtrFiles).")
      .def(py::init<py::object, std::string, int64_t, int, int64_t, bool, int, int64_t, int>(), py::arg("session"),
           py::arg("pattern"), py::arg("batch_size"), py::arg("num_fields"), py::arg("num_epochs"), py::arg("shuffle"),
           py::arg("file_slices"), py::arg("max_bad_lines"), py::arg("num_dense"))
      .def("next", &PyCtrFileReader::Next)
      .def("stop", &PyCtrFileReader::Stop)
      .def_property_readonly("examples_read", &PyCtrFileReader::examples_read)
      .def_property_readonly("bad_lines", &PyCtrFileReader::bad_lines)
      .def_property_readonly("epochs_begun", &PyCtrFileReader::epochs_begun)
      .def_property_readonly("slices_read", &PyCtrFileReader::slices_read);
}

}  // namespace psflow::python
