// ps/server/shard.h — one shard held by a ps task: its values, its optimizer state, and (sync mode) the
// sum of the current step's gradients (which pushes count, and when the mean is applied, is
// ps/server/sync_accumulator.h's). Each shard has its own mutex, so different shards update
// concurrently and there is no global lock on the push path.
//
// Values are held in a shared buffer so a pull can send them without a copy: a pull takes a
// snapshot (a reference to the current buffer) and gRPC reads it while the call is in flight; an
// update that finds the buffer still referenced by a pull copies it first (copy-on-write), so
// every pull sees one consistent version. That copy is bounded by a pull's part: a client pulls a
// ps task's shards bigger than a part (ps/client/call_parts.h) as runs, each answered with a copy of the
// run (CopySlice), so no pull holds a big shard's buffer.
#ifndef PSFLOW_PS_SERVER_SHARD_H_
#define PSFLOW_PS_SERVER_SHARD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "psflow/core/tensor.h"
#include "psflow/optim/optimizer.h"
#include "rpc/transport.h"

namespace psflow::ps {

class Shard;

// A validated gradient for one shard. Dense gradients stay in the received message and are read
// from it in place (a copy would cost a pass over memory); sparse ones are copied off the wire.
struct ShardGradient {
  Shard* shard = nullptr;
  const rpc::IncomingMessage* message = nullptr;  // borrowed; dense: tensor `index` of it
  int index = 0;
  bool sparse = false;
  std::vector<int64_t> rows;  // sparse: shard-local rows of axis 0
  FloatBuffer values;         // sparse: rows.size() x row_size()
  // A slice (part of an async push in parts): elements [offset, offset + count) of the shard,
  // from client `client_id` (its parts of one shard share one optimizer update).
  bool slice = false;
  int64_t offset = 0;
  int64_t count = 0;
  uint64_t client_id = 0;
  int worker = 0;  // sync: the pushing worker (the step sums its gradients in worker order)
};

class Shard {
 public:
  Shard(std::string name, Shape shape, FloatBuffer initial, optim::SlotState state);

  const std::string& name() const { return name_; }
  // The dtype its dense values travel in (--wire_dtype): pulls are answered in it and dense
  // gradients in another are refused. Set once, before the shard is shared.
  void set_wire_dtype(rpc::WireDtype dtype) { wire_dtype_ = dtype; }
  rpc::WireDtype wire_dtype() const { return wire_dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t size() const { return size_; }
  int64_t num_rows() const { return shape_.empty() ? 1 : shape_[0]; }
  int64_t row_size() const { return row_size_; }  // floats per row of axis 0

  // Checks that tensor i of `message` is a valid gradient for this shard — a dense tensor of the
  // shard's shape, or sparse rows of axis 0 within range with the shard's row shape, all finite —
  // and describes it in `out` (which borrows `message`).
  absl::Status DecodeGradient(const rpc::IncomingMessage& message, int i, ShardGradient* out);

  // The current values, shared (not copied) for sending.
  std::shared_ptr<const FloatBuffer> Snapshot() const;
  // The current values (shared) and a copy of the optimizer state, consistent with each other
  // (checkpoints).
  std::shared_ptr<const FloatBuffer> SnapshotWithState(optim::SlotState* state) const;
  // Copies elements [offset, offset + count) (validated by the caller: a pull in parts) to
  // out[0, count) and, `with_slots`, the same run of each optimizer slot after them (out holds
  // count x (1 + slots) floats), consistent with each other (a checkpoint in parts); returns the
  // update count. Copied, not shared: a shared run would keep the whole buffer alive, and an
  // update meanwhile would copy all of it.
  int64_t CopySlice(int64_t offset, int64_t count, bool with_slots, float* out) const;

  // Async: applies a decoded gradient with one optimizer update (sparse duplicates summed first).
  // The slices of one shard from one client, sent in order from offset 0 to the end, make one
  // update together: the first claims its t, the rest reuse it.
  void Apply(ShardGradient& gradient, const optim::Optimizer& optimizer, float lr);

  // Sync: keeps a copy of a decoded gradient of gradient.worker for this step (added to one
  // already kept for that worker).
  void Accumulate(const ShardGradient& gradient);
  // Sync, a push in parts (push as backward goes): keeps a part's gradient for gradient.worker
  // apart from the step's, tagged with the client and the step it was computed at (a part of
  // another push replaces what was staged), so that a push that ends up not counted (stale, a late
  // backup) adds nothing to the step.
  void Stage(const ShardGradient& gradient, int64_t step_tag);
  // Sync, the counted last part of that push: what `worker` staged as (client_id, step_tag) joins
  // the step's kept gradients, as if it had come with the last part; anything else it staged is
  // dropped.
  void CommitStaged(int worker, uint64_t client_id, int64_t step_tag);
  // Sync: sums the step's kept gradients in ascending worker order (so the bits do not depend on
  // the order pushes arrived in: the same seed gives the same model), applies the sum divided by
  // `count` (one optimizer update) and clears them; nothing when no gradient touched the shard.
  // Cost: one copy of each worker's gradient held until the step completes (R gradients instead
  // of one running sum) and one more pass over them.
  void ApplyAccumulated(int count, const optim::Optimizer& optimizer, float lr);

 private:
  // Apply() of a slice, under mu_ with `w` the mutable values.
  void ApplySliceLocked(const ShardGradient& gradient, const optim::Optimizer& optimizer, float lr, float* w)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The value buffer, copied first if a pull still references it.
  float* MutableValuesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sums duplicate rows (TF's optimizers deduplicate sparse gradients the same way).
  static void DeduplicateRows(std::vector<int64_t>* rows, FloatBuffer* values, int64_t row_size);

  const std::string name_;
  rpc::WireDtype wire_dtype_ = rpc::WireDtype::kFloat32;
  const Shape shape_;
  const int64_t size_;
  const int64_t row_size_;

  mutable absl::Mutex mu_;
  std::shared_ptr<FloatBuffer> values_ ABSL_GUARDED_BY(mu_);
  optim::SlotState state_ ABSL_GUARDED_BY(mu_);
  // Sync accumulator: all zero whenever nothing is accumulated. Sparse-only steps remember the
  // rows they touched so only those rows are applied and cleared.
  FloatBuffer accum_ ABSL_GUARDED_BY(mu_);
  bool accum_any_ ABSL_GUARDED_BY(mu_) = false;
  bool accum_dense_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<bool> row_touched_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> touched_rows_ ABSL_GUARDED_BY(mu_);
  // The step's gradients per worker, until ApplyAccumulated sums them in worker order. The
  // buffers stay allocated from step to step (a fresh big buffer per step costs its page faults).
  struct Kept {
    bool used = false;  // holds a gradient this step
    bool has_dense = false;
    FloatBuffer dense;          // size_ floats once a dense gradient came
    std::vector<int64_t> rows;  // sparse rows (shard-local), and their values
    FloatBuffer values;
  };
  std::map<int, Kept> kept_ ABSL_GUARDED_BY(mu_);
  // The parts of a sync push in progress, per worker, until its last part is counted.
  struct Staged {
    uint64_t client_id = 0;
    int64_t step_tag = 0;
    Kept kept;
  };
  std::map<int, Staged> staged_ ABSL_GUARDED_BY(mu_);
  // Adds `gradient` into `kept` (a copy, or a sum with what it holds).
  void KeepLocked(const ShardGradient& gradient, Kept* kept) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The update count (Adam's t) each client's slices in progress use, until its last slice.
  absl::flat_hash_map<uint64_t, int64_t> slice_update_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_SERVER_SHARD_H_
