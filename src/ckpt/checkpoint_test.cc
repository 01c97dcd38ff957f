#include "psflow/ckpt/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace psflow::ckpt {
namespace {

std::string FreshDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(CheckpointTest, KeepsTheNewestAndRestoresTheLatest) {
  const std::string dir = FreshDir("ckpt_keep");
  Tensor w({2}, {1, 2});
  for (int step : {10, 20, 30, 40}) {
    w[0] = step;
    ASSERT_TRUE(SaveCheckpoint(dir, step, {{"w", &w}, {SlotTensorName("w", "m"), &w}}, {{"model", "mlp"}}, 2).ok());
  }
  auto all = ListCheckpoints(dir);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, 40);
  EXPECT_EQ(all[1].first, 30);
  auto latest = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->global_step, 40);
  EXPECT_EQ((*latest)->contents.tensors.at("w")[0], 40);
  EXPECT_TRUE((*latest)->contents.tensors.count("w/slot/m"));
  EXPECT_EQ((*latest)->contents.metadata.at("model"), "mlp");
}

TEST(CheckpointTest, CorruptNewestIsRefusedByNameAndThePreviousUsed) {
  const std::string dir = FreshDir("ckpt_corrupt");
  Tensor w({4}, {1, 2, 3, 4});
  ASSERT_TRUE(SaveCheckpoint(dir, 1, {{"w", &w}}, {}).ok());
  auto newest = SaveCheckpoint(dir, 2, {{"w", &w}}, {});
  ASSERT_TRUE(newest.ok());
  {  // flip one byte of the data section (the last bytes of the file)
    std::fstream f(*newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-2, std::ios::end);
    char c;
    f.get(c);
    f.seekp(-2, std::ios::end);
    f.put(static_cast<char>(c ^ 0x40));
  }
  std::vector<std::string> skipped;
  auto latest = LoadLatestCheckpoint(dir, &skipped);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->global_step, 1);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("model.ckpt-2.safetensors"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[0].find("checksum"), std::string::npos) << skipped[0];
}

TEST(CheckpointTest, TruncatedNewestFallsBack) {
  const std::string dir = FreshDir("ckpt_truncated");
  Tensor w({4}, {1, 2, 3, 4});
  ASSERT_TRUE(SaveCheckpoint(dir, 5, {{"w", &w}}, {}).ok());
  auto newest = SaveCheckpoint(dir, 6, {{"w", &w}}, {});
  std::filesystem::resize_file(*newest, std::filesystem::file_size(*newest) - 3);
  std::vector<std::string> skipped;
  auto latest = LoadLatestCheckpoint(dir, &skipped);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->global_step, 5);
  EXPECT_EQ(skipped.size(), 1u);
}

TEST(CheckpointTest, EmptyOrMissingDirectoryHasNone) {
  auto none = LoadLatestCheckpoint(FreshDir("ckpt_none"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

}  // namespace
}  // namespace psflow::ckpt
