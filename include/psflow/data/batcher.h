// psflow/data/batcher.h — which examples each worker trains on at each global step.
//
// The example stream is the concatenation of per-epoch permutations of [0, num_examples); the
// permutation of epoch e is a deterministic function of (seed, e) only (Fisher-Yates driven by
// std::mt19937_64, whose output the C++ standard fixes, so every platform gets the same order).
// Global batch k is stream positions [k*N*B, (k+1)*N*B) for N workers of batch B; worker i takes
// [k*N*B + i*B, k*N*B + (i+1)*B). Batches run across epoch boundaries into the next permutation.
// Consequence: the N workers' parts of batch k, in worker order, are exactly batch k of one
// worker with batch N*B, so synchronous training on N workers sees the examples one process would.
//
// A BatchSampler caches the permutation of the epoch it used last; it is not thread-safe (one
// per worker or replica). Gather is thread-safe.
#ifndef PSFLOW_DATA_BATCHER_H_
#define PSFLOW_DATA_BATCHER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "psflow/data/mnist.h"

namespace psflow::data {

class BatchSampler {
 public:
  // InvalidArgument unless num_examples > 0, batch_size > 0 and 0 <= worker_index < num_workers;
  // use it to check flags before constructing.
  static absl::Status ValidateArgs(int64_t num_examples, int64_t batch_size, int worker_index, int num_workers);

  // Arguments must pass ValidateArgs (CHECKed).
  BatchSampler(int64_t num_examples, int64_t batch_size, int worker_index, int num_workers, uint64_t seed);

  // This worker's batch_size example indices of global batch k >= 0 (random access: an
  // asynchronous worker asks for the global step it pulled). Replaces *indices.
  void BatchAt(int64_t k, std::vector<int64_t>* indices);

  int64_t num_examples() const { return num_examples_; }
  int64_t batch_size() const { return batch_size_; }

  // The permutation of [0, num_examples) used for `epoch` (>= 0) of the stream with `seed`.
  static std::vector<int64_t> EpochPermutation(int64_t num_examples, uint64_t seed, int64_t epoch);

 private:
  // A sequential reader over BatchAt, against which the tests check random access
  // (batcher_test.cc's BatchSamplerPeer): BatchAt(next_batch()), then next_batch() advances by one.
  friend class BatchSamplerPeer;
  void Next(std::vector<int64_t>* indices);
  int64_t next_batch() const { return next_batch_; }
  void Seek(int64_t k) { next_batch_ = k; }

  const std::vector<int64_t>& Permutation(int64_t epoch);

  int64_t num_examples_, batch_size_;
  int worker_index_, num_workers_;
  uint64_t seed_;
  int64_t next_batch_ = 0;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> cached_permutation_;
};

// Copies the examples `indices` of `dataset` into images_out (indices.size() x example_size
// floats) and their labels into labels_out (indices.size() values; may be null to skip).
// Indices must be in [0, num_examples) (CHECKed).
void Gather(const Dataset& dataset, const std::vector<int64_t>& indices, float* images_out, int32_t* labels_out);

}  // namespace psflow::data

#endif  // PSFLOW_DATA_BATCHER_H_
