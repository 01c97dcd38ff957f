#include <algorithm>

#include "psflow/core/ops.h"
#include "psflow/train/train.h"

namespace psflow::train {

EvalResult Evaluate(nn::Model& model, const data::Dataset& dataset) {
  // Batches bound memory (cnn activations of 1000 images are ~100 MB) without slowing BLAS.
  constexpr int64_t kBatch = 500;
  double correct = 0, xent_sum = 0;
  nn::ForwardContext ctx{.training = false, .rng = nullptr};
  for (int64_t begin = 0; begin < dataset.num_examples; begin += kBatch) {
    const int64_t n = std::min(kBatch, dataset.num_examples - begin);
    Var logits = model.Logits(dataset.images.data() + begin * dataset.example_size, n, ctx);
    std::span<const int32_t> labels(dataset.labels.data() + begin, n);
    correct += ops::Accuracy(logits->value, labels) * n;
    xent_sum += nn::Model::Loss(logits, labels)->value[0] * n;
  }
  const double total = std::max<int64_t>(dataset.num_examples, 1);
  return {correct / total, xent_sum / total};
}

absl::StatusOr<data::MnistData> LoadTrainingData(const TrainOptions& options) {
  if (options.model == "vgg19") {
    // vgg19 measures throughput and ps traffic on synthetic 32x32x3 images (docs/design.md#seed-models).
    data::MnistData d;
    d.train = data::SyntheticImages(5000, 32, 32, 3, 10, options.seed);
    d.validation = data::SyntheticImages(500, 32, 32, 3, 10, options.seed + 1);
    d.test = data::SyntheticImages(500, 32, 32, 3, 10, options.seed + 2);
    return d;
  }
  return data::LoadMnist(options.data_dir);
}

}  // namespace psflow::train
