// Shared helpers of the integration tests: run psflow, read its summary JSON and checkpoints.
#ifndef PSFLOW_TESTS_INTEGRATION_TEST_UTIL_H_
#define PSFLOW_TESTS_INTEGRATION_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "process.h"
#include "psflow/ckpt/safetensors.h"

namespace psflow::testing {

inline std::vector<std::string> Psflow(std::vector<std::string> args) {
  args.insert(args.begin(), PsflowBinary());
  return args;
}

// The small ctr job of the table tests (3 fields of dim 4, seed 5; `vocab` 0: dynamic tables, N: fixed
// ones of N rows) appended to `args`, with `batch_size` (0: none, as `psflow eval` takes).
inline void AppendSmallCtr(std::vector<std::string>* args, int64_t vocab, int batch_size) {
  for (std::string flag : {"--model=ctr", "--ctr_fields=3", "--ctr_dim=4", "--seed=5"}) args->push_back(flag);
  args->push_back(absl::StrCat("--ctr_vocab=", vocab));
  if (batch_size > 0) args->push_back(absl::StrCat("--batch_size=", batch_size));
}

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  return nlohmann::json::parse(in, nullptr, false);
}

// The file's bytes ("" and a failure when it is missing): checkpoints compared byte for byte.
inline std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing " << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The only checkpoint file in `dir` (the final one).
inline std::map<std::string, Tensor> ReadFinalVariables(const std::string& dir) {
  std::string found;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") found = entry.path().string();
  }
  EXPECT_FALSE(found.empty()) << "no checkpoint in " << dir;
  auto file = ckpt::ReadSafetensors(found);
  EXPECT_TRUE(file.ok()) << file.status();
  std::map<std::string, Tensor> variables;
  if (!file.ok()) return variables;
  for (auto& [name, t] : file->tensors) {
    if (name.find("/slot/") == std::string::npos) variables.emplace(name, std::move(t));  // skip optimizer slots
  }
  return variables;
}

// Largest |a - b| relative to the largest |b| of each variable.
inline double MaxRelativeDifference(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  double worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [name, tb] : b) {
    auto it = a.find(name);
    if (it == a.end()) {
      ADD_FAILURE() << "variable " << name << " missing";
      continue;
    }
    const Tensor& ta = it->second;
    EXPECT_EQ(ta.shape(), tb.shape()) << name;
    double scale = 1e-12, diff = 0;
    for (int64_t i = 0; i < tb.size(); ++i) {
      scale = std::max(scale, double(std::abs(tb[i])));
      diff = std::max(diff, double(std::abs(ta[i] - tb[i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

inline int CountLines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n + (!text.empty() && text.back() != '\n');
}

}  // namespace psflow::testing

#endif  // PSFLOW_TESTS_INTEGRATION_TEST_UTIL_H_
