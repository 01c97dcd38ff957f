#include "programs/mnist/local_replicas.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <unordered_map>

#include "core/check.h"
#include "psflow/core/random.h"

namespace psflow::train {

absl::StatusOr<std::unique_ptr<LocalReplicas>> LocalReplicas::Create(const nn::ModelConfig& config, int num_replicas) {
  auto devices = MakeDevices("cpu", num_replicas);
  if (!devices.ok()) return devices.status();
  std::unique_ptr<LocalReplicas> set(new LocalReplicas());
  set->devices_ = std::move(devices).value();
  for (int i = 0; i < num_replicas; ++i) {
    auto model = nn::BuildModel(config);
    if (!model.ok()) return model.status();
    set->replicas_.push_back(std::move(model).value());
  }
  return set;
}

void LocalReplicas::SyncReplicaParameters() {
  const auto& master = replicas_[0]->parameters();
  for (size_t r = 1; r < replicas_.size(); ++r) {
    const auto& params = replicas_[r]->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      std::memcpy(params[i]->value.data(), master[i]->value.data(), master[i]->value.bytes());
    }
  }
}

namespace {

struct ReplicaOutput {
  double loss = 0, accuracy = 0;
};

ReplicaOutput RunReplica(nn::Model& model, const float* images, const int32_t* labels, int64_t batch, uint64_t seed,
                         const StepHooks* hooks = nullptr) {
  ZeroGrad(model.parameters());
  Rng rng(seed);
  nn::ForwardContext ctx{.training = true, .rng = &rng, .before_layer = nullptr};
  if (hooks != nullptr) ctx.before_layer = hooks->before_layer;
  Var logits = model.Logits(images, batch, ctx);
  Var loss = nn::Model::Loss(logits, std::span<const int32_t>(labels, batch));
  if (hooks != nullptr && hooks->gradient_ready && std::isfinite(loss->value[0])) {
    // Each parameter handed over as soon as its gradient is final (a diverged step hands over
    // nothing: the session refuses it whole).
    std::unordered_map<const Node*, int> index;
    const auto& params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i) index.emplace(params[i].get(), static_cast<int>(i));
    Backward(loss, [&](Node& leaf) {
      if (auto it = index.find(&leaf); it != index.end()) hooks->gradient_ready(it->second);
    });
  } else {
    Backward(loss);
  }
  return {loss->value[0], ops::Accuracy(logits->value, std::span<const int32_t>(labels, batch))};
}

// Adds weight * src into dst, a row-sparse gradient kept as row -> values.
void AddSparse(const RowSparse& src, float weight, int64_t row_size, std::map<int64_t, std::vector<float>>* dst) {
  for (size_t i = 0; i < src.rows.size(); ++i) {
    auto& row = (*dst)[src.rows[i]];
    row.resize(row_size, 0.0f);
    const float* v = src.values.data() + i * row_size;
    for (int64_t j = 0; j < row_size; ++j) row[j] += weight * v[j];
  }
}

}  // namespace

StepStats LocalReplicas::ComputeGradients(const float* images, const int32_t* labels, int64_t batch, uint64_t step_seed,
                                          const StepHooks& hooks) {
  const int k = std::min<int>(size(), static_cast<int>(batch));
  if (k <= 1) {
    ReplicaOutput out = RunReplica(*replicas_[0], images, labels, batch, step_seed, &hooks);
    return {out.loss, out.accuracy};
  }
  SyncReplicaParameters();
  const int64_t example_size = NumElements(replicas_[0]->example_shape());
  std::vector<ReplicaOutput> outputs(k);
  std::vector<int64_t> begin(k + 1);
  for (int r = 0; r <= k; ++r) begin[r] = batch * r / k;
  for (int r = 0; r < k; ++r) {
    devices_[r]->Run([&, r] {
      outputs[r] = RunReplica(*replicas_[r], images + begin[r] * example_size, labels + begin[r],
                              begin[r + 1] - begin[r], Rng::Mix(step_seed, r));
    });
  }
  for (int r = 0; r < k; ++r) devices_[r]->Wait();

  // Each replica's gradient is a mean over its slice; weight by slice size to get the batch mean.
  StepStats stats;
  const auto& master = replicas_[0]->parameters();
  for (size_t i = 0; i < master.size(); ++i) {
    Node& p = *master[i];
    const float w0 = float(begin[1] - begin[0]) / batch;
    const int64_t row_size = p.value.rank() > 0 && p.value.dim(0) > 0 ? p.value.size() / p.value.dim(0) : 1;
    if (!p.grad.empty()) {
      for (float& g : p.grad.span()) g *= w0;
    }
    std::map<int64_t, std::vector<float>> sparse;
    if (p.sparse_grad) AddSparse(*p.sparse_grad, w0, row_size, &sparse);
    for (int r = 1; r < k; ++r) {
      const Node& q = *replicas_[r]->parameters()[i];
      const float w = float(begin[r + 1] - begin[r]) / batch;
      if (!q.grad.empty()) {
        float* dst = p.MutableGrad().data();
        const float* src = q.grad.data();
        for (int64_t j = 0; j < p.value.size(); ++j) dst[j] += w * src[j];
      }
      if (q.sparse_grad) AddSparse(*q.sparse_grad, w, row_size, &sparse);
    }
    if (!sparse.empty()) {
      RowSparse merged;
      Shape shape = p.value.shape();
      shape[0] = static_cast<int64_t>(sparse.size());
      merged.values = Tensor(shape);
      int64_t at = 0;
      for (auto& [row, values] : sparse) {
        merged.rows.push_back(row);
        std::memcpy(merged.values.data() + at++ * row_size, values.data(), row_size * sizeof(float));
      }
      p.sparse_grad = std::move(merged);
    }
  }
  for (int r = 0; r < k; ++r) {
    const double w = double(begin[r + 1] - begin[r]) / batch;
    stats.loss += w * outputs[r].loss;
    stats.accuracy += w * outputs[r].accuracy;
  }
  return stats;
}

}  // namespace psflow::train
