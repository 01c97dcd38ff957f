#include "psflow/nn/layers.h"

#include "core/check.h"
#include "psflow/core/init.h"

namespace psflow::nn {
namespace {

Tensor InitWeight(const Shape& shape, const WeightInit& init, Rng& rng) {
  switch (init.kind) {
    case WeightInit::kTruncatedNormal:
      return init::TruncatedNormal(shape, init.stddev, rng);
    case WeightInit::kGlorotUniform:
      return init::GlorotUniform(shape, rng);
    case WeightInit::kZeros:
      break;
  }
  return init::Zeros(shape);
}

}  // namespace

Dense::Dense(const std::string& name, int64_t in, int64_t out, WeightInit init, Activation activation, Rng& rng)
    : weights_(MakeParameter(name + "/weights", InitWeight({in, out}, init, rng))),
      biases_(MakeParameter(name + "/biases", init::Constant({out}, init.bias))),
      activation_(activation) {}

Var Dense::Forward(const Var& x, ForwardContext&) { return ops::FusedMatMul(x, weights_, biases_, activation_); }

void Dense::CollectParameters(std::vector<Var>* out) const {
  out->push_back(weights_);
  out->push_back(biases_);
}

Conv2D::Conv2D(const std::string& name, int kernel, int64_t in_channels, int64_t out_channels, int stride,
               ops::Padding padding, WeightInit init, bool relu, Rng& rng)
    : filter_(MakeParameter(name + "/weights", InitWeight({kernel, kernel, in_channels, out_channels}, init, rng))),
      biases_(MakeParameter(name + "/biases", init::Constant({out_channels}, init.bias))),
      stride_(stride),
      padding_(padding),
      relu_(relu) {}

Var Conv2D::Forward(const Var& x, ForwardContext&) {
  return ops::FusedConv2D(x, filter_, biases_, stride_, stride_, padding_,
                          relu_ ? ops::Activation::kRelu : ops::Activation::kNone);
}

void Conv2D::CollectParameters(std::vector<Var>* out) const {
  out->push_back(filter_);
  out->push_back(biases_);
}

Var MaxPool::Forward(const Var& x, ForwardContext&) {
  return ops::MaxPool(x, window_, window_, stride_, stride_, padding_);
}

Var Dropout::Forward(const Var& x, ForwardContext& ctx) {
  if (!ctx.training || rate_ <= 0.0f) return x;
  CHECK(ctx.rng != nullptr) << "Dropout needs ForwardContext::rng when training";
  return ops::Dropout(x, rate_, /*training=*/true, *ctx.rng);
}

Embedding::Embedding(const std::string& name, int64_t vocab, int64_t dim, float stddev, Rng& rng)
    : table_(MakeParameter(name + "/embeddings", init::TruncatedNormal({vocab, dim}, stddev, rng))) {}

Var Embedding::Forward(const Var& x, ForwardContext&) {
  std::vector<int64_t> ids(x->value.size());
  for (int64_t i = 0; i < x->value.size(); ++i) ids[i] = static_cast<int64_t>(x->value[i]);
  return ops::EmbeddingLookup(table_, ids);
}

void Embedding::CollectParameters(std::vector<Var>* out) const { out->push_back(table_); }

Sequential& Sequential::Add(std::unique_ptr<Layer> layer) {
  layers_.push_back(std::move(layer));
  return *this;
}

Var Sequential::Forward(const Var& x, ForwardContext& ctx) {
  Var y = x;
  std::vector<Var> params;
  for (auto& layer : layers_) {
    if (ctx.before_layer) {
      params.clear();
      layer->CollectParameters(&params);
      if (!params.empty()) ctx.before_layer(params);
    }
    y = layer->Forward(y, ctx);
  }
  return y;
}

void Sequential::CollectParameters(std::vector<Var>* out) const {
  for (const auto& layer : layers_) layer->CollectParameters(out);
}

}  // namespace psflow::nn
