// The Criteo-layout reader (psflow/data/criteo.h) against the generator that wrote the files: the
// generator's batches come back bit for bit, plain and gzip; slices cut at every point read each line
// once; every bad input fails with one line naming file and line, or is skipped and counted.
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "data/heap_allocations_testing.h"
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

struct Examples {
  std::vector<int64_t> ids;
  std::vector<float> dense, labels;
  bool operator==(const Examples&) const = default;
  size_t size() const { return labels.size(); }
};

CriteoReaderOptions SmallChunks(CriteoLayout layout = {}) {
  CriteoReaderOptions o;
  o.layout = layout;
  o.chunk_bytes = 4096;  // many chunks even for small files
  o.parse_threads = 3;
  o.read_ahead_chunks = 2;
  return o;
}

// Everything the reader gives, `batch` at a time, or its error.
absl::StatusOr<Examples> ReadAll(std::vector<CriteoSlice> slices, CriteoReaderOptions options, int64_t batch = 64,
                                 int64_t* bad_lines = nullptr) {
  auto reader = CriteoReader::Open(std::move(slices), options);
  if (!reader.ok()) return reader.status();
  const int f = options.layout.num_fields, d = options.layout.num_dense;
  Examples all;
  std::vector<int64_t> ids(batch * f);
  std::vector<float> dense(batch * d), labels(batch);
  for (;;) {
    absl::StatusOr<int64_t> n = (*reader)->Read(batch, ids.data(), dense.data(), labels.data());
    if (!n.ok()) return n.status();
    all.ids.insert(all.ids.end(), ids.begin(), ids.begin() + *n * f);
    all.dense.insert(all.dense.end(), dense.begin(), dense.begin() + *n * d);
    all.labels.insert(all.labels.end(), labels.begin(), labels.begin() + *n);
    if (*n == 0) break;
  }
  absl::StatusOr<int64_t> after = (*reader)->Read(batch, ids.data(), dense.data(), labels.data());
  EXPECT_TRUE(after.ok() && *after == 0);  // the end stays the end
  EXPECT_EQ((*reader)->examples_read(), static_cast<int64_t>(all.size()));
  if (bad_lines != nullptr) *bad_lines = (*reader)->bad_lines();
  return all;
}

CtrGenerator Generator(uint64_t seed) {
  CtrConfig config;
  config.seed = seed;
  return *CtrGenerator::Create(config);
}

void WriteText(const std::string& path, const std::string& text, bool gzip) {
  testing::WriteBytes(path, std::vector<uint8_t>(text.begin(), text.end()), gzip);
}

class CriteoReaderTest : public testing::TempDirTest {};

// generator → files → reader gives exactly FillBatch(0, s, B) for s = 0, 1, … and the test set.
TEST_F(CriteoReaderTest, GeneratorFilesReadBackBitForBit) {
  const CtrGenerator gen = Generator(11);
  for (bool gzip : {false, true}) {
    CtrFilesOptions o;
    o.out_dir = Path(gzip ? "gz" : "plain");
    o.files = 3;
    o.examples_per_file = 500;  // not a multiple of B: batches straddle files
    o.batch_size = 128;
    o.test_examples = 300;
    o.gzip = gzip;
    auto paths = WriteCtrFiles(gen, o);
    ASSERT_TRUE(paths.ok()) << paths.status();
    ASSERT_EQ(paths->size(), 4u);
    EXPECT_THAT(paths->back(), HasSubstr(gzip ? "/test.gz" : "/test"));
    auto files = ExpandCriteoFiles(o.out_dir + "/train-*");
    ASSERT_TRUE(files.ok()) << files.status();
    ASSERT_EQ(files->size(), 3u);
    auto got = ReadAll(WholeFiles(*files), SmallChunks(), o.batch_size);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 1500u);
    Examples want;
    for (int64_t s = 0; s * 128 < 1500; ++s) {
      const int64_t n = std::min<int64_t>(128, 1500 - s * 128);
      std::vector<int64_t> ids(128 * 26);
      std::vector<float> dense(128 * 13), labels(128);
      ASSERT_TRUE(gen.FillBatch(0, s, 128, ids.data(), dense.data(), labels.data()).ok());
      want.ids.insert(want.ids.end(), ids.begin(), ids.begin() + n * 26);
      want.dense.insert(want.dense.end(), dense.begin(), dense.begin() + n * 13);
      want.labels.insert(want.labels.end(), labels.begin(), labels.begin() + n);
    }
    EXPECT_TRUE(*got == want) << (gzip ? "gzip" : "plain");
    // Batches of another size: the same stream.
    auto odd = ReadAll(WholeFiles(*files), SmallChunks(), 7);
    ASSERT_TRUE(odd.ok()) << odd.status();
    EXPECT_TRUE(*odd == want);
    // The test file is the test set.
    auto test = ReadAll(WholeFiles({paths->back()}), SmallChunks(), 1000);
    ASSERT_TRUE(test.ok()) << test.status();
    const CtrExamples set = *gen.TestSet(300);
    EXPECT_EQ(test->ids, set.ids);
    EXPECT_EQ(test->dense, set.dense);
    EXPECT_EQ(test->labels, set.labels);
  }
}

