// psflow.CtrGenerator (the synthetic CTR data of include/psflow/data/ctr.h: batches per worker and
// step, the test set, its Bayes log-loss and AUC) and psflow.log_loss / psflow.auc
// (include/psflow/data/ctr_metrics.h). Thin: arrays cross as numpy buffers the C++ fills in place
// (torch.from_numpy then shares them), errors become psflow exceptions, filling releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "binding.h"
#include "psflow/data/ctr.h"
#include "psflow/data/ctr_metrics.h"

namespace py = pybind11;

namespace psflow::python {
namespace {

// Checks that `array` is a writeable C-contiguous array of T with `shape`; never converts (a
// converted copy would be filled and the caller's array left as it was).
template <typename T>
void CheckOutput(const py::array& array, const std::vector<py::ssize_t>& shape, const char* name) {
  const std::string want = absl::StrCat(py::str(py::dtype::of<T>()).cast<std::string>(), " array of shape (",
                                        absl::StrJoin(shape, ", "), ")");
  if (!array.dtype().is(py::dtype::of<T>()) || array.ndim() != static_cast<py::ssize_t>(shape.size()) ||
      !std::equal(shape.begin(), shape.end(), array.shape())) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(
        "CtrGenerator: out ", name, " is a ", py::str(array.dtype()).cast<std::string>(), " array of shape ",
        py::str(py::tuple(py::cast(std::vector<py::ssize_t>(array.shape(), array.shape() + array.ndim()))))
            .cast<std::string>(),
        "; pass a ", want)));
  }
  if (!(array.flags() & py::array::c_style) || !array.writeable()) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("CtrGenerator: out ", name, " is not a writeable C-contiguous array; pass a fresh ", want)));
  }
}

// Reads a 1-D float32 or float64 array (any other dtype is refused, not converted silently).
template <typename Fn>
auto WithScores(const py::array& scores, Fn fn) {
  if (scores.ndim() != 1) {
    throw StatusError(absl::InvalidArgumentError("scores must be a 1-D float32 or float64 array"));
  }
  if (scores.dtype().is(py::dtype::of<double>())) {
    auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(scores);
    return fn(absl::Span<const double>(a.data(), a.size()));
  }
  if (scores.dtype().is(py::dtype::of<float>())) {
    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(scores);
    return fn(absl::Span<const float>(a.data(), a.size()));
  }
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat("scores have dtype ", py::str(scores.dtype()).cast<std::string>(), "; pass float32 or float64")));
}

py::array_t<float, py::array::c_style> Labels(const py::array& labels) {
  if (labels.ndim() != 1 || labels.dtype().kind() != 'f') {
    throw StatusError(absl::InvalidArgumentError("labels must be a 1-D float array of 0 and 1"));
  }
  return py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(labels);
}

class PyCtrGenerator {
 public:
  explicit PyCtrGenerator(data::CtrConfig config) : gen_(ValueOrThrow(data::CtrGenerator::Create(std::move(config)))) {}

