#include "psflow/data/mnist.h"

#include <filesystem>
#include <random>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "data/uniform.h"
#include "psflow/data/idx.h"

namespace psflow::data {
namespace {

constexpr char kSetupHint[] = "re-run scripts/setup.sh to download MNIST again";

// `dir/name`, or `dir/name.gz` when only that exists.
absl::StatusOr<std::string> FindFile(const std::string& dir, const std::string& name) {
  const std::filesystem::path plain = std::filesystem::path(dir) / name;
  std::error_code ec;
  if (std::filesystem::exists(plain, ec)) return plain.string();
  const std::string gz = plain.string() + ".gz";
  if (std::filesystem::exists(gz, ec)) return gz;
  return absl::NotFoundError(absl::StrCat(plain.string(), " (or ", name,
                                          ".gz) not found; run scripts/setup.sh (it downloads "
                                          "MNIST) or pass --data_dir"));
}

absl::StatusOr<IdxArray> ReadMnistFile(const std::string& path) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  if (!array.ok() && array.status().code() == absl::StatusCode::kDataLoss) {
    return absl::DataLossError(absl::StrCat(array.status().message(), "; ", kSetupHint));
  }
  return array;
}

std::string DimsToString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) absl::StrAppend(&s, i ? ", " : "", dims[i]);
  return s + "]";
}

// Images and labels of one MNIST part ("train" or "t10k"), checked against each other.
absl::StatusOr<Dataset> LoadPart(const std::string& dir, const std::string& part) {
  absl::StatusOr<std::string> images_path = FindFile(dir, part + "-images-idx3-ubyte");
  if (!images_path.ok()) return images_path.status();
  absl::StatusOr<std::string> labels_path = FindFile(dir, part + "-labels-idx1-ubyte");
  if (!labels_path.ok()) return labels_path.status();
  absl::StatusOr<IdxArray> images = ReadMnistFile(*images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxArray> labels = ReadMnistFile(*labels_path);
  if (!labels.ok()) return labels.status();

  if (images->dims.size() != 3 || images->dims[1] != kMnistRows || images->dims[2] != kMnistCols) {
    return absl::DataLossError(absl::StrCat(*images_path, ": images have dimensions ", DimsToString(images->dims),
                                            ", expected [count, 28, 28]; ", kSetupHint));
  }
  if (labels->dims.size() != 1) {
    return absl::DataLossError(absl::StrCat(*labels_path, ": labels have dimensions ", DimsToString(labels->dims),
                                            ", expected [count]; ", kSetupHint));
  }
  const int64_t n = images->dims[0];
  if (labels->dims[0] != n) {
    return absl::DataLossError(absl::StrCat(*labels_path, " has ", labels->dims[0], " labels but ", *images_path,
                                            " has ", n, " images; ", kSetupHint));
  }
  Dataset set;
  set.num_examples = n;
  set.example_size = kMnistRows * kMnistCols;
  set.labels.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t label = labels->data[i];
    if (label >= kMnistClasses) {
      return absl::DataLossError(
          absl::StrCat(*labels_path, ": label ", label, " at index ", i, " is not a digit 0..9; ", kSetupHint));
    }
    set.labels[i] = label;
  }
  // Like input_data: the float32 pixel times float32(1/255) (not a division), so the values
  // match what the TF seeds trained on.
  const float scale = 1.0f / 255.0f;
  set.images.resize(images->data.size());
  for (size_t i = 0; i < images->data.size(); ++i) {
    set.images[i] = static_cast<float>(images->data[i]) * scale;
  }
  return set;
}

// Moves examples [keep, num_examples) of `set` into the returned Dataset; `set` keeps the rest.
Dataset SplitTail(Dataset& set, int64_t keep) {
  Dataset tail;
  tail.num_examples = set.num_examples - keep;
  tail.example_size = set.example_size;
  tail.images.assign(set.images.begin() + keep * set.example_size, set.images.end());
  tail.labels.assign(set.labels.begin() + keep, set.labels.end());
  set.num_examples = keep;
  set.images.resize(keep * set.example_size);
  set.labels.resize(keep);
  return tail;
}

}  // namespace

absl::StatusOr<MnistData> LoadMnist(const std::string& dir, int64_t validation_size) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    // The absolute path tried: a relative --data_dir is resolved against the current directory,
    // which is the usual surprise (issue 20.4).
    const std::filesystem::path absolute = std::filesystem::absolute(dir, ec);
    const std::string tried =
        ec || absolute.string() == dir ? std::string() : absl::StrCat(" (", absolute.lexically_normal().string(), ")");
    return absl::NotFoundError(absl::StrCat("data directory '", dir, "'", tried,
                                            " not found; run scripts/setup.sh (it downloads "
                                            "MNIST) or pass --data_dir"));
  }
  absl::StatusOr<Dataset> train = LoadPart(dir, "train");
  if (!train.ok()) return train.status();
  absl::StatusOr<Dataset> test = LoadPart(dir, "t10k");
  if (!test.ok()) return test.status();
  if (validation_size < 0 || train->num_examples <= validation_size) {
    return absl::InvalidArgumentError(absl::StrCat("the MNIST training set in '", dir, "' has ", train->num_examples,
                                                   " examples; need more than the ", validation_size,
                                                   " held out for validation"));
  }
  MnistData mnist;
  const int64_t train_size = train->num_examples - validation_size;
  mnist.validation = SplitTail(*train, train_size);
  mnist.train = std::move(*train);
  mnist.test = std::move(*test);
  return mnist;
}

Dataset SyntheticImages(int64_t n, int h, int w, int c, int classes, uint64_t seed) {
  CHECK_GE(n, 0);
  CHECK(h > 0 && w > 0 && c > 0 && classes > 0);
  // Our own conversions on std::mt19937_64 (see data/uniform.h): 24 random bits per pixel.
  std::mt19937_64 engine(seed);
  Dataset set;
  set.num_examples = n;
  set.example_size = int64_t{h} * w * c;
  set.images.resize(n * set.example_size);
  set.labels.resize(n);
  for (float& x : set.images) x = static_cast<float>(engine() >> 40) * (1.0f / 16777216.0f);
  for (int32_t& label : set.labels) {
    label = static_cast<int32_t>(internal::UniformBelow(engine, static_cast<uint64_t>(classes)));
  }
  return set;
}

}  // namespace psflow::data
