// psflow/nn/layers.h — layers a C++ user assembles into a model (docs/custom-models.md); psflow's
// built-in models (src/nn/model.cc) use the same ones. A Layer owns its parameters as named leaf
// Vars (autodiff.h); Forward builds this step's graph on top of its input. Layers hold no per-step
// state; one Layer is used by one thread at a time, and replicas on several threads use separate
// Layer objects.
#ifndef PSFLOW_NN_LAYERS_H_
#define PSFLOW_NN_LAYERS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "psflow/core/autodiff.h"
#include "psflow/core/ops.h"
#include "psflow/core/random.h"

namespace psflow::nn {

// What a forward pass needs besides its input.
struct ForwardContext {
  bool training = false;
  Rng* rng = nullptr;  // borrowed; used by Dropout when training
  // Called by Sequential with each layer's parameters right before that layer's forward (a
  // worker waits there for the layer's values of a pull in forward order). Null: nothing.
  std::function<void(const std::vector<Var>& params)> before_layer;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual Var Forward(const Var& x, ForwardContext& ctx) = 0;
  // Appends this layer's parameters in creation order (weights before biases).
  virtual void CollectParameters(std::vector<Var>* /*out*/) const {}
};

// How a weight is initialized; the bias of Dense/Conv2D is a constant.
struct WeightInit {
  enum Kind { kTruncatedNormal, kGlorotUniform, kZeros } kind = kGlorotUniform;
  float stddev = 0.1f;  // truncated normal
  float bias = 0.0f;    // constant bias value
};

// The activation a layer applies to its output: kNone, kRelu, kTanh, kSigmoid or kGelu
// (psflow/core/ops.h says what each computes; kGelu is the tanh approximation).
using Activation = ops::Activation;

// y = activation(x·W + b), as one FusedMatMul. W [in, out] named NAME/weights, b [out] NAME/biases.
class Dense : public Layer {
 public:
  Dense(const std::string& name, int64_t in, int64_t out, WeightInit init, Activation activation, Rng& rng);
  Var Forward(const Var& x, ForwardContext& ctx) override;
  void CollectParameters(std::vector<Var>* out) const override;

 private:
  Var weights_, biases_;
  Activation activation_;
};

// 2-D convolution (NHWC, filter HWIO) + bias, optionally ReLU.
class Conv2D : public Layer {
 public:
  Conv2D(const std::string& name, int kernel, int64_t in_channels, int64_t out_channels, int stride,
         ops::Padding padding, WeightInit init, bool relu, Rng& rng);
  Var Forward(const Var& x, ForwardContext& ctx) override;
  void CollectParameters(std::vector<Var>* out) const override;

 private:
  Var filter_, biases_;
  int stride_;
  ops::Padding padding_;
  bool relu_;
};

class MaxPool : public Layer {
 public:
  MaxPool(int window, int stride, ops::Padding padding) : window_(window), stride_(stride), padding_(padding) {}
  Var Forward(const Var& x, ForwardContext& ctx) override;

 private:
  int window_, stride_;
  ops::Padding padding_;
};

class Dropout : public Layer {
 public:
  explicit Dropout(float rate) : rate_(rate) {}
  Var Forward(const Var& x, ForwardContext& ctx) override;

 private:
  float rate_;
};

class Flatten : public Layer {
 public:
  Var Forward(const Var& x, ForwardContext& /*ctx*/) override { return ops::Flatten(x); }
};

// Lookup of rows of a [vocab, dim] table by integer ids held in x (as floats, one id per row);
// the table gets a row-sparse gradient.
class Embedding : public Layer {
 public:
  Embedding(const std::string& name, int64_t vocab, int64_t dim, float stddev, Rng& rng);
  Var Forward(const Var& x, ForwardContext& ctx) override;
  void CollectParameters(std::vector<Var>* out) const override;

 private:
  Var table_;
};

// Layers applied in order; owns them.
class Sequential : public Layer {
 public:
  Sequential& Add(std::unique_ptr<Layer> layer);
  template <typename L, typename... Args>
  Sequential& Emplace(Args&&... args) {
    return Add(std::make_unique<L>(std::forward<Args>(args)...));
  }
  Var Forward(const Var& x, ForwardContext& ctx) override;
  void CollectParameters(std::vector<Var>* out) const override;

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace psflow::nn

#endif  // PSFLOW_NN_LAYERS_H_