TEST_F(CriteoReaderTest, ThreadsAndChunkSizesDoNotChangeTheStream) {
  CtrFilesOptions o;
  o.out_dir = dir();
  o.files = 1;
  o.examples_per_file = 3000;
  o.test_examples = 0;
  ASSERT_TRUE(WriteCtrFiles(Generator(2), o).ok());
  const std::vector<CriteoSlice> slices = WholeFiles({Path("train-00000")});
  auto base = ReadAll(slices, SmallChunks(), 100);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_EQ(base->size(), 3000u);
  for (int threads : {1, 2, 5}) {
    for (int64_t chunk : {int64_t{4096}, int64_t{100000}, int64_t{1} << 22}) {
      CriteoReaderOptions options = SmallChunks();
      options.parse_threads = threads;
      options.chunk_bytes = chunk;
      options.read_ahead_chunks = threads;
      auto got = ReadAll(slices, options, 333);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(*got == *base) << threads << " threads, chunks of " << chunk;
    }
  }
}

// Lines of varied lengths (ids of 1 to 16 hex digits, missing values), some CRLF, maybe no final '\n'.
std::string VariedText(int lines, uint64_t seed, bool final_newline) {
  std::mt19937_64 rng(seed);
  std::string text;
  for (int i = 0; i < lines; ++i) {
    std::vector<std::string> fields = {std::to_string(rng() % 2)};
    for (int d = 0; d < 13; ++d)
      fields.push_back(rng() % 9 == 0 ? "" : std::to_string(static_cast<int64_t>(rng() >> (1 + rng() % 63))));
    for (int f = 0; f < 26; ++f) fields.push_back(rng() % 9 == 0 ? "" : absl::StrFormat("%x", rng() >> (rng() % 64)));
    text += absl::StrJoin(fields, "\t");
    text += i % 7 == 3 ? "\r\n" : "\n";
  }
  if (!final_newline) text.pop_back();
  return text;
}

// Slices cutting one file at any points read each of its lines exactly once, in order.
TEST_F(CriteoReaderTest, SlicesCoverEveryLineExactlyOnce) {
  for (bool gzip : {false, true}) {
    for (bool final_newline : {true, false}) {
      const std::string text = VariedText(40, gzip * 2 + final_newline, final_newline);
      const std::string path = Path(absl::StrCat("varied", gzip, final_newline));
      WriteText(path, text, gzip);
      auto whole = ReadAll(WholeFiles({path}), SmallChunks());
      ASSERT_TRUE(whole.ok()) << whole.status();
      ASSERT_EQ(whole->size(), 40u);
      const auto size = static_cast<int64_t>(text.size());
      // One cut at every point (both slices), including 0 and past the end.
      for (int64_t cut = 0; cut <= size + 2; cut += gzip ? 7 : 1) {
        auto got = ReadAll({{path, 0, cut}, {path, cut, CriteoSlice::kToEnd}}, SmallChunks(), 16);
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_TRUE(*got == *whole) << "cut at " << cut << " of " << size << (gzip ? " gzip" : "");
      }
      // Many random cuts.
      std::mt19937_64 rng(7);
      for (int trial = 0; trial < (gzip ? 20 : 200); ++trial) {
        std::vector<int64_t> cuts = {0, size};
        for (int k = 0, n = 1 + static_cast<int>(rng() % 30); k < n; ++k) {
          cuts.push_back(static_cast<int64_t>(rng() % (size + 1)));
        }
        std::sort(cuts.begin(), cuts.end());
        std::vector<CriteoSlice> slices;
        for (size_t i = 0; i + 1 < cuts.size(); ++i) slices.push_back({path, cuts[i], cuts[i + 1]});
        auto got = ReadAll(slices, SmallChunks(), 5);
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_TRUE(*got == *whole) << "trial " << trial;
      }
    }
  }
}

