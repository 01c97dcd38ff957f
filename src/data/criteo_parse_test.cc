// Criteo's layout line by line (psflow/data/criteo.h): the dense transform against log1p, good
// lines of every shape, every kind of bad line with its one-line message, the writer's lines read
// back, file patterns, and the generator's dense counts.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "data/test_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "psflow/data/criteo.h"
#include "psflow/data/ctr.h"

namespace psflow::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

struct Parsed {
  std::vector<int64_t> ids;
  std::vector<float> dense;
  float label = -1;
};

absl::StatusOr<Parsed> Parse(std::string_view line, CriteoLayout layout = {}) {
  Parsed p;
  p.ids.assign(layout.num_fields, -7);
  p.dense.assign(layout.num_dense, -7);
  if (absl::Status s = ParseCriteoLine(line, layout, p.ids.data(), p.dense.data(), &p.label); !s.ok()) return s;
  return p;
}

// A line of the default layout from its 40 fields.
std::string Line(const std::vector<std::string>& fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) line += (i ? "\t" : "") + fields[i];
  return line;
}
std::vector<std::string> GoodFields() {
  std::vector<std::string> f = {"1"};
  for (int d = 0; d < 13; ++d) f.push_back(std::to_string(d * 7));
  for (int c = 0; c < 26; ++c) f.push_back("68fd1e6" + std::to_string(c % 10));
  return f;
}

float Log1p(int64_t x) { return x <= 0 ? 0.0f : static_cast<float>(std::log1p(static_cast<double>(x))); }

TEST(CriteoDenseValueTest, IsLogOnePlusClampedToZero) {
  for (int64_t x : {int64_t{-5}, int64_t{0}, int64_t{1}, int64_t{2}, int64_t{4095}, int64_t{4096}, int64_t{123456789},
                    std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()}) {
    EXPECT_EQ(CriteoDenseValue(x), Log1p(x)) << x;
  }
  EXPECT_EQ(CriteoDenseValue(-1), 0.0f);
}

TEST(ParseCriteoLineTest, ParsesAGoodLine) {
  auto p = Parse(Line(GoodFields()));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->label, 1.0f);
  for (int d = 0; d < 13; ++d) EXPECT_EQ(p->dense[d], Log1p(d * 7)) << d;
  EXPECT_EQ(p->ids[0], 0x68fd1e60);
  EXPECT_EQ(p->ids[25], 0x68fd1e65);
}

TEST(ParseCriteoLineTest, MissingNegativeAndWideValues) {
  std::vector<std::string> f = GoodFields();
  f[0] = "0";
  f[1] = "";                          // missing integer → 0
  f[2] = "-3";                        // negative → 0
  f[3] = "-9223372036854775808";      // int64's minimum
  f[4] = "9223372036854775807";       // and maximum
  f[5] = "000000000000000000000042";  // leading zeros
  f[14] = "";                         // missing categorical → 0
  f[15] = "FFFFFFFFFFFFFFFF";         // 16 digits, upper case → -1
  f[16] = "0";
  f[17] = "7fffffffffffffff";
  auto p = Parse(Line(f) + "\r");  // a '\r' before the end is dropped
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->label, 0.0f);
  EXPECT_EQ(p->dense[0], 0.0f);
  EXPECT_EQ(p->dense[1], 0.0f);
  EXPECT_EQ(p->dense[2], 0.0f);
  EXPECT_EQ(p->dense[3], Log1p(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(p->dense[4], Log1p(42));
  EXPECT_EQ(p->ids[0], 0);
  EXPECT_EQ(p->ids[1], -1);
  EXPECT_EQ(p->ids[2], 0);
  EXPECT_EQ(p->ids[3], std::numeric_limits<int64_t>::max());
  // Every field missing but the label.
  auto empty = Parse("1" + std::string(39, '\t'));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->dense, std::vector<float>(13, 0.0f));
  EXPECT_EQ(empty->ids, std::vector<int64_t>(26, 0));
}

