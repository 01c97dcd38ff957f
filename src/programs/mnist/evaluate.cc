// Evaluation: accuracy and cross-entropy of a model on a data set, in batches whose activations
// stay within a memory budget; and the training data of a run (MNIST, or vgg19's synthetic images).
#include <algorithm>
#include <unordered_set>
#include <vector>

#include "psflow/core/ops.h"
#include "psflow/train/train.h"

namespace psflow::train {
namespace {

// Activation bytes one evaluation batch may keep alive: a quarter of the model's size, at least
// 48 MB. The forward graph holds every layer's output until the logits are read, so a fixed
// 500-image batch cost vgg19 ~600 MB, 4x its parameters (docs/memory.md); much smaller batches would
// re-read a wide model's weights from memory once per batch.
constexpr int64_t kMinEvalActivationBytes = 48 << 20;
// Batches larger than this do not make BLAS faster.
constexpr int64_t kMaxEvalBatch = 500;

// Floats that the forward pass of one example keeps alive: every node reachable from the
// logits except the parameters.
int64_t ActivationFloatsPerExample(nn::Model& model, const data::Dataset& dataset, nn::ForwardContext& ctx) {
  Var logits = model.Logits(dataset.images.data(), 1, ctx);
  std::unordered_set<const Node*> seen;
  for (const Var& p : model.parameters()) seen.insert(p.get());
  std::vector<const Node*> pending{logits.get()};
  int64_t floats = 0;
  while (!pending.empty()) {
    const Node* node = pending.back();
    pending.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    floats += node->value.size();
    for (const Var& input : node->inputs) pending.push_back(input.get());
  }
  return std::max<int64_t>(floats, 1);
}

}  // namespace

EvalResult Evaluate(nn::Model& model, const data::Dataset& dataset) {
  nn::ForwardContext ctx{.training = false, .rng = nullptr, .before_layer = nullptr};
  if (dataset.num_examples <= 0) return {0, 0};
  int64_t param_bytes = 0;
  for (const Var& p : model.parameters()) param_bytes += 4 * p->value.size();
  const int64_t budget = std::max(kMinEvalActivationBytes, param_bytes / 4);
  const int64_t kBatch =
      std::clamp<int64_t>(budget / (4 * ActivationFloatsPerExample(model, dataset, ctx)), 1, kMaxEvalBatch);
  double correct = 0, xent_sum = 0;
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