// One reader per slice sharing a CriteoOpenFiles (as the work queue's worker reads) gives the
// lines a single reader of the same slices gives, whether the next slice continues the kept stream
// (the slice right after, or one further on), goes back in the file, or is another file's.
TEST_F(CriteoReaderTest, ReadersSharingOpenFilesReadTheSameLines) {
  for (bool gzip : {false, true}) {
    std::vector<std::string> paths, texts;
    for (int f = 0; f < 2; ++f) {
      paths.push_back(Path(absl::StrCat("open_files", gzip, f)));
      texts.push_back(VariedText(60, 10 + f, f == 0));
      WriteText(paths.back(), texts.back(), gzip);
    }
    std::mt19937_64 rng(11);
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<CriteoSlice> slices;  // each file cut at random points; some slices left out or repeated
      for (size_t f = 0; f < paths.size(); ++f) {
        const std::string& path = paths[f];
        const auto size = static_cast<int64_t>(texts[f].size()) + 8;  // past the text's end is fine
        std::vector<int64_t> cuts = {0, CriteoSlice::kToEnd};
        for (int k = 0, n = 1 + static_cast<int>(rng() % 12); k < n; ++k) cuts.push_back(rng() % size);
        std::sort(cuts.begin(), cuts.end());
        for (size_t i = 0; i + 1 < cuts.size(); ++i) {
          if (rng() % 4 != 0) slices.push_back({path, cuts[i], cuts[i + 1]});
        }
      }
      if (trial % 3 == 1) std::shuffle(slices.begin(), slices.end(), rng);  // back and forth, file to file
      if (trial % 3 == 2 && !slices.empty()) slices.push_back(slices[rng() % slices.size()]);  // a slice again
      if (slices.empty()) continue;
      auto expected = ReadAll(slices, SmallChunks(), 7);
      ASSERT_TRUE(expected.ok()) << expected.status();
      CriteoReaderOptions shared = SmallChunks();
      shared.open_files = std::make_shared<CriteoOpenFiles>();
      Examples got;
      for (const CriteoSlice& slice : slices) {
        auto part = ReadAll({slice}, shared, 7);
        ASSERT_TRUE(part.ok()) << part.status();
        got.ids.insert(got.ids.end(), part->ids.begin(), part->ids.end());
        got.dense.insert(got.dense.end(), part->dense.begin(), part->dense.end());
        got.labels.insert(got.labels.end(), part->labels.begin(), part->labels.end());
      }
      ASSERT_TRUE(got == *expected) << "trial " << trial << (gzip ? " gzip" : "");
    }
    // The second slice beginning just before, at and just after each line start b where the first
    // ended: the kept stream stands at b, and the second slice's first line is b's only if it begins
    // at or before b.
    for (size_t b = 1; b < texts[0].size(); ++b) {
      if (texts[0][b - 1] != '\n') continue;
      for (int64_t delta : {-1, 0, 1, 2}) {
        const std::vector<CriteoSlice> pair = {{paths[0], 0, static_cast<int64_t>(b)},
                                               {paths[0], static_cast<int64_t>(b) + delta, CriteoSlice::kToEnd}};
        auto expected = ReadAll(pair, SmallChunks(), 7);
        ASSERT_TRUE(expected.ok()) << expected.status();
        CriteoReaderOptions shared = SmallChunks();
        shared.open_files = std::make_shared<CriteoOpenFiles>();
        auto first = ReadAll({pair[0]}, shared, 7);
        auto second = ReadAll({pair[1]}, shared, 7);
        ASSERT_TRUE(first.ok() && second.ok());
        ASSERT_EQ(first->size() + second->size(), expected->size()) << "line start " << b << " delta " << delta;
        EXPECT_EQ(
            std::vector<float>(expected->labels.begin() + static_cast<int64_t>(first->size()), expected->labels.end()),
            second->labels);
        EXPECT_EQ(shared.open_files->reused(), delta >= 0 ? 1 : 0);
      }
    }
    // In file order, every slice after the first of a file continues the kept stream.
    const std::string& path = paths[0];
    CriteoReaderOptions shared = SmallChunks();
    shared.open_files = std::make_shared<CriteoOpenFiles>();
    const int64_t step = 997;
    int64_t slices = 0;
    Examples got;
    for (int64_t begin = 0; begin < static_cast<int64_t>(texts[0].size()); begin += step, ++slices) {
      auto part = ReadAll({{path, begin, begin + step}}, shared, 7);
      ASSERT_TRUE(part.ok()) << part.status();
      got.labels.insert(got.labels.end(), part->labels.begin(), part->labels.end());
    }
    EXPECT_EQ(shared.open_files->reused(), slices - 1);
    auto whole = ReadAll(WholeFiles({path}), SmallChunks());
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(got.labels, whole->labels);
  }
}

