// EventWriter → files → ReadEventFile round trips, corruption detection, and the cross-check with
// decode_events.py, an independent decoder written in plain Python.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "psflow/tboard/event_writer.h"
#include "tboard/event_reader.h"

namespace psflow::tboard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string MakeTempDir() {
  std::string pattern = (fs::temp_directory_path() / "psflow_tboard_XXXXXX").string();
  CHECK_NE(mkdtemp(pattern.data()), nullptr);
  return pattern;
}

class EventFileTest : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(dir_); }
  const std::string dir_ = MakeTempDir();
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  std::FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

TEST_F(EventFileTest, RoundTripsScalarsWithFileVersionFirst) {
  const double before = NowSeconds();
  absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_TRUE(std::regex_match(fs::path((*writer)->path()).filename().string(),
                               std::regex(absl::StrCat("events\\.out\\.tfevents\\.[0-9]{10}\\.", host))))
      << (*writer)->path();
  EXPECT_EQ(fs::path((*writer)->path()).parent_path(), fs::path(dir_));

  ASSERT_TRUE((*writer)->AddScalar("loss", 2.25f, 0).ok());
  ASSERT_TRUE((*writer)->AddScalars({{"loss", 0.5f}, {"learning_rate", 0.01f}, {"global_step/sec", 123.5f}}, 100).ok());
  ASSERT_TRUE((*writer)->AddScalars({}, 150).ok());  // writes nothing
  ASSERT_TRUE((*writer)->AddSessionStart(200).ok());
  ASSERT_TRUE((*writer)->AddScalar("accuracy/test", 0.9921875f, (int64_t{1} << 40)).ok());
  ASSERT_TRUE((*writer)->Flush().ok());
  const std::string path = (*writer)->path();
  ASSERT_TRUE((*writer)->Close().ok());
  const double after = NowSeconds();

  absl::StatusOr<std::vector<EventRecord>> records = ReadEventFile(path);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 5u);
  const std::vector<EventRecord>& r = *records;
  EXPECT_EQ(r[0].file_version, "brain.Event:2");
  EXPECT_EQ(r[0].step, 0);
  EXPECT_TRUE(r[0].scalars.empty());
  for (const EventRecord& e : r) {
    EXPECT_GE(e.wall_time, std::floor(before));
    EXPECT_LE(e.wall_time, after + 1);
  }
  using Scalars = std::vector<std::pair<std::string, float>>;
  EXPECT_EQ(r[1].step, 0);
  EXPECT_EQ(r[1].scalars, (Scalars{{"loss", 2.25f}}));
  EXPECT_EQ(r[2].step, 100);
  EXPECT_EQ(r[2].scalars, (Scalars{{"loss", 0.5f}, {"learning_rate", 0.01f}, {"global_step/sec", 123.5f}}));
  EXPECT_TRUE(r[2].file_version.empty());
  EXPECT_EQ(r[3].step, 200);
  EXPECT_TRUE(r[3].session_start);
  EXPECT_TRUE(r[3].scalars.empty());
  EXPECT_EQ(r[4].step, int64_t{1} << 40);
  EXPECT_EQ(r[4].scalars, (Scalars{{"accuracy/test", 0.9921875f}}));

  // Closed writers refuse further work instead of writing to a closed file.
  EXPECT_EQ((*writer)->AddScalar("loss", 1, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Flush().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*writer)->Close().ok());
}

TEST_F(EventFileTest, RecordsReachTheFileBeforeFlushOrClose) {
  absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->AddScalar("loss", 1.0f, 7).ok());
  absl::StatusOr<std::vector<EventRecord>> records = ReadEventFile((*writer)->path());  // writer still open
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[1].step, 7);
}

TEST_F(EventFileTest, CreatesMissingDirectoriesAndNeverOverwritesAFile) {
  const std::string ps_dir = dir_ + "/run/ps_0";
  absl::StatusOr<std::unique_ptr<EventWriter>> first = EventWriter::Create(ps_dir);
  absl::StatusOr<std::unique_ptr<EventWriter>> second = EventWriter::Create(ps_dir);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE((*first)->path(), (*second)->path());
  ASSERT_TRUE((*first)->AddScalar("ps/bytes_in_per_sec", 1, 1).ok());
  ASSERT_TRUE((*second)->AddScalar("ps/bytes_in_per_sec", 2, 1).ok());
  first->reset();
  second->reset();  // the destructor flushes and closes

  absl::StatusOr<std::vector<std::string>> files = FindEventFiles(dir_);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  std::vector<float> values;
  for (const std::string& file : *files) {
    absl::StatusOr<std::vector<EventRecord>> records = ReadEventFile(file);
    ASSERT_TRUE(records.ok()) << records.status();
    ASSERT_EQ(records->size(), 2u);
    values.push_back((*records)[1].scalars.at(0).second);
  }
  EXPECT_THAT(values, ::testing::UnorderedElementsAre(1.0f, 2.0f));
}