  py::tuple Batch(int64_t step, int64_t batch_size, int64_t worker_index, std::optional<py::tuple> out,
                  bool probabilities) {
    if (batch_size < 0) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("CtrGenerator.batch: batch_size is ", batch_size, "; it must not be negative")));
    }
    const py::ssize_t b = batch_size, f = gen_.num_fields(), d = gen_.num_dense();
    py::array ids, dense, labels;
    if (out.has_value()) {
      if (out->size() != 3) {
        throw StatusError(absl::InvalidArgumentError("CtrGenerator.batch: out must be (ids, dense, labels)"));
      }
      ids = (*out)[0].cast<py::array>();
      dense = (*out)[1].cast<py::array>();
      labels = (*out)[2].cast<py::array>();
      CheckOutput<int64_t>(ids, {b, f}, "ids");
      CheckOutput<float>(dense, {b, d}, "dense");
      CheckOutput<float>(labels, {b}, "labels");
    } else {
      ids = py::array_t<int64_t>({b, f});
      dense = py::array_t<float>({b, d});
      labels = py::array_t<float>(b);
    }
    std::optional<py::array_t<double>> p;
    if (probabilities) p.emplace(b);
    auto* ids_data = static_cast<int64_t*>(ids.mutable_data());
    auto* dense_data = static_cast<float*>(dense.mutable_data());
    auto* labels_data = static_cast<float*>(labels.mutable_data());
    double* p_data = p ? p->mutable_data() : nullptr;
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = gen_.FillBatch(worker_index, step, batch_size, ids_data, dense_data, labels_data, p_data);
    }
    ThrowIfError(status);
    if (p) return py::make_tuple(ids, dense, labels, *p);
    return py::make_tuple(ids, dense, labels);
  }

  py::dict TestSet(int64_t n) {
    if (n < 1) {
      throw StatusError(
          absl::InvalidArgumentError(absl::StrCat("CtrGenerator.test_set: n is ", n, "; it must be >= 1")));
    }
    const py::ssize_t f = gen_.num_fields(), d = gen_.num_dense();
    py::array_t<int64_t> ids({static_cast<py::ssize_t>(n), f});
    py::array_t<float> dense({static_cast<py::ssize_t>(n), d});
    py::array_t<float> labels(n);
    py::array_t<double> probabilities(n);
    int64_t* ids_data = ids.mutable_data();
    float *dense_data = dense.mutable_data(), *labels_data = labels.mutable_data();
    double* p_data = probabilities.mutable_data();
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = gen_.FillTest(0, n, ids_data, dense_data, labels_data, p_data);
    }
    ThrowIfError(status);
    py::dict result;
    result["ids"] = ids;
    result["dense"] = dense;
    result["labels"] = labels;
    result["probabilities"] = probabilities;
    return result;
  }

  py::dict Bayes(int64_t n) {
    absl::StatusOr<data::CtrBayesMetrics> metrics;
    {
      py::gil_scoped_release release;
      absl::StatusOr<data::CtrExamples> test = gen_.TestSet(n);
      metrics = test.ok() ? data::BayesMetrics(*test) : test.status();
    }
    const data::CtrBayesMetrics m = ValueOrThrow(std::move(metrics));
    py::dict result;
    result["log_loss"] = m.log_loss;
    result["auc"] = m.auc;
    result["expected_log_loss"] = m.expected_log_loss;
    result["click_rate"] = m.click_rate;
    return result;
  }

  py::array_t<double> TrueLogits(const py::array& ids_in, const py::array& dense_in) {
    const py::ssize_t f = gen_.num_fields(), d = gen_.num_dense();
    if (!ids_in.dtype().is(py::dtype::of<int64_t>()) || ids_in.ndim() != 2 || ids_in.shape(1) != f) {
      throw StatusError(
          absl::InvalidArgumentError(absl::StrCat("CtrGenerator.true_logits: ids must be int64 [n, ", f, "]")));
    }
    const py::ssize_t n = ids_in.shape(0);
    if (dense_in.ndim() != 2 || dense_in.shape(0) != n || dense_in.shape(1) != d) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("CtrGenerator.true_logits: dense must be float32 [", n, ", ", d, "]")));
    }
    auto ids = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(ids_in);
    auto dense = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(dense_in);
    py::array_t<double> out(n);
    for (py::ssize_t i = 0; i < n; ++i)
      out.mutable_data()[i] = gen_.TrueLogit(ids.data() + i * f, dense.data() + i * d);
    return out;
  }

  py::array_t<float> TeacherEmbedding(int field, int64_t id) {
    if (field < 0 || field >= gen_.num_fields()) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("CtrGenerator.teacher_embedding: field ", field, " is not in [0, ", gen_.num_fields(), ")")));
    }
    py::array_t<float> out(gen_.config().teacher_dim);
    gen_.TeacherEmbedding(field, id, out.mutable_data());
    return out;
  }

  int64_t IdOfRank(int field, int64_t rank) {
    if (field < 0 || field >= gen_.num_fields() || rank < 1 || rank > gen_.config().vocab_sizes[field]) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("CtrGenerator.id_of_rank: field ", field, " rank ", rank,
                       " is out of range (ranks run from 1 to the field's vocabulary size)")));
    }
    return gen_.IdOfRank(field, rank);
  }

  const data::CtrGenerator& gen() const { return gen_; }

 private:
  data::CtrGenerator gen_;
};

}  // namespace