TEST_F(CriteoReaderTest, LinesLongerThanAChunkAndEmptyFiles) {
  const CriteoLayout wide{5, 1000};  // ~17 KB lines, chunks of 4 KB
  std::string text;
  std::vector<int64_t> ids(1000);
  for (int i = 0; i < 20; ++i) {
    for (int f = 0; f < 1000; ++f) ids[f] = (int64_t{1} << 62) + i * 1000 + f;
    AppendCriteoLine(static_cast<float>(i % 2), std::vector<int64_t>{i, 1, 2, 3, 4}, ids, &text);
  }
  WriteText(Path("wide"), text, false);
  WriteText(Path("empty"), "", false);
  WriteText(Path("empty.gz"), "", true);
  auto got = ReadAll(WholeFiles({Path("empty"), Path("wide"), Path("empty.gz")}), SmallChunks(wide), 3);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 20u);
  EXPECT_EQ(got->ids[19 * 1000 + 999], (int64_t{1} << 62) + 19999);
  EXPECT_EQ(got->dense[19 * 5], CriteoDenseValue(19));
  auto slices = ReadAll({{Path("wide"), 0, 30000}, {Path("wide"), 30000, CriteoSlice::kToEnd}}, SmallChunks(wide), 3);
  ASSERT_TRUE(slices.ok()) << slices.status();
  EXPECT_TRUE(*slices == *got);
}

// A file of `good` good lines with `bad` at the 1-based line numbers given.
std::string WithBadLines(int good, const std::map<int, std::string>& bad) {
  std::string text;
  int written_good = 0;
  for (int line = 1; written_good < good || bad.count(line); ++line) {
    if (auto it = bad.find(line); it != bad.end()) {
      text += it->second + "\n";
    } else {
      std::vector<int64_t> counts(13, line), ids(26, line);
      AppendCriteoLine(1, counts, ids, &text);
      ++written_good;
    }
  }
  return text;
}

std::string GoodLineWith(int field, const std::string& value) {
  std::string line;
  AppendCriteoLine(1, std::vector<int64_t>(13, 5), std::vector<int64_t>(26, 0xab), &line);
  line.pop_back();
  std::vector<std::string> fields = absl::StrSplit(line, '\t');
  fields[field] = value;
  return absl::StrJoin(fields, "\t");
}

