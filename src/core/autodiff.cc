#include "psflow/core/autodiff.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/check.h"
#include "core/simd_dispatch.h"
#include "core/threading_internal.h"

namespace psflow {

Node::~Node() {
  std::vector<Var> pending = std::move(inputs);
  while (!pending.empty()) {
    Var node = std::move(pending.back());
    pending.pop_back();
    if (node != nullptr && node.use_count() == 1) {
      // The last owner: take its inputs over so its destruction does not recurse into them.
      for (Var& input : node->inputs) pending.push_back(std::move(input));
      node->inputs.clear();
    }
  }
}

void Node::AccumulateGrad(const Tensor& g) {
  CHECK_EQ(g.size(), value.size()) << "gradient " << ShapeToString(g.shape()) << " for value "
                                   << ShapeToString(value.shape()) << " of " << name;
  if (grad.empty()) {
    grad = g.Reshaped(value.shape());
    return;
  }
  simd::AddInto(grad.data(), g.data(), grad.size());
}

void Node::AccumulateGrad(Tensor&& g) {
  if (grad.empty()) {
    CHECK_EQ(g.size(), value.size()) << "gradient " << ShapeToString(g.shape()) << " for value "
                                     << ShapeToString(value.shape()) << " of " << name;
    grad = std::move(g);
    if (grad.shape() != value.shape()) grad.Reshape(value.shape());
    return;
  }
  AccumulateGrad(static_cast<const Tensor&>(g));
}

Tensor& Node::MutableGrad() {
  if (grad.empty()) grad = Tensor(value.shape());
  return grad;
}

void Node::AccumulateSparseGrad(RowSparse g) {
  CHECK(value.rank() >= 1);
  const int64_t row_size = value.size() / std::max<int64_t>(value.dim(0), 1);
  CHECK_EQ(g.values.size(), static_cast<int64_t>(g.rows.size()) * row_size);
  if (!sparse_grad.has_value()) {
    sparse_grad = std::move(g);
    return;
  }
  // Merge two ascending row lists, summing rows present in both.
  const RowSparse& a = *sparse_grad;
  RowSparse merged;
  merged.rows.reserve(a.rows.size() + g.rows.size());
  std::vector<std::pair<const float*, const float*>> sources;  // per merged row: up to 2 sources
  size_t i = 0, j = 0;
  while (i < a.rows.size() || j < g.rows.size()) {
    const float* from_a = nullptr;
    const float* from_g = nullptr;
    int64_t row;
    if (j == g.rows.size() || (i < a.rows.size() && a.rows[i] < g.rows[j])) {
      row = a.rows[i];
      from_a = a.values.data() + i++ * row_size;
    } else if (i == a.rows.size() || g.rows[j] < a.rows[i]) {
      row = g.rows[j];
      from_g = g.values.data() + j++ * row_size;
    } else {
      row = a.rows[i];
      from_a = a.values.data() + i++ * row_size;
      from_g = g.values.data() + j++ * row_size;
    }
    merged.rows.push_back(row);
    sources.emplace_back(from_a, from_g);
  }
  Shape shape = value.shape();
  shape[0] = static_cast<int64_t>(merged.rows.size());
  merged.values = Tensor(shape);
  for (size_t r = 0; r < sources.size(); ++r) {
    float* dst = merged.values.data() + r * row_size;
    for (const float* src : {sources[r].first, sources[r].second}) {
      if (src == nullptr) continue;
      for (int64_t k = 0; k < row_size; ++k) dst[k] += src[k];
    }
  }
  sparse_grad = std::move(merged);
}

Var Constant(Tensor value) {
  auto node = std::make_shared<Node>();
  node->value = std::move(value);
  node->name = "Constant";
  return node;
}

Var MakeParameter(std::string name, Tensor value) {
  auto node = std::make_shared<Node>();
  node->value = std::move(value);
  node->requires_grad = true;
  node->name = std::move(name);
  return node;
}

Var MakeOpNode(std::string op_name, Tensor value, std::vector<Var> inputs, std::function<void(Node& self)> backward) {
  auto node = std::make_shared<Node>();
  node->value = std::move(value);
  node->name = std::move(op_name);
  node->requires_grad =
      std::any_of(inputs.begin(), inputs.end(), [](const Var& v) { return v != nullptr && v->requires_grad; });
  if (node->requires_grad) node->backward = std::move(backward);
  node->inputs = std::move(inputs);
  return node;
}

void Backward(const Var& loss) { Backward(loss, nullptr); }

void Backward(const Var& loss, const std::function<void(Node& leaf)>& on_leaf_done) {
  psflow::internal::PrepareThreadForKernels();
  CHECK(loss != nullptr);
  CHECK_EQ(loss->value.size(), 1) << "Backward needs a scalar loss, got " << ShapeToString(loss->value.shape());
  if (!loss->requires_grad) return;

  // Iterative depth-first post-order over the nodes that require a gradient: every node comes
  // after all of its inputs, so the reverse visits each node after all of its consumers.
  std::vector<Node*> order;
  std::unordered_set<Node*> visited;
  std::vector<std::pair<Node*, size_t>> stack;  // node, index of the next input to visit
  stack.emplace_back(loss.get(), 0);
  visited.insert(loss.get());
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      Node* input = node->inputs[next++].get();
      if (input != nullptr && input->requires_grad && visited.insert(input).second) {
        stack.emplace_back(input, 0);
      }
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }

  // With a callback: how many nodes still have to run before each leaf's gradient is final (its
  // consumers among `order`, counted once per input slot that points at it).
  std::unordered_map<Node*, int> pending;
  if (on_leaf_done) {
    for (Node* node : order) {
      if (!node->backward) continue;
      for (const Var& input : node->inputs) {
        if (input != nullptr && input->requires_grad && !input->backward) ++pending[input.get()];
      }
    }
  }
  loss->AccumulateGrad(Tensor(loss->value.shape(), 1.0f));
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node& node = **it;
    if (!node.backward) {                                           // a leaf: keeps its gradient
      if (on_leaf_done && &node == loss.get()) on_leaf_done(node);  // the loss is a parameter itself
      continue;
    }
    if (!node.grad.empty()) node.backward(node);
    node.grad = Tensor();  // consumed; frees the buffer early
    if (!on_leaf_done) continue;
    for (const Var& input : node.inputs) {
      if (input == nullptr || !input->requires_grad || input->backward) continue;
      if (auto p = pending.find(input.get()); p != pending.end() && --p->second == 0) {
        pending.erase(p);
        on_leaf_done(*input);
      }
    }
  }
}

void ZeroGrad(const std::vector<Var>& params) {
  for (const Var& p : params) {
    p->grad = Tensor();
    p->sparse_grad.reset();
  }
}

}  // namespace psflow
