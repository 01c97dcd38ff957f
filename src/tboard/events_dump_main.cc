// psflow_events_dump — prints what TensorBoard event files hold, after checking every record's
// CRCs: one line per scalar (step, tag, value), then the number of records per tag of each file.
//   psflow_events_dump [--counts] PATH...    (PATH: an event file or a --logdir, searched recursively)
// Exits 1 on the first unreadable or corrupt file.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "tboard/event_reader.h"

namespace {

int DumpFile(const std::string& path, bool counts_only) {
  absl::StatusOr<std::vector<psflow::tboard::EventRecord>> records = psflow::tboard::ReadEventFile(path);
  if (!records.ok()) {
    std::fprintf(stderr, "psflow_events_dump: %s\n", std::string(records.status().message()).c_str());
    return 1;
  }
  std::printf("file %s: %zu records\n", path.c_str(), records->size());
  std::map<std::string, int> records_per_tag;
  for (const psflow::tboard::EventRecord& record : *records) {
    if (!record.file_version.empty() && !counts_only) {
      std::printf("%lld\tfile_version\t%s\n", static_cast<long long>(record.step), record.file_version.c_str());
    }
    if (record.session_start && !counts_only) {
      std::printf("%lld\tsession_start\n", static_cast<long long>(record.step));
    }
    for (const auto& [tag, value] : record.scalars) {
      ++records_per_tag[tag];
      // %.9g prints every float exactly enough to read it back bit for bit.
      if (!counts_only) std::printf("%lld\t%s\t%.9g\n", static_cast<long long>(record.step), tag.c_str(), value);
    }
  }
  std::printf("records per tag in %s:\n", path.c_str());
  for (const auto& [tag, count] : records_per_tag) std::printf("  %s\t%d\n", tag.c_str(), count);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checks and prints TensorBoard event files (scalars and the number of records per tag)."};
  std::vector<std::string> paths;
  bool counts_only = false;
  app.add_option("paths", paths, "event files or log directories (searched recursively)")->required();
  app.add_flag("--counts", counts_only, "print only the number of records per tag");
  CLI11_PARSE(app, argc, argv);

  for (const std::string& path : paths) {
    absl::StatusOr<std::vector<std::string>> files = psflow::tboard::FindEventFiles(path);
    if (!files.ok()) {
      std::fprintf(stderr, "psflow_events_dump: %s\n", std::string(files.status().message()).c_str());
      return 1;
    }
    if (files->empty()) std::printf("no event files under %s\n", path.c_str());
    for (const std::string& file : *files) {
      if (DumpFile(file, counts_only) != 0) return 1;
    }
  }
  return 0;
}