TEST_F(CriteoReaderTest, EveryBadLineFailsWithFileAndLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"1\t2\t3", "3 tab-separated fields; expected 40"},
      {GoodLineWith(14, "xyz"), "categorical field C1 'xyz' is not a hex string"},
      {GoodLineWith(2, "2.5"), "integer field I2 '2.5' is not a decimal integer"},
      {GoodLineWith(0, "yes"), "label 'yes' is not 0 or 1"},
      {GoodLineWith(30, "00112233445566778"), "has 17 hex digits"},
      {"", "1 tab-separated field; expected 40"},
  };
  for (bool gzip : {false, true}) {
    for (const auto& [line, what] : cases) {
      const std::string path = Path(gzip ? "bad.gz" : "bad");
      WriteText(path, WithBadLines(3000, {{2345, line}}), gzip);
      auto got = ReadAll(WholeFiles({Path("ok"), path}), SmallChunks());  // "ok" does not exist yet
      EXPECT_THAT(got.status().message(), HasSubstr(Path("ok") + ": cannot open it: No such file"));
      WriteText(Path("ok"), WithBadLines(10, {}), false);
      got = ReadAll(WholeFiles({Path("ok"), path}), SmallChunks());
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(got.status().message(), AllOf(HasSubstr("data file " + path + " line 2345: "), HasSubstr(what),
                                                HasSubstr("--max_bad_lines"), Not(HasSubstr("\n"))));
      // Inside a slice the line number is still the file's.
      got = ReadAll({{path, 100000, CriteoSlice::kToEnd}}, SmallChunks());
      EXPECT_THAT(got.status().message(), HasSubstr(" line 2345: ")) << what;
      std::filesystem::remove(Path("ok"));
    }
  }
}

TEST_F(CriteoReaderTest, MaxBadLinesSkipsAndCounts) {
  WriteText(Path("two_bad"), WithBadLines(500, {{3, "1\tx"}, {401, GoodLineWith(5, "e")}}), false);
  CriteoReaderOptions options = SmallChunks();
  options.max_bad_lines = 2;
  int64_t bad = -1;
  auto got = ReadAll(WholeFiles({Path("two_bad")}), options, 64, &bad);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 500u);
  EXPECT_EQ(bad, 2);
  EXPECT_EQ(got->ids[2 * 26], 4);  // line 4 follows line 2 (line 3 skipped)
  options.max_bad_lines = 1;
  got = ReadAll(WholeFiles({Path("two_bad")}), options);
  EXPECT_THAT(got.status().message(),
              AllOf(HasSubstr("two_bad line 401: integer field I5 'e'"), HasSubstr("--max_bad_lines=1")));
}

TEST_F(CriteoReaderTest, TruncatedAndCorruptGzipFail) {
  const std::string text = WithBadLines(20000, {});
  WriteText(Path("whole.gz"), text, true);
  std::vector<uint8_t> bytes = testing::ReadBytes(Path("whole.gz"));
  ASSERT_GT(bytes.size(), 1000u);
  const std::vector<uint8_t> half(bytes.begin(), bytes.begin() + bytes.size() / 2);
  testing::WriteBytes(Path("half.gz"), half, false);
  auto reader = CriteoReader::Open(WholeFiles({Path("half.gz")}), SmallChunks());
  ASSERT_TRUE(reader.ok());
  std::vector<int64_t> ids(1000 * 26);
  std::vector<float> dense(1000 * 13), labels(1000);
  int64_t read = 0;
  absl::Status error;
  for (;;) {
    absl::StatusOr<int64_t> n = (*reader)->Read(1000, ids.data(), dense.data(), labels.data());
    if (!n.ok()) {
      error = n.status();
      break;
    }
    ASSERT_GT(*n, 0) << "a truncated file must not end quietly";
    read += *n;
  }
  EXPECT_EQ(error.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(error.message(),
              AllOf(HasSubstr("data file " + Path("half.gz") + " line " + std::to_string(read + 1) + ":"),
                    HasSubstr("truncated gzip stream")));
  EXPECT_GT(read, 1000);  // the lines before the damage were handed out
  EXPECT_EQ((*reader)->Read(1, ids.data(), dense.data(), labels.data()).status(), error);  // and it stays
  // A damaged checksum: every line decompresses, then the stream is refused.
  std::vector<uint8_t> corrupt = bytes;
  corrupt[corrupt.size() - 6] ^= 0x5a;  // the CRC-32 in the trailer
  testing::WriteBytes(Path("corrupt.gz"), corrupt, false);
  auto got = ReadAll(WholeFiles({Path("corrupt.gz")}), SmallChunks());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(),
              AllOf(HasSubstr(Path("corrupt.gz") + " line "), HasSubstr("corrupt gzip stream"), HasSubstr("check")));
  // Damage in the middle: either inflate refuses it, or it yields garbage that is a bad line; a
  // failure naming the file and a line either way.
  corrupt = bytes;
  for (size_t i = corrupt.size() / 3; i < corrupt.size() / 3 + 64; ++i) corrupt[i] ^= 0x5a;
  testing::WriteBytes(Path("corrupt.gz"), corrupt, false);
  got = ReadAll(WholeFiles({Path("corrupt.gz")}), SmallChunks());
  EXPECT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr(Path("corrupt.gz") + " line "));
  std::printf("damaged in the middle: %s\n", std::string(got.status().message()).c_str());
  // Two gzip members one after the other are one text (as gzip -d reads them).
  std::vector<uint8_t> twice = bytes;
  twice.insert(twice.end(), bytes.begin(), bytes.end());
  testing::WriteBytes(Path("twice.gz"), twice, false);
  got = ReadAll(WholeFiles({Path("twice.gz")}), SmallChunks());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 40000u);
}