TEST(ParseCriteoLineTest, OtherLayouts) {
  auto p = Parse("1\t5\tab", {1, 1});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dense[0], Log1p(5));
  EXPECT_EQ(p->ids[0], 0xab);
  auto label_only = Parse("0", {0, 0});
  ASSERT_TRUE(label_only.ok()) << label_only.status();
  EXPECT_EQ(label_only->label, 0.0f);
  EXPECT_THAT(Parse("1\t5\tab", {2, 0}).status().message(), HasSubstr("integer field I2 'ab'"));
  EXPECT_THAT(Parse("1\t5\tab", {1, 2}).status().message(),
              HasSubstr("3 tab-separated fields; expected 4 (label, 1 integer and 2 categoricals)"));
}

// Each bad line: one line of text saying which field and what is wrong.
TEST(ParseCriteoLineTest, BadLinesSayWhatIsWrong) {
  auto message = [](const std::string& line) { return std::string(Parse(line).status().message()); };
  auto with = [](int index, const std::string& value) {
    std::vector<std::string> f = GoodFields();
    f[index] = value;
    return Line(f);
  };
  std::vector<std::string> fields = GoodFields();
  fields.pop_back();
  EXPECT_THAT(message(Line(fields)),
              HasSubstr("39 tab-separated fields; expected 40 (label, 13 integers and 26 categoricals)"));
  fields = GoodFields();
  fields.push_back("ab");
  EXPECT_THAT(message(Line(fields)), HasSubstr("41 tab-separated fields; expected 40"));
  EXPECT_THAT(message(""), HasSubstr("1 tab-separated field; expected 40"));
  EXPECT_THAT(message("1 2 3"), HasSubstr("1 tab-separated field;"));  // spaces are not separators
  EXPECT_THAT(message(with(0, "2")), HasSubstr("label '2' is not 0 or 1"));
  EXPECT_THAT(message(with(0, "")), HasSubstr("label '' is not 0 or 1"));
  EXPECT_THAT(message(with(0, "10")), HasSubstr("label '10' is not 0 or 1"));
  EXPECT_THAT(message(with(3, "1.5")), HasSubstr("integer field I3 '1.5' is not a decimal integer"));
  EXPECT_THAT(message(with(3, "abc")), HasSubstr("integer field I3 'abc' is not a decimal integer"));
  EXPECT_THAT(message(with(13, "-")), HasSubstr("integer field I13 '-' is not a decimal integer"));
  EXPECT_THAT(message(with(1, "+4")), HasSubstr("integer field I1 '+4'"));
  EXPECT_THAT(message(with(1, "9223372036854775808")),
              HasSubstr("I1 '9223372036854775808' is outside the int64 range"));
  EXPECT_THAT(message(with(1, "-9223372036854775809")), HasSubstr("outside the int64 range"));
  EXPECT_THAT(message(with(14, "68fd1e6g")), HasSubstr("categorical field C1 '68fd1e6g' is not a hex string"));
  EXPECT_THAT(message(with(39, "0x12")), HasSubstr("categorical field C26 '0x12' is not a hex string"));
  EXPECT_THAT(message(with(20, "12345678901234567")), HasSubstr("C7 '12345678901234567' has 17 hex digits"));
  EXPECT_THAT(message(with(20, "ab cd")), HasSubstr("C7 'ab cd' is not a hex string"));
  EXPECT_THAT(message("1\n2"), HasSubstr("holds a '\\n'"));
  // Messages are one line.
  EXPECT_THAT(message(with(20, "ab\rcd")), Not(HasSubstr("\n")));
}

TEST(AppendCriteoLineTest, WrittenLinesReadBack) {
  std::mt19937_64 rng(42);
  const CriteoLayout layout{13, 26};
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> counts(13), ids(26);
    for (auto& c : counts) c = static_cast<int64_t>(rng() >> (rng() % 64));  // every magnitude, 0 included
    for (auto& id : ids) id = static_cast<int64_t>(rng() >> (rng() % 65));   // negative ids too (>> 0)
    const float label = static_cast<float>(trial % 2);
    std::string line;
    AppendCriteoLine(label, counts, ids, &line);
    ASSERT_EQ(line.back(), '\n');
    line.pop_back();
    auto p = Parse(line, layout);
    ASSERT_TRUE(p.ok()) << p.status() << " " << line;
    EXPECT_EQ(p->ids, ids);
    for (int d = 0; d < 13; ++d) EXPECT_EQ(p->dense[d], CriteoDenseValue(counts[d]));
    EXPECT_EQ(p->label, label);
  }
  std::string zero;
  AppendCriteoLine(0, std::vector<int64_t>{0, -2}, std::vector<int64_t>{0, 255}, &zero);
  EXPECT_EQ(zero, "0\t0\t-2\t0\tff\n");
}

