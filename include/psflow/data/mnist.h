// psflow/data/mnist.h — in-memory data sets: MNIST loaded from its four IDX files, split as the
// TF 1.x seeds' input_data does (first 55000 training images train, last 5000 validate, the 10000
// t10k images test), and deterministic synthetic images for throughput models (vgg19).
//
// A Dataset is a plain value that owns its arrays; once loaded it is only read, so any number of
// threads may read it concurrently. Loading functions keep no state and are thread-safe.
#ifndef PSFLOW_DATA_MNIST_H_
#define PSFLOW_DATA_MNIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace psflow::data {

struct Dataset {
  int64_t num_examples = 0;
  int64_t example_size = 0;     // floats per example: 784 for MNIST, h*w*c for synthetic images
  std::vector<float> images;    // num_examples x example_size, row-major, values in [0, 1]
  std::vector<int32_t> labels;  // num_examples class ids
};

struct MnistData {
  Dataset train, validation, test;
};

inline constexpr int64_t kMnistValidationSize = 5000;
inline constexpr int kMnistRows = 28, kMnistCols = 28, kMnistClasses = 10;

// Loads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
// t10k-labels-idx1-ubyte from `dir`, each plain or with a .gz suffix. Checks that images are
// N x 28 x 28, labels are N values in 0..9 with N matching the images. The last
// `validation_size` training examples become `validation` (tests pass a small value to use tiny
// files). Pixels are scaled to [0, 1] as pixel * (1/255) in float, like input_data.
// Errors name the directory or file and say how to fix it (run scripts/setup.sh, --data_dir).
absl::StatusOr<MnistData> LoadMnist(const std::string& dir, int64_t validation_size = kMnistValidationSize);

// n random images of h x w x c floats uniform in [0, 1) with labels uniform in [0, classes);
// a deterministic function of the arguments on every platform.
Dataset SyntheticImages(int64_t n, int h, int w, int c, int classes, uint64_t seed);

}  // namespace psflow::data

#endif  // PSFLOW_DATA_MNIST_H_
