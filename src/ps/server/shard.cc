#include "ps/server/shard.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/simd_dispatch.h"
#include "psflow/core/threading.h"

namespace psflow::ps {
namespace {

// Shards from this many floats (1 MiB) on are checked and updated by several threads; below it,
// handing work to threads costs more than it saves.
constexpr int64_t kParallelMinFloats = int64_t{1} << 18;

std::string ShapeOf(const wire::TensorMeta& meta) {
  return ShapeToString(Shape(meta.shape().begin(), meta.shape().end()));
}

// Index of the first Inf or NaN in v[0, n), or -1.
int64_t FirstNonFinite(const float* v, int64_t n) {
  if (!simd::AnyNonFinite(v, n)) return -1;  // look for the culprit only when there is one
  for (int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(v[j])) return j;
  }
  return -1;
}

}  // namespace

Shard::Shard(std::string name, Shape shape, FloatBuffer initial, optim::SlotState state)
    : name_(std::move(name)),
      shape_(std::move(shape)),
      size_(NumElements(shape_)),
      row_size_(shape_.empty() ? 1 : (shape_[0] == 0 ? 0 : size_ / shape_[0])),
      values_(std::make_shared<FloatBuffer>(std::move(initial))),
      state_(std::move(state)) {
  CHECK_EQ(static_cast<int64_t>(values_->size()), size_);
}

absl::Status Shard::DecodeGradient(const rpc::IncomingMessage& message, int i, ShardGradient* out) {
  const wire::TensorMeta& meta = message.meta(i);
  if (!meta.sparse() && message.dtype(i) != wire_dtype_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient for '", name_, "' is ", rpc::WireDtypeName(message.dtype(i)), " but this ps exchanges ",
        rpc::WireDtypeName(wire_dtype_), " (the chief's --wire_dtype): start every task with the same --wire_dtype"));
  }
  if (meta.slice()) {
    const int64_t n = meta.shape_size() == 1 ? meta.shape(0) : -1;
    if (meta.sparse() || n < 1 || meta.slice_offset() < 0 || meta.slice_offset() > size_ - n) {
      return absl::InvalidArgumentError(absl::StrCat("slice of '", name_, "' at element ", meta.slice_offset(),
                                                     " with shape ", ShapeOf(meta), " does not fit the shard's ", size_,
                                                     " elements"));
    }
    out->slice = true;
    out->offset = meta.slice_offset();
    out->count = n;
  } else if (!meta.sparse()) {
    const Shape got(meta.shape().begin(), meta.shape().end());
    if (got != shape_) {
      return absl::InvalidArgumentError(absl::StrCat("gradient for '", name_, "' has shape ", ShapeToString(got),
                                                     " but the shard is ", ShapeToString(shape_)));
    }
  } else {
    if (shape_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sparse gradient for scalar '", name_, "': scalars have no rows"));
    }
    const bool row_shape_ok = meta.shape_size() == static_cast<int>(shape_.size()) &&
                              std::equal(shape_.begin() + 1, shape_.end(), meta.shape().begin() + 1);
    if (!row_shape_ok) {
      return absl::InvalidArgumentError(absl::StrCat("sparse gradient for '", name_, "' has shape ", ShapeOf(meta),
                                                     " but rows of the shard ", ShapeToString(shape_), " have shape ",
                                                     ShapeToString(Shape(shape_.begin() + 1, shape_.end()))));
    }
    for (int64_t r : meta.rows()) {
      if (r < 0 || r >= shape_[0]) {
        return absl::InvalidArgumentError(absl::StrCat("sparse gradient for '", name_, "' touches row ", r,
                                                       " but the shard has rows 0..", shape_[0] - 1));
      }
    }
  }
  out->shard = this;
  out->message = &message;
  out->index = i;
  out->sparse = meta.sparse();
  int64_t bad = -1;
  if (out->sparse) {
    out->rows.assign(meta.rows().begin(), meta.rows().end());
    out->values.resize(static_cast<size_t>(message.num_floats(i)));
    message.CopyTo(i, out->values.data());
    bad = FirstNonFinite(out->values.data(), static_cast<int64_t>(out->values.size()));
  } else {
    std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};
    ParallelFor(message.num_floats(i), kParallelMinFloats, [&](int64_t begin, int64_t end) {
      const int64_t at = message.FirstNonFinite(i, begin, end - begin);
      if (at < 0) return;
      int64_t seen = first_bad.load();
      while (at < seen && !first_bad.compare_exchange_weak(seen, at)) {
      }
    });
    if (first_bad.load() != std::numeric_limits<int64_t>::max()) bad = first_bad.load();
  }
  if (bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("gradient for '", name_, "' has a NaN or Inf at element ", bad,
                                                   " (diverged? lower the learning rate)"));
  }
  return absl::OkStatus();
}

