// A ps task's disk tables seen from outside (issue 26.6; docs/table-storage.md): Telemetry turns
// each table's counters into Prometheus samples per ps task and table (cache hits and misses, the
// cache's and the disk's bytes, rows read from and written to disk) and TensorBoard curves under
// ps_N/ (table/NAME/{cache_hit_rate, cache_bytes, disk_bytes, disk_rows_read_per_sec,
// disk_rows_written_per_sec}); the hit rate is the interval's, not the run's. A memory table shows
// none of them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tboard/event_reader.h"
#include "train/telemetry.h"

namespace psflow::train {
namespace {

namespace fs = std::filesystem;

ps::TableTaskStats Disk(int64_t hits, int64_t misses, int64_t read, int64_t written) {
  ps::TableTaskStats t;
  t.table = "field_00";
  t.storage = "disk";
  t.rows = 500;
  t.bytes = 48000;  // its rows in the task's cache, and its index
  t.cache_hits = hits;
  t.cache_misses = misses;
  t.disk_bytes = 1 << 20;
  t.disk_rows_read = read;
  t.disk_rows_written = written;
  return t;
}

ps::TableTaskStats Memory() {
  ps::TableTaskStats t;
  t.table = "dense_ids";
  t.rows = 10;
  t.bytes = 960;
  return t;
}

TEST(TelemetryTablesTest, DiskCountersArePrometheusSamplesAndTensorBoardCurvesPerPsAndTable) {
  const fs::path dir = fs::path(::testing::TempDir()) / absl::StrCat("telemetry_tables_", getpid());
  fs::remove_all(dir);
  TrainOptions options;
  options.logdir = dir.string();
  std::vector<std::string> lines;
  LogSink log = [&](const std::string& line) { lines.push_back(line); };
  std::string prometheus;
  {
    auto telemetry = Telemetry::Create(options, /*write_events=*/true, "ps_1", log);
    ASSERT_TRUE(telemetry.ok()) << telemetry.status();
    (*telemetry)->OnPsTableStats(1, 100, {Disk(90, 10, 10, 4), Memory()});
    // The next interval: 60 hits and 40 misses since (a hit rate of 0.6, whatever the run's).
    (*telemetry)->OnPsTableStats(1, 200, {Disk(150, 50, 50, 30), Memory()});
    prometheus = (*telemetry)->registry().Render();
  }
  for (const std::string sample : {"psflow_table_cache_hits_total{ps=\"1\",table=\"field_00\"} 150",
                                   "psflow_table_cache_misses_total{ps=\"1\",table=\"field_00\"} 50",
                                   "psflow_table_bytes{ps=\"1\",table=\"field_00\"} 48000",
                                   "psflow_table_disk_bytes{ps=\"1\",table=\"field_00\"} 1048576",
                                   "psflow_table_disk_rows_read_total{ps=\"1\",table=\"field_00\"} 50",
                                   "psflow_table_disk_rows_written_total{ps=\"1\",table=\"field_00\"} 30"}) {
    EXPECT_NE(prometheus.find(sample), std::string::npos) << sample << " not in\n" << prometheus;
  }
  EXPECT_EQ(prometheus.find("psflow_table_cache_hits_total{ps=\"1\",table=\"dense_ids\"}"), std::string::npos);

  auto files = tboard::FindEventFiles((dir / "ps_1").string());
  ASSERT_TRUE(files.ok() && files->size() == 1u) << files.status();
  auto events = tboard::ReadEventFile(files->front());
  ASSERT_TRUE(events.ok()) << events.status();
  std::map<std::pair<int64_t, std::string>, float> scalars;
  for (const tboard::EventRecord& e : *events) {
    for (const auto& [tag, value] : e.scalars) scalars[{e.step, tag}] = value;
  }
  auto at = [&](int64_t step, const std::string& tag) -> const float* {
    auto it = scalars.find({step, tag});
    return it == scalars.end() ? nullptr : &it->second;
  };
  ASSERT_NE(at(100, "table/field_00/cache_bytes"), nullptr);
  EXPECT_EQ(*at(100, "table/field_00/cache_bytes"), 48000.0f);
  ASSERT_NE(at(200, "table/field_00/disk_bytes"), nullptr);
  EXPECT_EQ(*at(200, "table/field_00/disk_bytes"), 1048576.0f);
  // Rates need an interval: from the second report on.
  EXPECT_EQ(at(100, "table/field_00/cache_hit_rate"), nullptr);
  ASSERT_NE(at(200, "table/field_00/cache_hit_rate"), nullptr);
  EXPECT_FLOAT_EQ(*at(200, "table/field_00/cache_hit_rate"), 0.6f);
  ASSERT_NE(at(200, "table/field_00/disk_rows_read_per_sec"), nullptr);
  EXPECT_GT(*at(200, "table/field_00/disk_rows_read_per_sec"), 0.0f);
  ASSERT_NE(at(200, "table/field_00/disk_rows_written_per_sec"), nullptr);
  EXPECT_GT(*at(200, "table/field_00/disk_rows_written_per_sec"), 0.0f);
  // A memory table: its rows, no disk curve.
  EXPECT_NE(at(200, "table/dense_ids/rows"), nullptr);
  EXPECT_EQ(at(200, "table/dense_ids/cache_hit_rate"), nullptr);
  EXPECT_EQ(at(200, "table/dense_ids/disk_bytes"), nullptr);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace psflow::train
