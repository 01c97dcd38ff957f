#include "psflow/data/mnist.h"

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "data/test_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psflow::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::IdxBytes;
using testing::WriteBytes;

constexpr uint32_t kPixels = 28 * 28;

// Image i has every pixel equal to (i * 10 + 1) % 256, so each example is recognizable.
std::vector<uint8_t> Images(uint32_t n) {
  std::vector<uint8_t> data;
  for (uint32_t i = 0; i < n; ++i) data.insert(data.end(), kPixels, (i * 10 + 1) % 256);
  return data;
}

class MnistTest : public testing::TempDirTest {
 protected:
  // A tiny MNIST: 12 training examples (labels i % 10), 4 test examples (labels 9 - i).
  // Train images gzip-compressed, the rest plain, to exercise both.
  void WriteTinyMnist() {
    std::vector<uint8_t> train_labels, test_labels;
    for (uint8_t i = 0; i < 12; ++i) train_labels.push_back(i % 10);
    for (uint8_t i = 0; i < 4; ++i) test_labels.push_back(9 - i);
    WriteBytes(Path("train-images-idx3-ubyte.gz"), IdxBytes({12, 28, 28}, Images(12)), true);
    WriteBytes(Path("train-labels-idx1-ubyte"), IdxBytes({12}, train_labels), false);
    WriteBytes(Path("t10k-images-idx3-ubyte"), IdxBytes({4, 28, 28}, Images(4)), false);
    WriteBytes(Path("t10k-labels-idx1-ubyte"), IdxBytes({4}, test_labels), false);
  }

  std::string LoadError() {
    absl::StatusOr<MnistData> mnist = LoadMnist(dir(), 2);
    EXPECT_FALSE(mnist.ok());
    return std::string(mnist.status().message());
  }
};

TEST_F(MnistTest, LoadsAndSplitsTinyMnist) {
  WriteTinyMnist();
  absl::StatusOr<MnistData> mnist = LoadMnist(dir(), 2);
  ASSERT_TRUE(mnist.ok()) << mnist.status();
  EXPECT_EQ(mnist->train.num_examples, 10);
  EXPECT_EQ(mnist->validation.num_examples, 2);
  EXPECT_EQ(mnist->test.num_examples, 4);
  for (const Dataset* set : {&mnist->train, &mnist->validation, &mnist->test}) {
    EXPECT_EQ(set->example_size, 784);
    EXPECT_EQ(set->images.size(), static_cast<size_t>(set->num_examples * 784));
    EXPECT_EQ(set->labels.size(), static_cast<size_t>(set->num_examples));
  }
  // The validation set is the *last* two training examples (10 and 11).
  EXPECT_THAT(mnist->validation.labels, ElementsAre(0, 1));
  EXPECT_FLOAT_EQ(mnist->validation.images[0], 101.0f / 255.0f);
  EXPECT_FLOAT_EQ(mnist->validation.images[784 + 783], 111.0f / 255.0f);
  EXPECT_THAT(mnist->train.labels, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_FLOAT_EQ(mnist->train.images[9 * 784 + 5], 91.0f / 255.0f);
  EXPECT_THAT(mnist->test.labels, ElementsAre(9, 8, 7, 6));
  EXPECT_FLOAT_EQ(mnist->test.images[0], 1.0f / 255.0f);
}

TEST_F(MnistTest, PixelsScaledToUnitInterval) {
  WriteTinyMnist();
  // Overwrite the test images with 0 and 255 pixels.
  std::vector<uint8_t> images(4 * kPixels, 0);
  images[kPixels] = 255;
  images[kPixels + 1] = 51;
  WriteBytes(Path("t10k-images-idx3-ubyte"), IdxBytes({4, 28, 28}, images), false);
  absl::StatusOr<MnistData> mnist = LoadMnist(dir(), 2);
  ASSERT_TRUE(mnist.ok()) << mnist.status();
  EXPECT_EQ(mnist->test.images[0], 0.0f);
  EXPECT_EQ(mnist->test.images[784], 1.0f);
  EXPECT_NEAR(mnist->test.images[785], 0.2, 1e-7);
}

TEST_F(MnistTest, MissingDirectory) {
  absl::StatusOr<MnistData> mnist = LoadMnist(Path("absent"));
  EXPECT_EQ(mnist.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mnist.status().message(), "data directory '" + Path("absent") +
                                          "' not found; run scripts/setup.sh (it downloads MNIST) or pass --data_dir");
}

// A relative --data_dir is resolved against the current directory: the error says where that
// led (issue 20.4: "data/mnist not found" from another directory).
TEST_F(MnistTest, MissingRelativeDirectoryNamesTheAbsolutePathTried) {
  absl::StatusOr<MnistData> mnist = LoadMnist("no_such_dir/mnist");
  EXPECT_EQ(mnist.status().code(), absl::StatusCode::kNotFound);
  const std::string cwd = std::filesystem::current_path().string();
  EXPECT_EQ(mnist.status().message(), "data directory 'no_such_dir/mnist' (" + cwd +
                                          "/no_such_dir/mnist) not found; run scripts/setup.sh (it downloads "
                                          "MNIST) or pass --data_dir");
}

TEST_F(MnistTest, MissingFileNamesIt) {
  WriteTinyMnist();
  std::filesystem::remove(Path("t10k-labels-idx1-ubyte"));
  EXPECT_THAT(LoadError(), HasSubstr(Path("t10k-labels-idx1-ubyte") + " (or "));
  EXPECT_THAT(LoadError(), HasSubstr("run scripts/setup.sh"));
}

TEST_F(MnistTest, LabelCountMismatchNamesBothFiles) {
  WriteTinyMnist();
  WriteBytes(Path("train-labels-idx1-ubyte"), IdxBytes({11}, std::vector<uint8_t>(11, 1)), false);
  const std::string error = LoadError();
  EXPECT_THAT(error, HasSubstr(Path("train-labels-idx1-ubyte") + " has 11 labels but " +
                               Path("train-images-idx3-ubyte.gz") + " has 12 images"));
}

TEST_F(MnistTest, LabelOutOfRange) {
  WriteTinyMnist();
  std::vector<uint8_t> labels(4, 3);
  labels[2] = 10;
  WriteBytes(Path("t10k-labels-idx1-ubyte"), IdxBytes({4}, labels), false);
  EXPECT_THAT(LoadError(), HasSubstr(Path("t10k-labels-idx1-ubyte") + ": label 10 at index 2 is not a digit 0..9"));
}

TEST_F(MnistTest, WrongImageDimensions) {
  WriteTinyMnist();
  WriteBytes(Path("t10k-images-idx3-ubyte"), IdxBytes({4, 784}, Images(4)), false);
  EXPECT_THAT(LoadError(), HasSubstr(Path("t10k-images-idx3-ubyte") +
                                     ": images have dimensions [4, 784], expected [count, 28, 28]"));
  WriteBytes(Path("t10k-images-idx3-ubyte"), IdxBytes({1, 32, 32}, std::vector<uint8_t>(1024)), false);
  EXPECT_THAT(LoadError(), HasSubstr("[1, 32, 32]"));
  WriteTinyMnist();
  WriteBytes(Path("t10k-labels-idx1-ubyte"), IdxBytes({2, 2}, {1, 2, 3, 4}), false);
  EXPECT_THAT(LoadError(), HasSubstr(Path("t10k-labels-idx1-ubyte") + ": labels have dimensions"));
}

TEST_F(MnistTest, TruncatedFileSuggestsSetup) {
  WriteTinyMnist();
  std::vector<uint8_t> bytes = IdxBytes({4, 28, 28}, Images(4));
  bytes.resize(1000);
  WriteBytes(Path("t10k-images-idx3-ubyte"), bytes, false);
  EXPECT_EQ(LoadError(), Path("t10k-images-idx3-ubyte") +
                             ": truncated: header says 3152 bytes, file has 1000; re-run "
                             "scripts/setup.sh to download MNIST again");
}

TEST_F(MnistTest, TooFewTrainingExamplesForValidation) {
  WriteTinyMnist();
  absl::StatusOr<MnistData> mnist = LoadMnist(dir());  // 12 examples, 5000 held out
  EXPECT_EQ(mnist.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mnist.status().message()), HasSubstr("has 12 examples"));
}

