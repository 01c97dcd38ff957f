// psflow_criteo_dump: prints what the Criteo-layout reader (psflow/data/criteo.h) makes of files, as
// JSON, so that another reader (src/data/criteo_check.py: Python's gzip and csv) can compare.
//   psflow_criteo_dump FILE_PATTERN [NUM_DENSE NUM_FIELDS]
// prints {"ids": [[...], ...], "dense": [[...], ...], "labels": [...], "bad_lines": n}; an error is
// one line on stderr and exit status 1.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "psflow/data/criteo.h"

int main(int argc, char** argv) {
  using namespace psflow::data;
  if (argc != 2 && argc != 4) {
    std::fprintf(stderr, "usage: %s FILE_PATTERN [NUM_DENSE NUM_FIELDS]\n", argv[0]);
    return 2;
  }
  CriteoReaderOptions options;
  if (argc == 4) options.layout = {std::atoi(argv[2]), std::atoi(argv[3])};
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "psflow_criteo_dump: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  absl::StatusOr<std::vector<std::string>> files = ExpandCriteoFiles(argv[1]);
  if (!files.ok()) return fail(files.status());
  auto reader = CriteoReader::Open(WholeFiles(*files), options);
  if (!reader.ok()) return fail(reader.status());
  const int f = options.layout.num_fields, d = options.layout.num_dense;
  nlohmann::json ids = nlohmann::json::array(), dense = nlohmann::json::array(), labels = nlohmann::json::array();
  std::vector<int64_t> id(f);
  std::vector<float> x(d);
  float label;
  for (;;) {
    absl::StatusOr<int64_t> n = (*reader)->Read(1, id.data(), x.data(), &label);
    if (!n.ok()) return fail(n.status());
    if (*n == 0) break;
    ids.push_back(id);
    dense.push_back(x);
    labels.push_back(label);
  }
  nlohmann::json out;
  out["ids"] = ids;
  out["dense"] = dense;
  out["labels"] = labels;
  out["bad_lines"] = (*reader)->bad_lines();
  std::cout << out.dump() << "\n";
  return 0;
}