std::shared_ptr<const FloatBuffer> Shard::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return values_;
}

std::shared_ptr<const FloatBuffer> Shard::SnapshotWithState(optim::SlotState* state) const {
  absl::MutexLock lock(&mu_);
  *state = state_;  // copied: slots change in place, unlike the copy-on-write values
  return values_;
}

int64_t Shard::CopySlice(int64_t offset, int64_t count, bool with_slots, float* out) const {
  CHECK(offset >= 0 && count >= 0 && offset + count <= size_);
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  absl::MutexLock lock(&mu_);
  std::memcpy(out, values_->data() + offset, bytes);
  if (with_slots) {
    float* dst = out + count;
    for (const FloatBuffer& slot : state_.slots) {
      std::memcpy(dst, slot.data() + offset, bytes);
      dst += count;
    }
  }
  return state_.updates;
}

float* Shard::MutableValuesLocked() {
  if (values_.use_count() > 1) {
    // A pull is still sending this version: write into a copy.
    values_ = std::make_shared<FloatBuffer>(*values_);
  } else {
    // Pairs with the release in the last pull's reference drop, so its reads happen before our writes.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  return values_->data();
}

void Shard::DeduplicateRows(std::vector<int64_t>* rows, FloatBuffer* values, int64_t row_size) {
  if (std::is_sorted(rows->begin(), rows->end()) && std::adjacent_find(rows->begin(), rows->end()) == rows->end()) {
    return;
  }
  std::vector<size_t> order(rows->size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [rows](size_t a, size_t b) { return (*rows)[a] < (*rows)[b]; });
  std::vector<int64_t> unique_rows;
  FloatBuffer summed;
  for (size_t k : order) {
    const float* src = values->data() + k * row_size;
    if (unique_rows.empty() || unique_rows.back() != (*rows)[k]) {
      unique_rows.push_back((*rows)[k]);
      summed.insert(summed.end(), src, src + row_size);
    } else {
      float* dst = summed.data() + (unique_rows.size() - 1) * row_size;
      for (int64_t j = 0; j < row_size; ++j) dst[j] += src[j];
    }
  }
  *rows = std::move(unique_rows);
  *values = std::move(summed);
}

void Shard::Apply(ShardGradient& gradient, const optim::Optimizer& optimizer, float lr) {
  if (gradient.sparse) {
    DeduplicateRows(&gradient.rows, &gradient.values, row_size_);
    absl::MutexLock lock(&mu_);
    FlushDenormalsOnThisThread();  // the floating-point mode the training ops run the optimizer in
    optimizer.ApplySparse(MutableValuesLocked(), gradient.rows, gradient.values.data(), row_size_, state_, lr);
    return;
  }
  absl::MutexLock lock(&mu_);
  float* w = MutableValuesLocked();
  if (gradient.slice) return ApplySliceLocked(gradient, optimizer, lr, w);
  // Optimizer::ApplyDense, fed straight from the received bytes run by run (the update is
  // element-wise, so ranges are independent), read where they were received whatever their
  // alignment (ApplyFromBytes): no copy of the gradient.
  // Disjoint ranges may be updated by several threads (optim::Optimizer::Apply allows it).
  const int64_t t = state_.updates + 1;
  // The blocks run on pool threads while this thread holds mu_ (ParallelFor returns when all ran).
  ParallelFor(size_, kParallelMinFloats, [&](int64_t begin, int64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FlushDenormalsOnThisThread();  // the floating-point mode the training ops run the optimizer in
    gradient.message->ForEachByteRunInRange(gradient.index, begin, end - begin,
                                            [&](const void* run, int64_t first, int64_t n)
                                                ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                                  optimizer.ApplyFromBytes(w, run, state_, first, n, lr, t);
                                                  return true;
                                                });
  });
  ++state_.updates;
}

