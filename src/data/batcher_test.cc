#include "psflow/data/batcher.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psflow::data {

// The sampler's sequential reader, private to it (batcher.h).
class BatchSamplerPeer {
 public:
  static void Next(BatchSampler& s, std::vector<int64_t>* indices) { s.Next(indices); }
  static int64_t next_batch(const BatchSampler& s) { return s.next_batch(); }
  static void Seek(BatchSampler& s, int64_t k) { s.Seek(k); }
};

namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

TEST(EpochPermutationTest, IsAPermutation) {
  for (int64_t n : {1, 2, 3, 10, 1000, 55000}) {
    for (int64_t epoch : {0, 1, 17}) {
      std::vector<int64_t> p = BatchSampler::EpochPermutation(n, 42, epoch);
      std::sort(p.begin(), p.end());
      EXPECT_EQ(p, Iota(n)) << "n=" << n << " epoch=" << epoch;
    }
  }
}

TEST(EpochPermutationTest, DependsOnSeedAndEpochOnly) {
  const std::vector<int64_t> a = BatchSampler::EpochPermutation(1000, 1, 0);
  EXPECT_EQ(a, BatchSampler::EpochPermutation(1000, 1, 0));
  EXPECT_NE(a, BatchSampler::EpochPermutation(1000, 2, 0));
  EXPECT_NE(a, BatchSampler::EpochPermutation(1000, 1, 1));
  EXPECT_NE(a, Iota(1000));  // actually shuffled
  // A fair shuffle leaves about one element in place; far from all of them.
  int fixed_points = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed_points += a[i] == i;
  EXPECT_LT(fixed_points, 10);
}

TEST(EpochPermutationTest, PinnedOrder) {
  // Expected values from an independent Python implementation of the documented algorithm
  // (mt19937_64 from the standard's parameters, seeded with SplitMix64(SplitMix64(seed) ^ epoch);
  // unbiased draws by rejection; Fisher-Yates from the last element down). This also pins the
  // data order: changing the shuffle changes what every existing run and its checkpoints train on.
  EXPECT_THAT(BatchSampler::EpochPermutation(10, 42, 0), ElementsAreArray({2, 0, 4, 7, 8, 3, 5, 1, 9, 6}));
  EXPECT_THAT(BatchSampler::EpochPermutation(10, 42, 3), ElementsAreArray({5, 2, 0, 1, 8, 7, 9, 6, 4, 3}));
}

// The stream by its definition: epoch permutations back to back.
std::vector<int64_t> Stream(int64_t num_examples, uint64_t seed, int64_t length) {
  std::vector<int64_t> stream;
  for (int64_t epoch = 0; static_cast<int64_t>(stream.size()) < length; ++epoch) {
    std::vector<int64_t> p = BatchSampler::EpochPermutation(num_examples, seed, epoch);
    stream.insert(stream.end(), p.begin(), p.end());
  }
  stream.resize(length);
  return stream;
}

TEST(BatchSamplerTest, WorkersTakeConsecutiveSlicesOfTheStream) {
  for (int64_t num : {10, 97}) {
    for (int workers : {1, 2, 3, 5}) {
      for (int64_t batch : {1, 7, 32}) {
        const uint64_t seed = 1234;
        const int64_t steps = 3 * num / (workers * batch) + 3;  // crosses several epochs
        const std::vector<int64_t> stream = Stream(num, seed, steps * workers * batch);
        std::vector<int64_t> got;
        for (int w = 0; w < workers; ++w) {
          BatchSampler sampler(num, batch, w, workers, seed);
          for (int64_t k = 0; k < steps; ++k) {
            sampler.BatchAt(k, &got);
            const int64_t start = k * workers * batch + w * batch;
            ASSERT_THAT(got, ElementsAreArray(stream.begin() + start, stream.begin() + start + batch))
                << "num=" << num << " N=" << workers << " B=" << batch << " worker " << w << " step " << k;
          }
        }
      }
    }
  }
}