TEST_F(CriteoReaderTest, BadOptionsAndArguments) {
  EXPECT_THAT(CriteoReader::Open({}, {}).status().message(), HasSubstr("the file list is empty"));
  CriteoReaderOptions o;
  o.parse_threads = 0;
  EXPECT_THAT(CriteoReader::Open(WholeFiles({"x"}), o).status().message(), HasSubstr("parse_threads is 0"));
  o = {};
  o.chunk_bytes = 10;
  EXPECT_THAT(CriteoReader::Open(WholeFiles({"x"}), o).status().message(), HasSubstr("chunk_bytes is 10"));
  o = {};
  o.max_bad_lines = -1;
  EXPECT_THAT(CriteoReader::Open(WholeFiles({"x"}), o).status().message(), HasSubstr("max_bad_lines is -1"));
  EXPECT_THAT(CriteoReader::Open({{"x", 5, 2}}, {}).status().message(), HasSubstr("0 <= begin <= end"));
  auto reader = CriteoReader::Open(WholeFiles({Path("absent")}), {});
  ASSERT_TRUE(reader.ok());
  EXPECT_THAT((*reader)->Read(1, nullptr, nullptr, nullptr).status().message(), HasSubstr("is null"));
  float f[13], label;
  int64_t id[26];
  EXPECT_THAT((*reader)->Read(1, id, f, &label).status().message(),
              AllOf(HasSubstr("data file " + Path("absent") + ": cannot open it"), Not(HasSubstr(" line "))));
}

// After warm-up, reading allocates nothing per example or per batch: buffers are reused.
TEST_F(CriteoReaderTest, ReadingAllocatesNothingPerExample) {
  CtrFilesOptions o;
  o.out_dir = dir();
  o.examples_per_file = 20000;
  o.test_examples = 0;
  ASSERT_TRUE(WriteCtrFiles(Generator(4), o).ok());
  auto reader = CriteoReader::Open(WholeFiles({Path("train-00000")}), SmallChunks());
  ASSERT_TRUE(reader.ok());
  std::vector<int64_t> ids(100 * 26);
  std::vector<float> dense(100 * 13), labels(100);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(*(*reader)->Read(100, ids.data(), dense.data(), labels.data()), 100);
  const int64_t before = testing::HeapAllocations();
  int64_t examples = 0;
  for (;;) {
    const int64_t n = *(*reader)->Read(100, ids.data(), dense.data(), labels.data());
    examples += n;
    if (n < 100) break;
  }
  const int64_t allocations = testing::HeapAllocations() - before;
  EXPECT_EQ(examples, 15000);
  // Over 2000 chunks of 4 KB went by: a chunk's arrays grow only when it meets more lines than before.
  EXPECT_LT(allocations, 60) << "allocations while reading " << examples << " examples";
}

}  // namespace
}  // namespace psflow::data