void Shard::ApplySliceLocked(const ShardGradient& gradient, const optim::Optimizer& optimizer, float lr, float* w) {
  // The client's first slice of this shard claims the update (t); its later slices reuse it, so
  // the shard steps once per push however it was cut. (A checkpoint taken between two slices
  // sees part of the update, as with any async push of several shards.)
  auto it = slice_update_.find(gradient.client_id);
  if (gradient.offset == 0 || it == slice_update_.end()) {
    it = slice_update_.insert_or_assign(gradient.client_id, ++state_.updates).first;
  }
  const int64_t t = it->second;
  if (gradient.offset + gradient.count == size_) slice_update_.erase(it);
  ParallelFor(gradient.count, kParallelMinFloats, [&](int64_t begin, int64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FlushDenormalsOnThisThread();
    gradient.message->ForEachByteRunInRange(
        gradient.index, begin, end - begin,
        [&](const void* run, int64_t first, int64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          optimizer.ApplyFromBytes(w, run, state_, gradient.offset + first, n, lr, t);
          return true;
        });
  });
}

void Shard::Accumulate(const ShardGradient& gradient) {
  absl::MutexLock lock(&mu_);
  KeepLocked(gradient, &kept_[gradient.worker]);
}

void Shard::Stage(const ShardGradient& gradient, int64_t step_tag) {
  absl::MutexLock lock(&mu_);
  Staged& staged = staged_[gradient.worker];
  if (staged.client_id != gradient.client_id || staged.step_tag != step_tag) {
    staged.client_id = gradient.client_id;
    staged.step_tag = step_tag;
    staged.kept.used = staged.kept.has_dense = false;
    staged.kept.rows.clear();
    staged.kept.values.clear();
  }
  KeepLocked(gradient, &staged.kept);
}

void Shard::CommitStaged(int worker, uint64_t client_id, int64_t step_tag) {
  absl::MutexLock lock(&mu_);
  auto it = staged_.find(worker);
  if (it == staged_.end() || !it->second.kept.used) return;
  Kept& staged = it->second.kept;
  if (it->second.client_id == client_id && it->second.step_tag == step_tag) {
    Kept& kept = kept_[worker];
    if (!kept.used) {
      std::swap(kept, staged);  // the buffers trade places: no copy, none freed
    } else {
      if (staged.has_dense) {
        if (!kept.has_dense) {
          kept.dense.swap(staged.dense);
          kept.has_dense = true;
        } else {
          simd::AddInto(kept.dense.data(), staged.dense.data(), size_);
        }
      }
      kept.rows.insert(kept.rows.end(), staged.rows.begin(), staged.rows.end());
      kept.values.insert(kept.values.end(), staged.values.begin(), staged.values.end());
    }
  }
  staged.used = staged.has_dense = false;
  staged.rows.clear();
  staged.values.clear();
}