TEST(BatchSamplerTest, WorkerPartsConcatenateToTheSingleWorkerBigBatch) {
  // Sync training with N workers of batch B must see what one process of batch N*B sees.
  for (uint64_t seed : {0ull, 7ull, 99ull}) {
    for (int workers : {2, 3, 4}) {
      for (int64_t batch : {5, 16, 60}) {
        const int64_t num = 50;
        BatchSampler single(num, workers * batch, 0, 1, seed);
        std::vector<BatchSampler> parts;
        for (int w = 0; w < workers; ++w) parts.emplace_back(num, batch, w, workers, seed);
        std::vector<int64_t> expected, part;
        for (int64_t k = 0; k < 12; ++k) {
          single.BatchAt(k, &expected);
          std::vector<int64_t> joined;
          for (BatchSampler& sampler : parts) {
            sampler.BatchAt(k, &part);
            ASSERT_EQ(part.size(), static_cast<size_t>(batch));
            joined.insert(joined.end(), part.begin(), part.end());
          }
          ASSERT_EQ(joined, expected) << "seed " << seed << " N=" << workers << " B=" << batch << " k=" << k;
        }
      }
    }
  }
}

TEST(BatchSamplerTest, OneEpochCoversEveryExampleOnce) {
  // 2 workers x 10 per batch over 100 examples: 5 global batches are exactly one epoch.
  std::vector<int64_t> seen, part;
  for (int w = 0; w < 2; ++w) {
    BatchSampler sampler(100, 10, w, 2, 5);
    for (int64_t k = 0; k < 5; ++k) {
      sampler.BatchAt(k, &part);
      seen.insert(seen.end(), part.begin(), part.end());
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, Iota(100));
}

TEST(BatchSamplerTest, RandomAccessMatchesSequentialNext) {
  BatchSampler sequential(37, 8, 1, 3, 11);
  std::vector<std::vector<int64_t>> batches(20);
  for (auto& batch : batches) BatchSamplerPeer::Next(sequential, &batch);
  EXPECT_EQ(BatchSamplerPeer::next_batch(sequential), 20);
  // Jumping around (as an async worker does) gives the same batches.
  BatchSampler jumping(37, 8, 1, 3, 11);
  std::vector<int64_t> got;
  for (int64_t k : {13, 2, 19, 0, 13, 7, 6}) {
    jumping.BatchAt(k, &got);
    EXPECT_EQ(got, batches[k]) << "k=" << k;
  }
  BatchSamplerPeer::Seek(jumping, 18);
  BatchSamplerPeer::Next(jumping, &got);
  EXPECT_EQ(got, batches[18]);
  EXPECT_EQ(BatchSamplerPeer::next_batch(jumping), 19);
}

TEST(BatchSamplerTest, BatchLargerThanAnEpoch) {
  BatchSampler sampler(3, 7, 0, 1, 1);
  std::vector<int64_t> got;
  sampler.BatchAt(1, &got);
  const std::vector<int64_t> stream = Stream(3, 1, 14);
  EXPECT_THAT(got, ElementsAreArray(stream.begin() + 7, stream.end()));
}

TEST(BatchSamplerTest, ValidateArgs) {
  EXPECT_TRUE(BatchSampler::ValidateArgs(10, 5, 1, 2).ok());
  EXPECT_THAT(std::string(BatchSampler::ValidateArgs(0, 5, 0, 1).message()), HasSubstr("0 examples"));
  EXPECT_THAT(std::string(BatchSampler::ValidateArgs(10, 0, 0, 1).message()), HasSubstr("--batch_size"));
  EXPECT_THAT(std::string(BatchSampler::ValidateArgs(10, 5, 2, 2).message()),
              HasSubstr("worker index 2 is not in [0, 2)"));
}

TEST(GatherTest, CopiesRowsAndLabels) {
  Dataset set;
  set.num_examples = 4;
  set.example_size = 3;
  for (int i = 0; i < 12; ++i) set.images.push_back(static_cast<float>(i));
  set.labels = {7, 8, 9, 6};
  std::vector<float> images(9);
  std::vector<int32_t> labels(3);
  Gather(set, {2, 0, 2}, images.data(), labels.data());
  EXPECT_EQ(images, (std::vector<float>{6, 7, 8, 0, 1, 2, 6, 7, 8}));
  EXPECT_EQ(labels, (std::vector<int32_t>{9, 7, 9}));
  Gather(set, {3}, images.data(), nullptr);
  EXPECT_EQ(images[0], 9.0f);
}

}  // namespace
}  // namespace psflow::data
