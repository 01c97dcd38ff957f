#include "ps/client/routing.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/simd_dispatch.h"
#include "psflow/core/threading.h"

namespace psflow::ps {

int64_t InnerSize(const Shape& shape, int axis) {
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  return inner;
}

namespace {

void SetShape(wire::TensorMeta* meta, const Shape& shape) {
  meta->clear_shape();
  for (int64_t d : shape) meta->add_shape(d);
}

bool Contiguous(const Tensor& full, const dist::ShardSpec& shard) {
  if (full.rank() == 0 || shard.num_shards == 1 || shard.axis == 0) return true;
  // Split along an inner axis: contiguous only when every outer dim is 1.
  for (int d = 0; d < shard.axis; ++d) {
    if (full.dim(d) != 1) return false;
  }
  return true;
}

}  // namespace

rpc::OutgoingTensor ShardOf(const Tensor& full, const dist::ShardSpec& shard) {
  rpc::OutgoingTensor t;
  t.meta.set_name(shard.name);
  SetShape(&t.meta, shard.shape);
  t.num_floats = NumElements(shard.shape);
  if (Contiguous(full, shard)) {
    const int64_t start = full.rank() == 0 ? 0 : shard.offset * InnerSize(full.shape(), shard.axis);
    t.data = full.data() + start;
    return t;
  }
  auto part = std::make_shared<Tensor>(full.Slice(shard.axis, shard.offset, shard.offset + shard.shape[shard.axis]));
  t.data = part->data();
  t.owner = std::move(part);
  return t;
}

absl::Status AssembleShard(const rpc::IncomingMessage& message, int i, const dist::ShardSpec& shard, int64_t offset,
                           int64_t count, Tensor* full) {
  const wire::TensorMeta& meta = message.meta(i);
  const int64_t size = NumElements(shard.shape);
  const bool whole = offset == 0 && count == size;
  const Shape got(meta.shape().begin(), meta.shape().end());
  // A whole shard comes with its shape; a run (a pull in parts) as a slice at its offset.
  const bool fits = meta.name() == shard.name && !meta.sparse() && message.num_floats(i) == count &&
                    (meta.slice() ? meta.slice_offset() == offset && offset >= 0 && offset + count <= size
                                  : whole && got == shard.shape);
  if (!fits) {
    return absl::DataLossError(absl::StrCat(
        "expected ", whole ? "" : absl::StrCat("elements ", offset, "..", offset + count, " of "), "shard '",
        shard.name, "' ", ShapeToString(shard.shape), " but received '", meta.name(), "' ",
        meta.slice() ? absl::StrCat("elements ", meta.slice_offset(), "..", meta.slice_offset() + message.num_floats(i))
                     : ShapeToString(got),
        " (does the ps hold a different model?)"));
  }
  if (full->rank() == 0) {
    message.CopyTo(i, full->data());
    return absl::OkStatus();
  }
  const int64_t inner = InnerSize(full->shape(), shard.axis);
  float* start = full->data() + shard.offset * inner;
  if (Contiguous(*full, shard)) {
    // Large runs are copied by several threads (the copy is the receiver's one pass over them).
    ParallelFor(count, int64_t{1} << 18,
                [&](int64_t begin, int64_t end) { message.CopyRange(i, begin, end - begin, start + offset + begin); });
    return absl::OkStatus();
  }
  const int64_t row = shard.shape[shard.axis] * inner;  // the shard's floats per outer index
  const int64_t stride = full->dim(shard.axis) * inner;
  if (whole) {
    message.CopyStrided(i, start, row, stride);
    return absl::OkStatus();
  }
  // Split along an inner axis: the shard's rows lie `stride` floats apart in the full tensor, and
  // a run may start and end inside a row.
  for (int64_t e = offset; e < offset + count;) {
    const int64_t n = std::min(row - e % row, offset + count - e);
    message.CopyRange(i, e - offset, n, start + (e / row) * stride + e % row);
    e += n;
  }
  return absl::OkStatus();
}

absl::Status ValidateSparse(const RowSparse& sparse, const dist::VariableSpec& variable) {
  if (variable.shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("sparse gradient for scalar variable '", variable.name, "'"));
  }
  const Shape& v = sparse.values.shape();
  Shape expected = variable.shape;
  expected[0] = static_cast<int64_t>(sparse.rows.size());
  if (v != expected) {
    return absl::InvalidArgumentError(absl::StrCat("sparse gradient for '", variable.name, "' has values ",
                                                   ShapeToString(v), " for ", sparse.rows.size(), " rows; expected ",
                                                   ShapeToString(expected)));
  }
  for (int64_t r : sparse.rows) {
    if (r < 0 || r >= variable.shape[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse gradient for '", variable.name, "' touches row ", r, " of ", variable.shape[0]));
    }
  }
  return absl::OkStatus();
}

std::vector<std::pair<int, rpc::OutgoingTensor>> RouteSparse(const RowSparse& sparse,
                                                             const std::vector<dist::ShardSpec>& shards) {
  std::vector<std::pair<int, rpc::OutgoingTensor>> out;
  const int64_t k = static_cast<int64_t>(sparse.rows.size());
  if (k == 0) return out;
  const Shape& vshape = sparse.values.shape();
  const int64_t row_size = k == 0 ? 0 : sparse.values.size() / k;
  if (shards.size() == 1 || shards[0].axis != 0) {
    for (size_t s = 0; s < shards.size(); ++s) {
      const dist::ShardSpec& shard = shards[s];
      rpc::OutgoingTensor t;
      t.meta.set_name(shard.name);
      t.meta.set_sparse(true);
      for (int64_t r : sparse.rows) t.meta.add_rows(r);
      if (shards.size() == 1) {
        SetShape(&t.meta, vshape);
        t.data = sparse.values.data();
        t.num_floats = sparse.values.size();
      } else {
        auto part = std::make_shared<Tensor>(
            sparse.values.Slice(shard.axis, shard.offset, shard.offset + shard.shape[shard.axis]));
        SetShape(&t.meta, part->shape());
        t.data = part->data();
        t.num_floats = part->size();
        t.owner = std::move(part);
      }
      out.emplace_back(static_cast<int>(s), std::move(t));
    }
    return out;
  }
  // Split along axis 0: each row goes to the shard whose range holds it, with a shard-local index.
  std::vector<std::vector<int64_t>> picks(shards.size());
  for (int64_t j = 0; j < k; ++j) {
    const int64_t r = sparse.rows[j];
    size_t s = 0;
    while (s + 1 < shards.size() && r >= shards[s + 1].offset) ++s;  // shards are few
    picks[s].push_back(j);
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    if (picks[s].empty()) continue;
    const dist::ShardSpec& shard = shards[s];
    rpc::OutgoingTensor t;
    t.meta.set_name(shard.name);
    t.meta.set_sparse(true);
    Shape part_shape = vshape;
    part_shape[0] = static_cast<int64_t>(picks[s].size());
    SetShape(&t.meta, part_shape);
    for (int64_t j : picks[s]) t.meta.add_rows(sparse.rows[j] - shard.offset);
    if (static_cast<int64_t>(picks[s].size()) == k) {
      t.data = sparse.values.data();  // every row in this shard: send in place
    } else {
      auto values = std::make_shared<FloatBuffer>(picks[s].size() * static_cast<size_t>(row_size));
      for (size_t q = 0; q < picks[s].size(); ++q) {
        std::memcpy(values->data() + q * row_size, sparse.values.data() + picks[s][q] * row_size,
                    static_cast<size_t>(row_size) * sizeof(float));
      }
      t.data = values->data();
      t.owner = std::move(values);
    }
    t.num_floats = static_cast<int64_t>(picks[s].size()) * row_size;
    out.emplace_back(static_cast<int>(s), std::move(t));
  }
  return out;
}

absl::Status CheckFinite(const std::string& variable, const Tensor* dense, const RowSparse* sparse) {
  for (const Tensor* t : {dense, sparse ? &sparse->values : nullptr}) {
    if (t == nullptr) continue;
    const float* v = t->data();
    const int64_t n = t->size();
    // The culprit looked for only when there is one.
    if (!simd::AnyNonFinite(v, n)) continue;
    for (int64_t j = 0; j < n; ++j) {
      if (!std::isfinite(v[j])) {
        return absl::InvalidArgumentError(absl::StrCat(t == dense ? "gradient" : "sparse gradient values", " for '",
                                                       variable, "' have a NaN or Inf at element ", j,
                                                       " (diverged? lower the learning rate)"));
      }
    }
  }
  return absl::OkStatus();
}

Tensor Densify(const Tensor* dense, const RowSparse& sparse, const Shape& shape) {
  Tensor sum = dense != nullptr ? *dense : Tensor(shape);
  const int64_t k = static_cast<int64_t>(sparse.rows.size());
  const int64_t row_size = k == 0 ? 0 : sparse.values.size() / k;
  for (int64_t j = 0; j < k; ++j) {
    float* dst = sum.data() + sparse.rows[j] * row_size;
    const float* src = sparse.values.data() + j * row_size;
    for (int64_t c = 0; c < row_size; ++c) dst[c] += src[c];
  }
  return sum;
}

}  // namespace psflow::ps
