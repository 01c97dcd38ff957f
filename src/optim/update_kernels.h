// optim/update_kernels.h — every update rule's arithmetic, written once (internal to psflow: the
// dense optimizer of include/psflow/optim/optimizer.h and the ps tables' sparse rules of
// ps/server/table/sparse_rule.h both call it; docs/design.md#optimizers, docs/tables.md#semantics).
//
// A Kernel is one formula over a row of n floats: the weights w, the rule's slots s0 and s1 (each n
// floats, unused ones ignored) and the gradient g. The dense optimizer applies it to a slice of a
// variable whose slots are separate buffers (ApplySlice); a table applies it to the rows of one push,
// each a record [w | s0 | s1] of `dim` floats apiece (ApplyRows). Both compile the same inlined row
// loop, per ISA through PSFLOW_DISPATCH (core/simd_dispatch.h, built with -ffp-contract=off), so a
// variable and a table row updated with the same scalars hold the same bits.
//
// Adding a rule: one Kernel value, one row loop and one case in update_kernels.cc (a Rule<K>
// specialization whose loop reads the gradient through Load, a case in Slice and Rows, and the
// slot names, initial values and Prepare's scalars beside it).
//
// Thread safety: pure functions of their arguments; callers own the memory and keep concurrent
// calls on disjoint rows.
#ifndef PSFLOW_OPTIM_UPDATE_KERNELS_H_
#define PSFLOW_OPTIM_UPDATE_KERNELS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "psflow/optim/optimizer.h"

namespace psflow::optim::kernels {

enum class Kernel {
  kSgd,           // w -= lr·g
  kMomentum,      // a = μ·a + g; w -= a·lr
  kNesterov,      // a = μ·a + g; w -= (g + μ·a)·lr
  kAdagrad,       // acc += g²; w -= g·lr/√acc                                (TF)
  kTorchAdagrad,  // acc += g²; w -= lr·(g/(√acc + ε))                         (torch)
  kFtrl,          // TF ApplyFtrl, lr_power −0.5 (s0 accumulator, s1 linear)  (tables only)
  kAdam,          // m += (g−m)(1−β1); v += (g²−v)(1−β2); w -= (m·α)/(√v + ε) (TF)
  kTorchAdam,     // torch.optim.Adam: ε added after the bias correction of √v
  kRmsProp,       // ms += (g²−ms)(1−ρ); mom = μ·mom + (g·lr)/√(ms + ε); w -= mom  (TF)
  kTorchRmsProp,  // ms = ms·ρ + (1−ρ)g²; mom = μ·mom + g/(√ms + ε); w -= lr·mom (torch)
};

// The kernel a config names: its name ("ftrl" included), convention and nesterov. The config must
// be valid (MakeOptimizer's or SparseRule::Make's checks); an unknown name is a programming error.
Kernel KernelFor(const OptimizerConfig& config);

// The slots' names in storage order ("momentum"; "accumulator"; "accumulator", "linear"; "m", "v";
// "ms", "mom") and a slot's initial value under `config`.
const std::vector<std::string>& SlotNames(Kernel kernel);
float SlotInitialValue(Kernel kernel, const OptimizerConfig& config, int slot);

// The scalars one update reads, computed once per call (or per row for lazy adam) by Prepare.
struct Scalars {
  float lr = 0;  // the decayed learning rate; kAdam: α = lr·√(1−β2^t)/(1−β1^t); kTorchAdam: lr/(1−β1^t)
  float mu = 0;  // momentum (kMomentum, kNesterov, kRmsProp, kTorchRmsProp)
  float eps = 0;
  float one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0, bc2_sqrt = 0;  // adam (bc2_sqrt: torch)
  float rho = 0, one_minus_rho = 0;                                         // rmsprop
  float l1 = 0, l2 = 0;                                                     // ftrl
};

// The scalars of `kernel` for an update with the decayed learning rate `lr` at step `t` (from 1;
// adam's bias correction only), ftrl's l1 and l2 from the table's rule.
Scalars Prepare(Kernel kernel, const OptimizerConfig& config, float lr, int64_t t, float ftrl_l1 = 0,
                float ftrl_l2 = 0);
// Whether Prepare's scalars depend on t (adam's bias correction); for the other kernels only
// Scalars::lr changes from one update to the next.
inline bool ReadsStep(Kernel kernel) { return kernel == Kernel::kAdam || kernel == Kernel::kTorchAdam; }
// TF adam's α for step t (bias corrections in double, so β^t for large t is not rounded step by step).
float AdamStepSize(const OptimizerConfig& config, float lr, int64_t t);

// One update of w[0, n) with its slots s0[0, n), s1[0, n) (null when the kernel has fewer) and the
// gradient g[0, n). No argument may overlap another.
void ApplySlice(Kernel kernel, const Scalars& scalars, float* w, float* s0, float* s1, const float* g, int64_t n);
// ApplySlice with the gradient's n floats stored at any byte address `g` (a received message's
// bytes, read in place instead of through an aligned copy). The same bits as ApplySlice.
void ApplySliceFromBytes(Kernel kernel, const Scalars& scalars, float* w, float* s0, float* s1, const void* g,
                         int64_t n);

// One update of each of the n rows of a push: row r's record [w | s0 | s1] (dim floats each) at
// records[r] (nullptr: skipped), its gradient at grads[r·dim, (r+1)·dim). With row_lr non-null,
// row r uses row_lr[r] as its scalars.lr (lazy adam's per-row α). Records must not overlap. The next
// rows' records are prefetched while one is updated. Bit-identical to ApplySlice row by row.
void ApplyRows(Kernel kernel, const Scalars& scalars, float* const* records, const float* grads, const float* row_lr,
               int64_t n, int64_t dim);

}  // namespace psflow::optim::kernels

#endif  // PSFLOW_OPTIM_UPDATE_KERNELS_H_