void RegisterCtrData(py::module_& m) {
  py::class_<PyCtrGenerator>(m, "CtrGenerator", R"doc(Synthetic CTR data with a known answer (C++, deterministic).

F categorical fields of Zipf(zipf_alpha) ids over vocab_sizes[f] ranks, hashed to non-negative int64;
D dense features log(1 + c) of integer counts c (as read from Criteo-layout files); labels ~ Bernoulli(sigmoid(b + w.x + sum_{f<g} <E_f[id_f], E_g[id_g]>)), a
factorization-machine teacher of dim teacher_dim drawn from the seed. Example j of worker w's batch at
step s depends on (seed, w, s, j) only; the test set is its own stream.

batch(step, batch_size, worker_index=0, out=None, probabilities=False) -> (ids int64 [B, F],
    dense float32 [B, D], labels float32 [B]) (+ true probabilities float64 [B]); with out=(ids, dense,
    labels) those arrays are filled in place (no allocation) and returned. torch.from_numpy(a) shares them.
test_set(n) -> {"ids", "dense", "labels", "probabilities"}: the first n test examples.
bayes_metrics(n) -> {"log_loss", "auc", "expected_log_loss", "click_rate"} of the true probabilities on
    test_set(n): the ceiling a model's test log-loss and AUC are compared with.)doc")
      .def(py::init([](uint64_t seed, int num_fields, int num_dense, std::optional<std::vector<int64_t>> vocab_sizes,
                       double zipf_alpha, int teacher_dim, double interaction_std, double dense_std, double base_ctr) {
             data::CtrConfig config;
             config.seed = seed;
             config.num_fields = num_fields;
             config.num_dense = num_dense;
             if (vocab_sizes) config.vocab_sizes = *vocab_sizes;
             config.zipf_alpha = zipf_alpha;
             config.teacher_dim = teacher_dim;
             config.interaction_std = interaction_std;
             config.dense_std = dense_std;
             config.base_ctr = base_ctr;
             return std::make_unique<PyCtrGenerator>(std::move(config));
           }),
           py::arg("seed") = 0, py::arg("num_fields") = 26, py::arg("num_dense") = 13,
           py::arg("vocab_sizes") = py::none(), py::arg("zipf_alpha") = 1.1, py::arg("teacher_dim") = 8,
           py::arg("interaction_std") = 1.0, py::arg("dense_std") = 0.5, py::arg("base_ctr") = 0.25)
      .def("batch", &PyCtrGenerator::Batch, py::arg("step"), py::arg("batch_size"), py::arg("worker_index") = 0,
           py::arg("out") = py::none(), py::arg("probabilities") = false)
      .def("test_set", &PyCtrGenerator::TestSet, py::arg("n"))
      .def("bayes_metrics", &PyCtrGenerator::Bayes, py::arg("n"))
      .def("true_logits", &PyCtrGenerator::TrueLogits, py::arg("ids"), py::arg("dense"),
           "The teacher's logit of each example (ids int64 [n, F], dense float32 [n, D]) -> float64 [n].")
      .def("teacher_embedding", &PyCtrGenerator::TeacherEmbedding, py::arg("field"), py::arg("id"),
           "E*_field[id], float32 [teacher_dim].")
      .def("id_of_rank", &PyCtrGenerator::IdOfRank, py::arg("field"), py::arg("rank"),
           "The id of rank `rank` (1 = most frequent) of `field`.")
      .def_property_readonly("bias", [](const PyCtrGenerator& g) { return g.gen().bias(); })
      .def_property_readonly("dense_weights",
                             [](const PyCtrGenerator& g) {
                               auto w = g.gen().dense_weights();
                               return py::array_t<float>(static_cast<py::ssize_t>(w.size()), w.data());
                             })
      .def_property_readonly("vocab_sizes", [](const PyCtrGenerator& g) { return g.gen().config().vocab_sizes; })
      .def_property_readonly("num_fields", [](const PyCtrGenerator& g) { return g.gen().num_fields(); })
      .def_property_readonly("num_dense", [](const PyCtrGenerator& g) { return g.gen().num_dense(); })
      .def_property_readonly("teacher_dim", [](const PyCtrGenerator& g) { return g.gen().config().teacher_dim; })
      .def_property_readonly("seed", [](const PyCtrGenerator& g) { return g.gen().config().seed; });

  m.def(
      "log_loss",
      [](const py::array& labels, const py::array& probabilities) {
        auto y = Labels(labels);
        return WithScores(probabilities, [&](auto p) {
          return ValueOrThrow(data::LogLoss(absl::Span<const float>(y.data(), y.size()), p));
        });
      },
      py::arg("labels"), py::arg("probabilities"),
      "Mean cross-entropy of 0/1 labels under probabilities (clipped to [1e-15, 1 - 1e-15]), in float64.");
  m.def(
      "auc",
      [](const py::array& labels, const py::array& scores) {
        auto y = Labels(labels);
        return WithScores(
            scores, [&](auto s) { return ValueOrThrow(data::Auc(absl::Span<const float>(y.data(), y.size()), s)); });
      },
      py::arg("labels"), py::arg("scores"),
      "Exact ROC AUC of scores against 0/1 labels (sorted once; tied scores share their average rank).");
}

}  // namespace psflow::python
