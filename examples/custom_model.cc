// custom_model — a complete psflow program with a model of its own.
//
// It defines "lenet_small", a LeNet-like convolutional network for MNIST, with the public layer
// API (psflow/nn/layers.h, psflow/nn/model.h), registers it under that name with its default
// hyper-parameters, and hands the command line to psflow::cli::Main. The result is a full psflow
// binary that also knows the new model, in every mode:
//
//   build/examples/custom_model train --model=lenet_small --train_steps=500          # one process
//   build/examples/custom_model local --ps=1 --workers=2 --model=lenet_small         # local cluster
//   build/examples/custom_model train --job_name=worker --task_index=0 ... --model=lenet_small
//   build/examples/custom_model eval --checkpoint_dir=DIR --model=lenet_small
//
// `local` starts its tasks by re-running this same program, so every ps and worker process knows
// "lenet_small" too. When running tasks by hand, start every task (ps included) with this binary.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "psflow/cli/main.h"
#include "psflow/core/init.h"
#include "psflow/nn/layers.h"
#include "psflow/nn/model.h"

namespace {

using psflow::Rng;
using psflow::Var;
using psflow::nn::Conv2D;
using psflow::nn::Dense;
using psflow::nn::Dropout;
using psflow::nn::Flatten;
using psflow::nn::MaxPool;
using psflow::nn::Model;
using psflow::nn::ModelConfig;
using psflow::nn::Sequential;
using psflow::nn::WeightInit;
using psflow::ops::Padding;

// A layer of our own, to show the Layer interface: logits = x·W + b with W initialized to zero and
// no activation. Parameters are named leaves (MakeParameter) created once; Forward builds this
// step's graph from the ops of psflow/core/ops.h, whose gradients autodiff derives.
class Linear : public psflow::nn::Layer {
 public:
  Linear(const std::string& name, int64_t in, int64_t out)
      : weights_(psflow::MakeParameter(name + "/weights", psflow::init::Zeros({in, out}))),
        biases_(psflow::MakeParameter(name + "/biases", psflow::init::Zeros({out}))) {}
  Var Forward(const Var& x, psflow::nn::ForwardContext&) override {
    return psflow::ops::BiasAdd(psflow::ops::MatMul(x, weights_), biases_);
  }
  // Every trainable parameter must be listed here: these are the variables placed on the ps.
  void CollectParameters(std::vector<Var>* out) const override {
    out->push_back(weights_);
    out->push_back(biases_);
  }

 private:
  Var weights_, biases_;
};

// 28x28x1 -> conv 5x5x8 SAME + ReLU -> max-pool 2x2 -> conv 5x5x16 SAME + ReLU -> max-pool 2x2
//         -> dense 7*7*16 -> hidden_units (default 100) ReLU -> dropout 0.25 -> Linear 10 (logits).
// 82,934 parameters: small enough to train in seconds on a laptop CPU.
//
// The factory must build identical parameters (names, shapes, values) from the same config and
// rng: every worker replica and the chief build the model this way, and the chief's copy is the
// one that initializes the parameter servers. All randomness therefore comes from `rng`.
std::unique_ptr<Model> BuildLenetSmall(const ModelConfig& config, Rng& rng) {
  // The model's own setting --conv1_filters (declared in main, checked there): always in
  // config.settings, given or at its default.
  const int filters = std::stoi(config.settings.at("conv1_filters"));
  const WeightInit conv_init{WeightInit::kTruncatedNormal, /*stddev=*/0.1f, /*bias=*/0.1f};
  const WeightInit dense_init{WeightInit::kGlorotUniform};
  auto net = std::make_unique<Sequential>();
  net->Emplace<Conv2D>("conv1", /*kernel=*/5, /*in_channels=*/1, /*out_channels=*/filters, /*stride=*/1, Padding::kSame,
                       conv_init, /*relu=*/true, rng)
      .Emplace<MaxPool>(/*window=*/2, /*stride=*/2, Padding::kSame)
      .Emplace<Conv2D>("conv2", 5, filters, 16, 1, Padding::kSame, conv_init, true, rng)
      .Emplace<MaxPool>(2, 2, Padding::kSame)
      .Emplace<Flatten>()
      .Emplace<Dense>("fc1", 7 * 7 * 16, config.hidden_units, dense_init, psflow::nn::Activation::kRelu, rng)
      .Emplace<Dropout>(0.25f)  // active only when training
      .Emplace<Linear>("logits", config.hidden_units, 10);
  // Images reach the network as [batch, 28, 28, 1] (NHWC); 10 classes.
  return std::make_unique<Model>("lenet_small", psflow::Shape{28, 28, 1}, 10, std::move(net));
}

}  // namespace

int main(int argc, char** argv) {
  // Defaults used when the command line does not set --optimizer, --learning_rate, --batch_size
  // or --train_steps. --hidden_units (default 100) sets the width of fc1.
  psflow::nn::ModelDefaults defaults;
  defaults.optimizer = "adam";
  defaults.learning_rate = 0.002f;
  defaults.batch_size = 64;
  defaults.train_steps = 2000;
  // A setting of the model's own: --conv1_filters=N on any subcommand with --model=lenet_small,
  // listed by --help under "Model settings"; refused unless it is an integer in [1, 256].
  defaults.settings.push_back(
      {"conv1_filters", "8", "filters of lenet_small's first convolution", [](const std::string& v) {
         int n = 0;
         const bool ok = absl::SimpleAtoi(v, &n) && n >= 1 && n <= 256;
         return ok ? absl::OkStatus() : absl::InvalidArgumentError("an integer in 1..256");
       }});
  psflow::nn::RegisterModel("lenet_small", BuildLenetSmall, defaults);
  return psflow::cli::Main(argc, argv);
}
