// programs/mnist/local_replicas.h — K replicas of one model on K devices computing one step's
// gradient together: each takes a contiguous slice of the batch, and their gradients are averaged
// (weighted by slice size, so the result equals one replica on the whole batch). With K = 1 this
// is plain forward/backward. Owns the replicas and devices; used by one training thread.
#ifndef PSFLOW_PROGRAMS_MNIST_LOCAL_REPLICAS_H_
#define PSFLOW_PROGRAMS_MNIST_LOCAL_REPLICAS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "programs/mnist/device.h"
#include "psflow/nn/model.h"

namespace psflow::train {

struct StepStats {
  double loss = 0;
  double accuracy = 0;  // on the batch
};

// What a worker does while one replica computes (push as backward goes, pull in forward order).
struct StepHooks {
  // Parameter i (of parameters()) has its final gradient for this step.
  std::function<void(int index)> gradient_ready;
  // Before a layer's forward, with its parameters (nn::ForwardContext::before_layer).
  std::function<void(const std::vector<Var>& params)> before_layer;
};

class LocalReplicas {
 public:
  // Builds `num_replicas` identical models (same seed) on as many CPU devices.
  static absl::StatusOr<std::unique_ptr<LocalReplicas>> Create(const nn::ModelConfig& config, int num_replicas);

  // The parameters of replica 0: the master copy that is pulled into, pushed from, updated.
  const std::vector<Var>& parameters() const { return replicas_[0]->parameters(); }
  nn::Model& model() { return *replicas_[0]; }
  int size() const { return static_cast<int>(replicas_.size()); }

  // Forward/backward on `batch` examples; afterwards parameters()[i]->grad (or sparse_grad) hold
  // the mean gradient over the batch. `step_seed` seeds dropout deterministically.
  // With K = 1 the hooks run during the forward and backward (with K > 1 they are not called: the
  // replicas' gradients are final only once averaged).
  StepStats ComputeGradients(const float* images, const int32_t* labels, int64_t batch, uint64_t step_seed,
                             const StepHooks& hooks = {});

 private:
  LocalReplicas() = default;
  void SyncReplicaParameters();  // copies replica 0's values into the others

  std::vector<std::unique_ptr<nn::Model>> replicas_;
  std::vector<std::unique_ptr<Device>> devices_;
};

}  // namespace psflow::train

#endif  // PSFLOW_PROGRAMS_MNIST_LOCAL_REPLICAS_H_
