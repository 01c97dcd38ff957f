// psflow/core/autodiff.h — reverse-mode automatic differentiation on a dynamic tape.
//
// Every op (psflow/core/ops.h) returns a Var: a shared handle to a Node that holds the op's value,
// the Vars it was computed from, and a closure that propagates the Node's gradient to its inputs.
// A forward pass builds a fresh graph each step; Backward(loss) walks it in reverse topological
// order. Parameters are long-lived leaf Nodes (MakeParameter) whose gradients are read after
// Backward and cleared with ZeroGrad before the next step.
//
// Gradients of a Node are dense (`grad`, same shape as `value`), except that ops which touch only
// some rows of a parameter (EmbeddingLookup) may instead accumulate a row-sparse gradient
// (`sparse_grad`) on it. A graph is not thread-safe; separate replicas build separate graphs.
//
// Backward keeps the gradients of leaves (parameters, constants that require grad) only: an op
// node's gradient is consumed by its backward closure (often moved into an input) and cleared, so
// that a step's temporaries are freed as early as possible.
#ifndef PSFLOW_CORE_AUTODIFF_H_
#define PSFLOW_CORE_AUTODIFF_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "psflow/core/row_sparse.h"
#include "psflow/core/tensor.h"

namespace psflow {

struct Node;
using Var = std::shared_ptr<Node>;

struct Node {
  Tensor value;
  // Dense gradient d(loss)/d(value); empty until something accumulates into it.
  Tensor grad;
  // Row-sparse gradient, used instead of `grad` by ops that touch few rows of a parameter.
  std::optional<RowSparse> sparse_grad;
  bool requires_grad = false;
  std::string name;  // parameters carry their variable name; op nodes their op name
  std::vector<Var> inputs;
  // Propagates this->grad into inputs' grads (accumulating). Null for leaves.
  std::function<void(Node& self)> backward;

  // Releases the graph above this node iteratively, so a deep graph does not recurse.
  ~Node();

  // Adds `g` into `grad`, allocating zeros first if needed.
  void AccumulateGrad(const Tensor& g);
  // Same, taking the buffer over when `grad` is still empty (no copy).
  void AccumulateGrad(Tensor&& g);
  // Adds a row-sparse gradient into `sparse_grad` (merging rows that are already there).
  void AccumulateSparseGrad(RowSparse g);
  // Returns `grad`, zero-filled to value's shape if it was empty (for in-place accumulation).
  Tensor& MutableGrad();
};

// A leaf that never needs a gradient (inputs, labels as floats, constants).
Var Constant(Tensor value);
// A trainable leaf: requires_grad, named.
Var MakeParameter(std::string name, Tensor value);
// Helper for op implementations: a node with the given value, inputs and backward closure.
// requires_grad is true when any input requires it; if none does, `backward` is dropped.
Var MakeOpNode(std::string op_name, Tensor value, std::vector<Var> inputs, std::function<void(Node& self)> backward);

// Seeds d(loss)/d(loss) = 1 (loss must hold one element) and runs every reachable backward
// closure once, in reverse topological order. Iterative: deep graphs do not exhaust the stack.
void Backward(const Var& loss);
// The same, calling `on_leaf_done(leaf)` for each leaf that requires a gradient (a parameter) as
// soon as its gradient is final for this Backward: right after the last node that feeds it ran
// its backward closure, so in reverse layer order for a feed-forward network (the last layer's
// parameters first). A worker hands each gradient to the network then (push as backward goes);
// the leaf's `grad`/`sparse_grad` are not touched again by this Backward. Leaves the loss does not
// reach are not reported. The callback runs on the calling thread.
void Backward(const Var& loss, const std::function<void(Node& leaf)>& on_leaf_done);

// Clears the dense and sparse gradients of the given parameters.
void ZeroGrad(const std::vector<Var>& params);

}  // namespace psflow

#endif  // PSFLOW_CORE_AUTODIFF_H_
