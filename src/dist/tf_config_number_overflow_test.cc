// Regression test, found by fuzz/fuzz_tf_config: a number too large for a double anywhere in
// TF_CONFIG made nlohmann throw json::out_of_range (not a parse_error), which escaped
// ClusterSpec::FromTfConfig and terminated the process instead of returning an error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "psflow/dist/cluster.h"

namespace psflow::dist {
namespace {

using ::testing::HasSubstr;

TEST(TfConfigNumberOverflowTest, IsAnErrorNotATermination) {
  for (const char* json :
       {R"({"cluster": {"ps": [1e400]}, "task": {"type": "ps", "index": 0}})",
        R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}, "task": {"type": "worker", "index": -1e999}})",
        R"({"extra": 6E536})"}) {
    auto parsed = ClusterSpec::FromTfConfig(json);
    ASSERT_FALSE(parsed.ok()) << json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr("TF_CONFIG is not valid JSON")) << parsed.status();
    EXPECT_THAT(parsed.status().message(), HasSubstr("number overflow")) << parsed.status();
  }
}

}  // namespace
}  // namespace psflow::dist
