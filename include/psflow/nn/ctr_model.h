// psflow/nn/ctr_model.h — the DLRM-style click-through-rate network: a bottom MLP
// over the D dense features down to dim k, one embedding of dim k per categorical field, the
// pairwise dot products of those F + 1 vectors (ops::DotInteraction), and a top MLP over
// [bottom output, dots] to one logit; the loss is the sigmoid cross-entropy.
//
// The network holds its dense layers only. The embeddings live in tables (on the ps tasks, or
// in-process for single-process training); per step the caller hands each field's *unique* rows
// as a leaf Var [U_f, k] and, per example, the index of its row among them. The forward gathers
// them (ops::GatherRows), so after Backward each leaf's `grad` [U_f, k] is the gradient of each
// unique id, summed over the examples holding it: what a table's sparse update takes.
//
// A CtrModel owns its dense parameters; one thread uses it at a time. Dedup (psflow/core/unique_ids.h) is a pure
// function.
#ifndef PSFLOW_NN_CTR_MODEL_H_
#define PSFLOW_NN_CTR_MODEL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/core/autodiff.h"
#include "psflow/core/random.h"
#include "psflow/core/unique_ids.h"

namespace psflow::nn {

struct CtrModelConfig {
  int num_dense = 13;                           // D
  int num_fields = 26;                          // F
  int64_t dim = 16;                             // k: the embeddings' and the bottom MLP's output dim
  std::vector<int64_t> bottom_hidden = {64};    // hidden layers of the bottom MLP (then k, ReLU)
  std::vector<int64_t> top_hidden = {128, 64};  // hidden layers of the top MLP (then 1 logit)
  uint64_t seed = 0;                            // initial values of the dense layers
};

// One field's embedding input for a batch: its unique rows [U, k] and, per example, the row's
// position among them (in [0, U)).
struct FieldRows {
  Var rows;
  std::span<const int64_t> index;
};

// Moved to psflow/core/unique_ids.h (the worker session dedups a lookup's ids without the nn
// library); these names stay for one release.
using UniqueIds [[deprecated("use psflow::UniqueIds (psflow/core/unique_ids.h)")]] = psflow::UniqueIds;
[[deprecated("use psflow::DedupIds (psflow/core/unique_ids.h)")]] inline void DedupIds(const int64_t* ids,
                                                                                       int64_t count, int64_t stride,
                                                                                       psflow::UniqueIds* out) {
  psflow::DedupIds(ids, count, stride, out);
}

class CtrModel {
 public:
  // InvalidArgument naming the field of `config` out of range (num_dense >= 0, num_fields >= 1,
  // dim >= 1, hidden sizes >= 1).
  static absl::StatusOr<std::unique_ptr<CtrModel>> Create(const CtrModelConfig& config);

  const CtrModelConfig& config() const { return config_; }
  // The dense parameters in creation order: bottom/I/weights, bottom/I/biases, ..., then top/I/....
  const std::vector<Var>& parameters() const { return parameters_; }
  int64_t NumParameters() const;
  // The table name of field f ("field_07").
  static std::string TableName(int field);

  // Logits [batch, 1] for dense features [batch, D] (row-major) and one FieldRows per field.
  Var Logits(const float* dense, int64_t batch, const std::vector<FieldRows>& fields) const {
    return LogitsWith(parameters_, dense, batch, fields);
  }
  // The same network with `params` (shaped as parameters()) in place of the model's own: for
  // gradient checks and for replicas that hold the parameters elsewhere.
  Var LogitsWith(std::span<const Var> params, const float* dense, int64_t batch,
                 const std::vector<FieldRows>& fields) const;
  // Mean sigmoid cross-entropy of the logits against labels (0 or 1).
  static Var Loss(const Var& logits, std::span<const float> labels);

 private:
  explicit CtrModel(CtrModelConfig config);

  CtrModelConfig config_;
  std::vector<Var> parameters_;
};

}  // namespace psflow::nn

#endif  // PSFLOW_NN_CTR_MODEL_H_