TEST_F(EventFileTest, CreateFailsNamingTheDirectory) {
  const std::string not_a_dir = dir_ + "/plain_file";
  WriteBytes(not_a_dir, "x");
  absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Create(not_a_dir + "/logs");
  ASSERT_FALSE(writer.ok());
  EXPECT_THAT(writer.status().message(), HasSubstr(not_a_dir + "/logs"));
}

TEST_F(EventFileTest, ConcurrentWritersProduceIntactRecords) {
  absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  constexpr int kThreads = 4, kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_TRUE((*writer)->AddScalar(absl::StrCat("thread_", t), static_cast<float>(i), i).ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_TRUE((*writer)->Close().ok());
  absl::StatusOr<std::vector<EventRecord>> records = ReadEventFile((*writer)->path());
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 1u + kThreads * kPerThread);
  std::vector<int> next(kThreads, 0);  // each thread's records stay in its own order
  for (size_t i = 1; i < records->size(); ++i) {
    const EventRecord& e = (*records)[i];
    ASSERT_EQ(e.scalars.size(), 1u);
    const int t = e.scalars[0].first.back() - '0';
    EXPECT_EQ(e.step, next[t]);
    EXPECT_EQ(e.scalars[0].second, static_cast<float>(next[t]));
    ++next[t];
  }
}

// Writes one file, then corrupts a copy of it.
class CorruptionTest : public EventFileTest {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Create(dir_);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->AddScalar("loss", 0.5f, 100).ok());
    ASSERT_TRUE((*writer)->AddScalar("loss", 0.25f, 200).ok());
    path_ = (*writer)->path();
    ASSERT_TRUE((*writer)->Close().ok());
    bytes_ = ReadBytes(path_);
    ASSERT_TRUE(ReadEventFile(path_).ok());
    // Byte offset of record 1: record 0 is 12 header bytes + the file_version event + 4 CRC bytes.
    uint64_t length0;
    std::memcpy(&length0, bytes_.data(), sizeof(length0));
    record1_ = 12 + length0 + 4;
  }
  std::string Corrupted(size_t offset) {
    std::string bad = bytes_;
    bad[offset] = static_cast<char>(bad[offset] ^ 0x20);
    return bad;
  }
  std::string path_, bytes_;
  size_t record1_ = 0;
};

TEST_F(CorruptionTest, PayloadByteFailsTheDataCrc) {
  WriteBytes(path_, Corrupted(record1_ + 12 + 3));
  absl::StatusOr<std::vector<EventRecord>> records = ReadEventFile(path_);
  ASSERT_FALSE(records.ok());
  EXPECT_THAT(records.status().message(),
              HasSubstr(absl::StrCat(path_, ": record 1 at byte ", record1_, ": data CRC mismatch")));
}

TEST_F(CorruptionTest, LengthByteFailsTheLengthCrc) {
  WriteBytes(path_, Corrupted(record1_ + 1));
  absl::StatusOr<std::vector<EventRecord>> records = ReadEventFile(path_);
  ASSERT_FALSE(records.ok());
  EXPECT_THAT(records.status().message(),
              HasSubstr(absl::StrCat(path_, ": record 1 at byte ", record1_, ": length CRC mismatch")));
}

TEST_F(CorruptionTest, TruncatedFileIsReported) {
  WriteBytes(path_, bytes_.substr(0, bytes_.size() - 2));
  absl::StatusOr<std::vector<EventRecord>> records = ReadEventFile(path_);
  ASSERT_FALSE(records.ok());
  EXPECT_THAT(records.status().message(), HasSubstr("record 2"));
  EXPECT_THAT(records.status().message(), HasSubstr("cut short"));
}