class ExpandCriteoFilesTest : public testing::TempDirTest {};

TEST_F(ExpandCriteoFilesTest, GlobsSortedAndInOrder) {
  for (const char* name : {"train-00002.gz", "train-00000.gz", "train-00001.gz", "test.gz"}) {
    testing::WriteBytes(Path(name), {'1'}, false);
  }
  std::filesystem::create_directories(Path("train-dir"));
  auto files = ExpandCriteoFiles(Path("train-*") + "," + Path("test.gz"));
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{Path("train-00000.gz"), Path("train-00001.gz"), Path("train-00002.gz"),
                                              Path("test.gz")}));  // the directory is not a file
  EXPECT_THAT(ExpandCriteoFiles(Path("valid-*")).status().message(),
              AllOf(HasSubstr(Path("valid-*")), HasSubstr("match no file")));
  EXPECT_THAT(ExpandCriteoFiles(Path("train-dir")).status().message(), HasSubstr("match no file"));
  EXPECT_THAT(ExpandCriteoFiles("").status().message(), HasSubstr("the list is empty"));
  EXPECT_THAT(ExpandCriteoFiles(" , ").status().message(), HasSubstr("the list is empty"));
}

TEST(CtrGeneratorDenseTest, DenseFeaturesAreLogCountsThatInvert) {
  CtrConfig config;
  config.seed = 3;
  const CtrGenerator gen = *CtrGenerator::Create(config);
  const int64_t n = 4096;
  std::vector<int64_t> ids(n * 26);
  std::vector<float> dense(n * 13), labels(n);
  ASSERT_TRUE(gen.FillBatch(0, 0, n, ids.data(), dense.data(), labels.data()).ok());
  int64_t zeros = 0, largest = 0;
  for (float x : dense) {
    const int64_t c = CtrGenerator::DenseCount(x);
    ASSERT_GE(c, 0) << x;
    ASSERT_EQ(CriteoDenseValue(c), x);
    zeros += c == 0;
    largest = std::max(largest, c);
  }
  // c = floor(exp(1 + 1.5 z)) is 0 when z < -2/3: Φ(-2/3) = 0.2525 of them.
  const double share = static_cast<double>(zeros) / static_cast<double>(dense.size());
  EXPECT_NEAR(share, 0.2525, 4 * std::sqrt(0.2525 * 0.7475 / static_cast<double>(dense.size())));
  EXPECT_LE(largest, 1785);  // floor(exp(1 + 1.5 Φ^-1(1 - 2^-17)))
  EXPECT_GT(largest, 50);
  EXPECT_EQ(CtrGenerator::DenseCount(0.5f), -1);  // log(1 + c) of no integer c
  EXPECT_EQ(CtrGenerator::DenseCount(-1.0f), -1);
  EXPECT_EQ(CtrGenerator::DenseCount(std::nanf("")), -1);
}

TEST(CtrGeneratorDenseTest, BatchPartsAreRowsOfTheBatch) {
  CtrConfig config;
  config.seed = 8;
  const CtrGenerator gen = *CtrGenerator::Create(config);
  std::vector<int64_t> ids(100 * 26), part_ids(30 * 26);
  std::vector<float> dense(100 * 13), labels(100), part_dense(30 * 13), part_labels(30);
  ASSERT_TRUE(gen.FillBatch(2, 5, 100, ids.data(), dense.data(), labels.data()).ok());
  ASSERT_TRUE(gen.FillBatchPart(2, 5, 40, 30, part_ids.data(), part_dense.data(), part_labels.data()).ok());
  EXPECT_TRUE(std::equal(part_ids.begin(), part_ids.end(), ids.begin() + 40 * 26));
  EXPECT_TRUE(std::equal(part_dense.begin(), part_dense.end(), dense.begin() + 40 * 13));
  EXPECT_TRUE(std::equal(part_labels.begin(), part_labels.end(), labels.begin() + 40));
  EXPECT_THAT(gen.FillBatchPart(0, 0, -1, 1, ids.data(), dense.data(), labels.data()).message(),
              HasSubstr("none may be negative"));
}

}  // namespace
}  // namespace psflow::data