void Shard::KeepLocked(const ShardGradient& gradient, Kept* kept_ptr) {
  Kept& kept = *kept_ptr;
  kept.used = true;
  if (!gradient.sparse) {
    const bool first = !kept.has_dense;
    kept.has_dense = true;
    if (kept.dense.size() != static_cast<size_t>(size_)) kept.dense.resize(static_cast<size_t>(size_));
    float* dst = kept.dense.data();
    ParallelFor(size_, kParallelMinFloats, [&](int64_t begin, int64_t end) {
      if (first) return gradient.message->CopyRange(gradient.index, begin, end - begin, dst + begin);
      gradient.message->ForEachByteRunInRange(gradient.index, begin, end - begin,
                                              [dst](const void* run, int64_t at, int64_t n) {
                                                simd::AddFromBytes(dst + at, run, n);  // dispatched
                                                return true;
                                              });
    });
    return;
  }
  kept.rows.insert(kept.rows.end(), gradient.rows.begin(), gradient.rows.end());
  kept.values.insert(kept.values.end(), gradient.values.begin(), gradient.values.end());
}

void Shard::ApplyAccumulated(int count, const optim::Optimizer& optimizer, float lr) {
  absl::MutexLock lock(&mu_);
  // The kept gradients summed in ascending worker order (std::map's order).
  for (auto& [worker, kept] : kept_) {
    if (!kept.used) continue;
    if (accum_.empty() && size_ > 0) accum_.assign(static_cast<size_t>(size_), 0.0f);
    accum_any_ = true;
    if (kept.has_dense) {
      accum_dense_ = true;
      float* accum = accum_.data();
      const float* src = kept.dense.data();
      ParallelFor(size_, kParallelMinFloats, [&](int64_t begin, int64_t end) {
        simd::AddInto(accum + begin, src + begin, end - begin);  // dispatched
      });
    }
    kept.used = kept.has_dense = false;
    if (kept.rows.empty()) continue;
    if (row_touched_.empty()) row_touched_.assign(static_cast<size_t>(num_rows()), false);
    for (size_t k = 0; k < kept.rows.size(); ++k) {
      const int64_t row = kept.rows[k];
      float* dst = accum_.data() + row * row_size_;
      const float* values = kept.values.data() + static_cast<int64_t>(k) * row_size_;
      for (int64_t j = 0; j < row_size_; ++j) dst[j] += values[j];
      if (!row_touched_[row]) {
        row_touched_[row] = true;
        touched_rows_.push_back(row);
      }
    }
  }
  for (auto& [worker, kept] : kept_) kept.rows.clear(), kept.values.clear();
  if (!accum_any_) return;
  const float scale = 1.0f / static_cast<float>(std::max(count, 1));
  float* w = MutableValuesLocked();
  if (accum_dense_) {
    // Optimizer::ApplyDense on the mean, over disjoint ranges in parallel.
    const int64_t t = state_.updates + 1;
    float* accum = accum_.data();
    // The blocks run on pool threads while this thread holds mu_ (ParallelFor returns when all ran).
    ParallelFor(size_, kParallelMinFloats, [&](int64_t begin, int64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      FlushDenormalsOnThisThread();
      simd::Scale(accum + begin, end - begin, scale);  // dispatched
      optimizer.Apply(w, accum + begin, state_, begin, end - begin, lr, t);
      std::fill(accum + begin, accum + end, 0.0f);
    });
    ++state_.updates;
  } else {
    FlushDenormalsOnThisThread();
    std::sort(touched_rows_.begin(), touched_rows_.end());
    FloatBuffer mean(touched_rows_.size() * static_cast<size_t>(row_size_));
    for (size_t k = 0; k < touched_rows_.size(); ++k) {
      float* row = accum_.data() + touched_rows_[k] * row_size_;
      for (int64_t j = 0; j < row_size_; ++j) {
        mean[k * row_size_ + j] = row[j] * scale;
        row[j] = 0.0f;
      }
    }
    optimizer.ApplySparse(w, touched_rows_, mean.data(), row_size_, state_, lr);
  }
  for (int64_t row : touched_rows_) row_touched_[row] = false;
  touched_rows_.clear();
  accum_any_ = false;
  accum_dense_ = false;
}

}  // namespace psflow::ps