TEST_F(CorruptionTest, PythonDecoderReportsTheCorruptionToo) {
  WriteBytes(path_, Corrupted(record1_ + 12 + 3));
  CommandResult result = RunCommand(absl::StrCat("/usr/bin/python3 ", PSFLOW_DECODE_EVENTS_PY, " ", path_));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr(absl::StrCat("record 1 at byte ", record1_, ": data CRC mismatch")));

  WriteBytes(path_, Corrupted(record1_ + 1));
  result = RunCommand(absl::StrCat("/usr/bin/python3 ", PSFLOW_DECODE_EVENTS_PY, " ", path_));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr(absl::StrCat("record 1 at byte ", record1_, ": length CRC mismatch")));
}

// The second, independent decoder must print exactly what was written, float bits included.
TEST_F(EventFileTest, PythonDecoderReadsWhatWasWritten) {
  const std::vector<float> values = {0.0f,
                                     -0.0f,
                                     1.0f,
                                     -2.5f,
                                     0.1f,
                                     3.4028235e38f,
                                     1e-45f,  // denormal
                                     std::numeric_limits<float>::infinity(),
                                     std::numeric_limits<float>::quiet_NaN()};
  std::vector<std::string> expected;
  absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  expected.push_back("file_version\t0\tbrain.Event:2");
  ASSERT_TRUE((*writer)->AddSessionStart(300).ok());
  expected.push_back("session_log\t300\t1");
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t step = 100 * static_cast<int64_t>(i) + 300;
    const std::string tag = i % 2 ? "loss" : "ps/bytes_in_per_sec";
    ASSERT_TRUE((*writer)->AddScalars({{tag, values[i]}, {"learning_rate", 0.05f}}, step).ok());
    expected.push_back(absl::StrFormat("scalar\t%d\t%s\t0x%08x", step, tag, Bits(values[i])));
    expected.push_back(absl::StrFormat("scalar\t%d\tlearning_rate\t0x%08x", step, Bits(0.05f)));
  }
  ASSERT_TRUE((*writer)->AddScalar("examples/sec", 1234.5f, -1).ok());  // a negative int64 is 10 varint bytes
  expected.push_back(absl::StrFormat("scalar\t-1\texamples/sec\t0x%08x", Bits(1234.5f)));
  ASSERT_TRUE((*writer)->Close().ok());

  const CommandResult result =
      RunCommand(absl::StrCat("/usr/bin/python3 ", PSFLOW_DECODE_EVENTS_PY, " ", (*writer)->path()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::string> lines = absl::StrSplit(result.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), expected.size()) << result.output;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string line = lines[i];
    if (line.starts_with("scalar\t")) {
      // Drop Python's printed value (the last field) after checking it reads back to the same float.
      const size_t last_tab = line.rfind('\t');
      const float printed = std::strtof(line.c_str() + last_tab + 1, nullptr);
      const std::vector<std::string> fields = absl::StrSplit(line, '\t');
      const uint32_t bits = static_cast<uint32_t>(std::stoul(fields[3], nullptr, 16));
      float written;
      std::memcpy(&written, &bits, sizeof(written));
      if (std::isnan(written)) {
        EXPECT_TRUE(std::isnan(printed)) << line;
      } else {
        EXPECT_EQ(Bits(printed), bits) << line;
      }
      line.resize(last_tab);
    }
    EXPECT_EQ(line, expected[i]);
  }
}

TEST_F(EventFileTest, DumpToolCountsRecordsPerTag) {
  for (const std::string sub : {"", "/ps_0"}) {
    absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Create(dir_ + sub);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (int step = 0; step < 3; ++step) ASSERT_TRUE((*writer)->AddScalars({{"a", 1}, {"b" + sub, 2}}, step).ok());
    ASSERT_TRUE((*writer)->AddScalar("a", 3.5f, 3).ok());
  }
  const CommandResult result = RunCommand(absl::StrCat(PSFLOW_EVENTS_DUMP, " ", dir_));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("3\ta\t3.5\n"));
  EXPECT_THAT(result.output, HasSubstr("0\tfile_version\tbrain.Event:2\n"));
  EXPECT_THAT(result.output, HasSubstr(": 5 records\n"));
  EXPECT_THAT(result.output, HasSubstr("  a\t4\n  b\t3\n"));
  EXPECT_THAT(result.output, HasSubstr("  a\t4\n  b/ps_0\t3\n"));

  const CommandResult missing = RunCommand(absl::StrCat(PSFLOW_EVENTS_DUMP, " ", dir_, "/nothing_here"));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr(dir_ + "/nothing_here"));
}

}  // namespace
}  // namespace psflow::tboard