TEST(SyntheticImagesTest, DeterministicAndInRange) {
  const Dataset a = SyntheticImages(50, 32, 32, 3, 10, 7);
  const Dataset b = SyntheticImages(50, 32, 32, 3, 10, 7);
  const Dataset c = SyntheticImages(50, 32, 32, 3, 10, 8);
  EXPECT_EQ(a.num_examples, 50);
  EXPECT_EQ(a.example_size, 3072);
  ASSERT_EQ(a.images.size(), 50u * 3072);
  ASSERT_EQ(a.labels.size(), 50u);
  EXPECT_EQ(a.images, b.images);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.images, c.images);
  // Pinned by an independent Python mt19937_64: the top 24 bits of its first outputs for seed 7.
  EXPECT_FLOAT_EQ(a.images[0], 0.7543852925300598f);
  EXPECT_FLOAT_EQ(a.images[1], 0.9493011832237244f);
  EXPECT_FLOAT_EQ(a.images[2], 0.11741423606872559f);
  double sum = 0;
  for (float x : a.images) {
    ASSERT_GE(x, 0.0f);
    ASSERT_LT(x, 1.0f);
    sum += x;
  }
  EXPECT_NEAR(sum / a.images.size(), 0.5, 0.01);  // 153600 uniforms: sd of the mean ~ 0.0007
  std::set<int32_t> classes(a.labels.begin(), a.labels.end());
  EXPECT_GE(*classes.begin(), 0);
  EXPECT_LE(*classes.rbegin(), 9);
  EXPECT_GE(classes.size(), 8u);  // 50 draws of 10 classes miss at most a couple
}

std::string RealMnistDir() {
  const char* source = std::getenv("PSFLOW_SOURCE_DIR");
  if (source != nullptr) return std::string(source) + "/data/mnist";
  // Run by hand outside CTest: this file is <root>/src/data/mnist_test.cc.
  return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "data" / "mnist").string();
}

TEST(RealMnistTest, SplitSizesAndFirstLabels) {
  const std::string dir = RealMnistDir();
  if (!std::filesystem::is_directory(dir)) {
    GTEST_SKIP() << dir << " is absent (scripts/setup.sh downloads MNIST there)";
  }
  absl::StatusOr<MnistData> mnist = LoadMnist(dir);
  ASSERT_TRUE(mnist.ok()) << mnist.status();
  EXPECT_EQ(mnist->train.num_examples, 55000);
  EXPECT_EQ(mnist->validation.num_examples, 5000);
  EXPECT_EQ(mnist->test.num_examples, 10000);
  EXPECT_THAT(std::vector<int32_t>(mnist->train.labels.begin(), mnist->train.labels.begin() + 5),
              ElementsAre(5, 0, 4, 1, 9));
  EXPECT_THAT(std::vector<int32_t>(mnist->test.labels.begin(), mnist->test.labels.begin() + 5),
              ElementsAre(7, 2, 1, 0, 4));
  for (const Dataset* set : {&mnist->train, &mnist->validation, &mnist->test}) {
    for (float x : set->images) ASSERT_TRUE(x >= 0.0f && x <= 1.0f);
  }
}

}  // namespace
}  // namespace psflow::data
