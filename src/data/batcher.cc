#include "psflow/data/batcher.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "data/uniform.h"

namespace psflow::data {

absl::Status BatchSampler::ValidateArgs(int64_t num_examples, int64_t batch_size, int worker_index, int num_workers) {
  if (num_examples <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot draw batches from a data set of ", num_examples, " examples"));
  }
  if (batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch size must be > 0 (--batch_size), got ", batch_size));
  }
  if (num_workers <= 0 || worker_index < 0 || worker_index >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker index ", worker_index, " is not in [0, ", num_workers, ")"));
  }
  return absl::OkStatus();
}

BatchSampler::BatchSampler(int64_t num_examples, int64_t batch_size, int worker_index, int num_workers, uint64_t seed)
    : num_examples_(num_examples),
      batch_size_(batch_size),
      worker_index_(worker_index),
      num_workers_(num_workers),
      seed_(seed) {
  const absl::Status valid = ValidateArgs(num_examples, batch_size, worker_index, num_workers);
  CHECK(valid.ok()) << valid.message();
}

std::vector<int64_t> BatchSampler::EpochPermutation(int64_t num_examples, uint64_t seed, int64_t epoch) {
  CHECK_GE(epoch, 0);
  std::vector<int64_t> permutation(num_examples);
  std::iota(permutation.begin(), permutation.end(), int64_t{0});
  std::mt19937_64 engine(internal::SplitMix64(internal::SplitMix64(seed) ^ static_cast<uint64_t>(epoch)));
  // Fisher-Yates by hand: std::shuffle's algorithm is not the same in every standard library.
  for (int64_t i = num_examples - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(internal::UniformBelow(engine, static_cast<uint64_t>(i) + 1));
    std::swap(permutation[i], permutation[j]);
  }
  return permutation;
}

const std::vector<int64_t>& BatchSampler::Permutation(int64_t epoch) {
  if (epoch != cached_epoch_) {
    cached_permutation_ = EpochPermutation(num_examples_, seed_, epoch);
    cached_epoch_ = epoch;
  }
  return cached_permutation_;
}

void BatchSampler::BatchAt(int64_t k, std::vector<int64_t>* indices) {
  CHECK_GE(k, 0);
  indices->clear();
  indices->reserve(batch_size_);
  int64_t position = (k * num_workers_ + worker_index_) * batch_size_;
  const int64_t end = position + batch_size_;
  // Copy one epoch's run of the stream at a time; a batch may span several epochs.
  while (position < end) {
    const int64_t epoch = position / num_examples_;
    const int64_t begin_in_epoch = position % num_examples_;
    const int64_t count = std::min(end - position, num_examples_ - begin_in_epoch);
    const std::vector<int64_t>& permutation = Permutation(epoch);
    indices->insert(indices->end(), permutation.begin() + begin_in_epoch, permutation.begin() + begin_in_epoch + count);
    position += count;
  }
}

void BatchSampler::Next(std::vector<int64_t>* indices) {
  BatchAt(next_batch_, indices);
  ++next_batch_;
}

void Gather(const Dataset& dataset, const std::vector<int64_t>& indices, float* images_out, int32_t* labels_out) {
  const int64_t size = dataset.example_size;
  for (size_t i = 0; i < indices.size(); ++i) {
    const int64_t index = indices[i];
    CHECK(index >= 0 && index < dataset.num_examples) << "example " << index;
    std::memcpy(images_out + static_cast<int64_t>(i) * size, dataset.images.data() + index * size,
                size * sizeof(float));
    if (labels_out != nullptr) labels_out[i] = dataset.labels[index];
  }
}

}  // namespace psflow::data
