#include "psflow/nn/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace psflow::nn {

Model::Model(std::string name, Shape example_shape, int num_classes, std::unique_ptr<Layer> network)
    : name_(std::move(name)),
      example_shape_(std::move(example_shape)),
      num_classes_(num_classes),
      network_(std::move(network)) {
  network_->CollectParameters(&parameters_);
}

int64_t Model::NumParameters() const {
  int64_t n = 0;
  for (const Var& p : parameters_) n += p->value.size();
  return n;
}

Var Model::Logits(const float* images, int64_t batch, ForwardContext& ctx) {
  Shape shape = {batch};
  shape.insert(shape.end(), example_shape_.begin(), example_shape_.end());
  Tensor input(shape);
  std::memcpy(input.data(), images, input.bytes());
  return network_->Forward(Constant(std::move(input)), ctx);
}

Var Model::Loss(const Var& logits, std::span<const int32_t> labels) { return ops::SoftmaxCrossEntropy(logits, labels); }

namespace {

using ops::Padding;

std::unique_ptr<Model> Softmax(Rng& rng) {
  auto net = std::make_unique<Sequential>();
  net->Emplace<Dense>("softmax", 784, 10, WeightInit{WeightInit::kZeros}, Activation::kNone, rng);
  return std::make_unique<Model>("softmax", Shape{784}, 10, std::move(net));
}

// The seed mlp: hidden weights stddev 1/28 (= 1/sqrt(784)), output 1/sqrt(hidden), biases zero.
std::unique_ptr<Model> Mlp(int hidden, Rng& rng) {
  auto net = std::make_unique<Sequential>();
  net->Emplace<Dense>("hidden", 784, hidden, WeightInit{WeightInit::kTruncatedNormal, 1.0f / 28}, Activation::kRelu,
                      rng);
  net->Emplace<Dense>("softmax", hidden, 10, WeightInit{WeightInit::kTruncatedNormal, 1.0f / std::sqrt(float(hidden))},
                      Activation::kNone, rng);
  return std::make_unique<Model>("mlp", Shape{784}, 10, std::move(net));
}

std::unique_ptr<Model> Cnn(Rng& rng) {
  const WeightInit init{WeightInit::kTruncatedNormal, 0.1f, 0.1f};
  auto net = std::make_unique<Sequential>();
  net->Emplace<Conv2D>("conv1", 5, 1, 32, 1, Padding::kSame, init, true, rng)
      .Emplace<MaxPool>(2, 2, Padding::kSame)
      .Emplace<Conv2D>("conv2", 5, 32, 64, 1, Padding::kSame, init, true, rng)
      .Emplace<MaxPool>(2, 2, Padding::kSame)
      .Emplace<Flatten>()
      .Emplace<Dense>("fc1", 7 * 7 * 64, 1024, init, Activation::kRelu, rng)
      .Emplace<Dropout>(0.5f)
      .Emplace<Dense>("fc2", 1024, 10, init, Activation::kNone, rng);
  return std::make_unique<Model>("cnn", Shape{28, 28, 1}, 10, std::move(net));
}

// VGG-19 for 32x32x3 inputs: 16 3x3 convs in five blocks, each block ending in a 2x2 max-pool,
// then three dense layers (512 -> 4096 -> 4096 -> 10).
std::unique_ptr<Model> Vgg19(Rng& rng) {
  const WeightInit init{WeightInit::kGlorotUniform};
  const int blocks[5][2] = {{64, 2}, {128, 2}, {256, 4}, {512, 4}, {512, 4}};
  auto net = std::make_unique<Sequential>();
  int64_t in = 3;
  for (int b = 0; b < 5; ++b) {
    for (int i = 0; i < blocks[b][1]; ++i) {
      net->Emplace<Conv2D>(absl::StrCat("conv", b + 1, "_", i + 1), 3, in, blocks[b][0], 1, Padding::kSame, init, true,
                           rng);
      in = blocks[b][0];
    }
    net->Emplace<MaxPool>(2, 2, Padding::kValid);
  }
  net->Emplace<Flatten>()
      .Emplace<Dense>("fc6", 512, 4096, init, Activation::kRelu, rng)
      .Emplace<Dense>("fc7", 4096, 4096, init, Activation::kRelu, rng)
      .Emplace<Dense>("fc8", 4096, 10, init, Activation::kNone, rng);
  return std::make_unique<Model>("vgg19", Shape{32, 32, 3}, 10, std::move(net));
}

struct Registered {
  ModelFactory factory;
  ModelDefaults defaults;
};

std::map<std::string, Registered>& Registry() {
  static auto* registry = new std::map<std::string, Registered>();
  return *registry;
}

// The ctr model's tables' adagrad rate (with TF's initial accumulator 0.1): tuned on the generator.
// The gradient of a mean loss reaches a row as ~1/batch of its examples' share, so TF's adagrad
// (accumulator from 0.1) needs a large rate: 0.05 learns ~10x slower than 2 (measured, 300 steps).
constexpr float kCtrSparseRate = 2.0f;

std::string KnownModels() { return absl::StrJoin(ModelNames(), ", "); }

}  // namespace

std::vector<std::string> ModelNames() {
  std::vector<std::string> names = {"softmax", "mlp", "cnn", "vgg19", "ctr"};
  for (const auto& [name, r] : Registry()) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

void RegisterModel(const std::string& name, ModelFactory factory, ModelDefaults defaults) {
  Registry()[name] = {std::move(factory), std::move(defaults)};
}

absl::StatusOr<std::unique_ptr<Model>> BuildModel(const ModelConfig& config) {
  Rng rng(Rng::Mix(config.seed, 0x1417));
  if (auto it = Registry().find(config.name); it != Registry().end()) return it->second.factory(config, rng);
  if (config.name == "softmax") return Softmax(rng);
  if (config.name == "mlp") {
    if (config.hidden_units <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--hidden_units=", config.hidden_units, " must be positive"));
    }
    return Mlp(config.hidden_units, rng);
  }
  if (config.name == "cnn") return Cnn(rng);
  if (config.name == "vgg19") return Vgg19(rng);
  if (config.name == "ctr") {
    return absl::InvalidArgumentError(
        "model 'ctr' has embedding tables and is not an image classifier: build it with nn::CtrModel "
        "(psflow train, psflow local, psflow eval and the evaluator task take --model=ctr)");
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown model '", config.name, "'; choose one of ", KnownModels()));
}

absl::StatusOr<ModelDefaults> DefaultsFor(const std::string& model_name) {
  if (auto it = Registry().find(model_name); it != Registry().end()) return it->second.defaults;
  if (model_name == "softmax") return ModelDefaults{"sgd", 0.5f, 100, 1000};
  if (model_name == "mlp") return ModelDefaults{"adam", 0.01f, 100, 10000};
  if (model_name == "cnn") return ModelDefaults{"rmsprop", 1e-3f, 128, 2000, 1000, 0.5f};
  if (model_name == "vgg19") return ModelDefaults{"sgd", 0.01f, 32, 100, 0, 1.0f, true};
  if (model_name == "ctr")
    return ModelDefaults{"adam", 1e-3f, 1024, 1000, 0, 1.0f, false, {}, "adagrad", kCtrSparseRate};
  return absl::InvalidArgumentError(absl::StrCat("unknown model '", model_name, "'; choose one of ", KnownModels()));
}

}  // namespace psflow::nn
