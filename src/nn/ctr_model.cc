// The DLRM-style CTR network (psflow/nn/ctr_model.h): dense layers as FusedMatMul on the model's
// parameters, embeddings gathered from the caller's unique rows, dot interactions, one logit.
#include "psflow/nn/ctr_model.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check.h"
#include "psflow/core/init.h"
#include "psflow/core/ops.h"

namespace psflow::nn {

absl::StatusOr<std::unique_ptr<CtrModel>> CtrModel::Create(const CtrModelConfig& config) {
  if (config.num_dense < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ctr model: num_dense=", config.num_dense, " must be >= 0"));
  }
  if (config.num_fields < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--ctr_fields=", config.num_fields, " must be at least 1"));
  }
  if (config.dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--ctr_dim=", config.dim, " must be at least 1"));
  }
  for (int64_t h : config.bottom_hidden) {
    if (h < 1)
      return absl::InvalidArgumentError(absl::StrCat("ctr model: a bottom hidden size is ", h, "; must be >= 1"));
  }
  for (int64_t h : config.top_hidden) {
    if (h < 1) return absl::InvalidArgumentError(absl::StrCat("ctr model: a top hidden size is ", h, "; must be >= 1"));
  }
  return std::unique_ptr<CtrModel>(new CtrModel(config));
}

CtrModel::CtrModel(CtrModelConfig config) : config_(std::move(config)) {
  Rng rng(Rng::Mix(config_.seed, 0xc7a));
  auto add_mlp = [&](const std::string& prefix, int64_t in, std::vector<int64_t> sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string name = absl::StrCat(prefix, "/", i);
      parameters_.push_back(MakeParameter(name + "/weights", init::GlorotUniform({in, sizes[i]}, rng)));
      parameters_.push_back(MakeParameter(name + "/biases", Tensor({sizes[i]}, 0.0f)));
      in = sizes[i];
    }
  };
  std::vector<int64_t> bottom = config_.bottom_hidden;
  bottom.push_back(config_.dim);
  // With no dense features the bottom MLP has no input: it is left out and the F embeddings interact.
  if (config_.num_dense > 0) add_mlp("bottom", config_.num_dense, bottom);
  const int64_t vectors = config_.num_fields + (config_.num_dense > 0 ? 1 : 0);
  const int64_t top_in = (config_.num_dense > 0 ? config_.dim : 0) + vectors * (vectors - 1) / 2;
  std::vector<int64_t> top = config_.top_hidden;
  top.push_back(1);
  add_mlp("top", top_in, top);
}

int64_t CtrModel::NumParameters() const {
  int64_t n = 0;
  for (const Var& p : parameters_) n += p->value.size();
  return n;
}

std::string CtrModel::TableName(int field) { return absl::StrFormat("field_%02d", field); }

Var CtrModel::LogitsWith(std::span<const Var> params, const float* dense, int64_t batch,
                         const std::vector<FieldRows>& fields) const {
  CHECK_EQ(params.size(), parameters_.size());
  CHECK_EQ(static_cast<int>(fields.size()), config_.num_fields);
  size_t next = 0;
  // Hidden layers ReLU; the top MLP's last layer is linear (the logit).
  auto mlp = [&](Var x, size_t layers, bool last_relu) {
    for (size_t i = 0; i < layers; ++i) {
      const Var& w = params[next++];
      const Var& b = params[next++];
      const bool relu = i + 1 < layers || last_relu;
      x = ops::FusedMatMul(x, w, b, relu ? ops::Activation::kRelu : ops::Activation::kNone);
    }
    return x;
  };
  std::vector<Var> vectors;
  Var bottom;
  if (config_.num_dense > 0) {
    Tensor x({batch, static_cast<int64_t>(config_.num_dense)},
             std::vector<float>(dense, dense + batch * config_.num_dense));
    bottom = mlp(Constant(std::move(x)), config_.bottom_hidden.size() + 1, /*last_relu=*/true);
    vectors.push_back(bottom);
  }
  for (const FieldRows& field : fields) {
    CHECK_EQ(static_cast<int64_t>(field.index.size()), batch);
    CHECK(field.rows->value.rank() == 2 && field.rows->value.dim(1) == config_.dim);
    vectors.push_back(ops::GatherRows(field.rows, field.index));
  }
  const int64_t n = static_cast<int64_t>(vectors.size());
  Var stacked = ops::Reshape(ops::Concat(vectors, 1), {batch, n, config_.dim});
  Var dots = ops::DotInteraction(stacked);
  Var top_in = config_.num_dense > 0 ? ops::Concat({bottom, dots}, 1) : dots;
  return mlp(top_in, config_.top_hidden.size() + 1, /*last_relu=*/false);
}

Var CtrModel::Loss(const Var& logits, std::span<const float> labels) {
  return ops::SigmoidCrossEntropy(logits, labels);
}

}  // namespace psflow::nn
