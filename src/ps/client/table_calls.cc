#include "ps/client/table_calls.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/id_positions.h"
#include "core/simd_dispatch.h"

namespace psflow::ps {
namespace {

absl::Status Bad(const char* what, const std::string& table, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": table '", table, "': ", why));
}

// Routes one reference's ids into per-(ps, shard) blocks of `out`.
//
// The ids are checked once on the ps, where they enter it (PsTables::Decode); the shards trust
// them. Three refusals stay here because only the client sees a whole call before any ps task
// applies its part, and a push must apply on every ps or on none: an id that routes nowhere (a
// fixed table's id outside [0, N): routing itself fails), an id listed twice and a NaN or Inf row.
// A ps task refusing its block could not undo another task's applied part.
absl::Status RouteOne(const char* what, const TableRowsRef& ref, bool push, const dist::PlacementPlan& plan,
                      std::vector<std::vector<TableBlockCall>>* out) {
  const dist::TablePlacement* t = plan.Table(ref.table);
  if (t == nullptr) return Bad(what, ref.table, "not a table of the plan");
  if (ref.ids == nullptr) return Bad(what, ref.table, "no ids given");
  const int64_t n = static_cast<int64_t>(ref.ids->size());
  const int64_t dim = t->spec.dim;
  const Tensor* rows = push ? ref.grads : ref.rows;
  // grad_values (push) or row_values (pull) instead of a Tensor
  const size_t num_values = push ? ref.grad_values.size() : ref.row_values.size();
  const bool values = rows == nullptr && (push ? ref.grad_values.data() : ref.row_values.data()) != nullptr;
  if (rows == nullptr && !values) {
    return Bad(what, ref.table, push ? "no gradient rows given" : "no destination given");
  }
  if (values && static_cast<int64_t>(num_values) != n * dim) {
    return Bad(what, ref.table,
               absl::StrCat(push ? "gradient rows of " : "a destination of ", num_values, " values for ", n,
                            " ids; the table takes [", n, ",", dim, "]"));
  }
  float* dest = push ? nullptr : values ? ref.row_values.data() : ref.rows->data();
  if (!values && (rows->rank() != 2 || rows->dim(0) != n || rows->dim(1) != dim)) {
    return Bad(what, ref.table,
               absl::StrCat(push ? "gradient rows" : "destination", " ", ShapeToString(rows->shape()), " for ", n,
                            " ids; the table takes [", n, ",", dim, "]"));
  }
  IdPositions& seen = IdPositions::ForThisThread();
  seen.Reset(n);
  // Block index per (ps shard), -1 before its first id: fixed tables by shard, dynamic by ps task.
  std::vector<int64_t> block_of(t->shards.size(), -1);
  std::vector<int> shards_used;
  // Fixed tables: the shard only (RouteFixedId's row is not needed here), the layout's divisions
  // done once.
  const bool dynamic = t->spec.dynamic();
  const dist::FixedShardRouter router(dynamic ? dist::FixedTableLayout{} : t->layout);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t id = (*ref.ids)[j];
    if (!seen.Insert(id, j).second) return Bad(what, ref.table, absl::StrCat("id ", id, " listed twice (dedup first)"));
    const int shard = dynamic ? dist::RouteDynamicId(id, plan.num_ps) : router.ShardOf(id);
    if (shard < 0) {  // outside [0, N): RouteFixedId says so
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", dist::RouteFixedId(t->spec.name, t->layout, id).status().message()));
    }
    const dist::TableShardSpec& s = t->shards[static_cast<size_t>(shard)];
    int64_t& block = block_of[static_cast<size_t>(shard)];
    if (block < 0) {
      block = static_cast<int64_t>((*out)[s.ps_task].size());
      shards_used.push_back(shard);
      TableBlockCall& b = (*out)[s.ps_task].emplace_back();
      b.block = s.name;
      b.dim = dim;
      b.dest = dest;
      if (t->shards.size() == 1) {  // every id goes here
        b.ids.reserve(static_cast<size_t>(n));
        b.positions.reserve(static_cast<size_t>(n));
      }
    }
    TableBlockCall& b = (*out)[s.ps_task][static_cast<size_t>(block)];
    b.ids.push_back(id);
    b.positions.push_back(j);
  }
  if (!push) return absl::OkStatus();
  const float* g = values ? ref.grad_values.data() : ref.grads->data();
  // The culprit looked for only when there is one.
  const bool any = simd::AnyNonFinite(g, n * dim);
  for (int64_t j = 0; any && j < n * dim; ++j) {
    if (!std::isfinite(g[j])) {
      return Bad(what, ref.table,
                 absl::StrCat("gradient row of id ", (*ref.ids)[j / dim], " has a NaN or Inf at element ", j % dim,
                              " (diverged? lower the learning rate)"));
    }
  }
  for (int shard : shards_used) {
    const size_t index = static_cast<size_t>(block_of[static_cast<size_t>(shard)]);
    TableBlockCall& b = (*out)[t->shards[static_cast<size_t>(shard)].ps_task][index];
    b.rows = std::make_shared<FloatBuffer>(b.ids.size() * static_cast<size_t>(dim));
    if (static_cast<int64_t>(b.ids.size()) == n) {  // every id in this block, in order: one copy
      std::memcpy(b.rows->data(), g, static_cast<size_t>(n * dim) * sizeof(float));
      continue;
    }
    for (size_t q = 0; q < b.positions.size(); ++q) {
      std::memcpy(b.rows->data() + q * dim, g + b.positions[q] * dim, static_cast<size_t>(dim) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool TableWork::empty() const {
  for (size_t k = 0; k < pulls.size(); ++k) {
    if (Any(static_cast<int>(k))) return false;
  }
  return true;
}

absl::StatusOr<std::shared_ptr<TableWork>> RouteTables(const char* what, const TableStep& tables,
                                                       const dist::PlacementPlan& plan) {
  auto work = std::make_shared<TableWork>();
  work->pulls.resize(static_cast<size_t>(plan.num_ps));
  work->pushes.resize(static_cast<size_t>(plan.num_ps));
  for (const TableRowsRef& ref : tables.pulls) {
    if (absl::Status s = RouteOne(what, ref, false, plan, &work->pulls); !s.ok()) return s;
  }
  for (const TableRowsRef& ref : tables.pushes) {
    if (absl::Status s = RouteOne(what, ref, true, plan, &work->pushes); !s.ok()) return s;
  }
  return work;
}

namespace {

std::string IdBytes(const std::vector<int64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int64_t));
}

}  // namespace

void AddTableBlocks(const std::vector<TableBlockCall>& pulls,
                    google::protobuf::RepeatedPtrField<wire::TableRows>* pull_blocks) {
  for (const TableBlockCall& b : pulls) {
    wire::TableRows* w = pull_blocks->Add();
    w->set_table(b.block);
    w->set_ids(IdBytes(b.ids));
  }
}

void AddTablePushes(const std::vector<TableBlockCall>& pushes,
                    google::protobuf::RepeatedPtrField<wire::TableRows>* push_blocks,
                    std::vector<rpc::OutgoingTensor>* tensors) {
  for (const TableBlockCall& b : pushes) {
    wire::TableRows* w = push_blocks->Add();
    w->set_table(b.block);
    w->set_ids(IdBytes(b.ids));
    rpc::OutgoingTensor t;
    t.meta.set_name(b.block);
    t.meta.add_shape(static_cast<int64_t>(b.ids.size()));
    t.meta.add_shape(b.dim);
    t.data = b.rows->data();
    t.num_floats = static_cast<int64_t>(b.rows->size());
    t.owner = b.rows;
    tensors->push_back(std::move(t));
  }
}

int64_t TablePullBytes(const std::vector<TableBlockCall>& pulls) {
  int64_t bytes = 0;
  for (const TableBlockCall& b : pulls) bytes += static_cast<int64_t>(b.ids.size()) * b.dim * 4;
  return bytes;
}

absl::Status ScatterTableRows(const rpc::IncomingMessage& answer, const std::vector<TableBlockCall>& pulls,
                              const std::string& peer) {
  const int first = answer.num_tensors() - static_cast<int>(pulls.size());
  if (first < 0) {
    return absl::DataLossError(absl::StrCat(peer, ": asked for ", pulls.size(), " table blocks, the answer has ",
                                            answer.num_tensors(), " tensors"));
  }
  std::vector<float> buffer;
  for (size_t b = 0; b < pulls.size(); ++b) {
    const TableBlockCall& call = pulls[b];
    const int i = first + static_cast<int>(b);
    const int64_t n = static_cast<int64_t>(call.ids.size());
    if (answer.meta(i).name() != call.block || answer.num_floats(i) != n * call.dim) {
      return absl::DataLossError(absl::StrCat(peer, ": expected ", n, " rows of table shard '", call.block,
                                              "', received '", answer.meta(i).name(), "' with ", answer.num_floats(i),
                                              " floats"));
    }
    float* dest = call.dest;
    // Rows wanted in a run of consecutive positions (one ps holding a batch's ids, in order): one
    // copy straight into place.
    if (n > 0 && call.positions.back() - call.positions.front() == n - 1) {
      bool run = true;
      for (int64_t q = 1; q < n && run; ++q) run = call.positions[q] == call.positions[q - 1] + 1;
      if (run) {
        answer.CopyTo(i, dest + call.positions.front() * call.dim);
        continue;
      }
    }
    buffer.resize(static_cast<size_t>(n * call.dim));
    if (n > 0) answer.CopyTo(i, buffer.data());
    for (int64_t q = 0; q < n; ++q) {
      std::memcpy(dest + call.positions[q] * call.dim, buffer.data() + q * call.dim,
                  static_cast<size_t>(call.dim) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace psflow::ps
