// A ps task's disk tier killed mid-write, for disk_tier_kill_test.cc: opens the tier of ps task 0
// under argv[1], writes rows of table "dyn" (dynamic, dim 16, sgd) through a cache of 64 KiB until
// the tier has ingested some as table files (*.sst, what outlives a kill: the write-ahead log is off;
// two files, so that the first is surely recorded in the database's manifest),
// prints the ids it wrote last, then kills itself with SIGKILL (no destructor runs, nothing is
// cleaned up). With --before_ingest it kills itself once its first run's file is written, before
// the file is ingested (DiskTierOptions::before_ingest). Exit 1 with a line on any failure.
#include <signal.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "ps/server/table/disk_store.h"
#include "ps/server/table/table_shard.h"

namespace {

using namespace psflow::ps::table;  // NOLINT: a test helper

// RocksDB's table files under `dir`. Ingests (one run each) run one after another, each recorded in the database's
// manifest before the next begins: a second file means the first is part of the database.
int TableFiles(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    // The database's files (NNNNNN.sst), not a run's before its ingest (run-N.sst): an ingest links
    // run-N.sst into the database and then removes that name, so both names may be there at once.
    const std::string name = e.path().filename().string();
    n += e.path().extension() == ".sst" && name.rfind("run-", 0) != 0 ? 1 : 0;
  }
  return n;
}

int Run(const std::string& root, bool before_ingest) {
  DiskTierOptions options{root, 64 << 10, 0};
  if (before_ingest) {
    // Killed with its first run's file written and not ingested: a run interrupted by the kill.
    options.before_ingest = [](const std::string& path) {
      std::cout << "wrote " << path << std::endl;
      raise(SIGKILL);
    };
  }
  auto tier = DiskTier::Open(options, nullptr);
  if (!tier.ok()) {
    std::cerr << tier.status().message() << "\n";
    return 1;
  }
  TableConfig config;
  config.spec.name = "dyn";
  config.spec.kind = psflow::dist::TableKind::kDynamic;
  config.spec.dim = 16;
  config.spec.initializer = psflow::dist::TableInitializer::Uniform(-1, 1, 7);
  SparseRuleConfig rule;
  rule.optimizer.name = "sgd";
  rule.optimizer.learning_rate = 0.1f;
  auto shard = MakeTableShard(config, rule, 0, 1, tier->get());
  if (!shard.ok()) {
    std::cerr << shard.status().message() << "\n";
    return 1;
  }
  std::vector<int64_t> ids(256);
  std::vector<float> grads(ids.size() * 16, 0.25f);
  int64_t next = 1000;
  for (int64_t step = 1; step <= 20000; ++step) {
    for (int64_t& id : ids) id = next++;
    if (absl::Status s = (*shard)->Apply(ids, grads, step); !s.ok()) {
      std::cerr << s.message() << "\n";
      return 1;
    }
    if (step % 100 == 0 && TableFiles((*tier)->dir()) >= 2) {
      std::cout << "wrote ids 1000.." << next - 1 << std::endl;
      raise(SIGKILL);
    }
  }
  std::cerr << "no table file after 20000 batches\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "--before_ingest")) {
    std::cerr << "usage: disk_tier_killed_writer TABLE_DIR [--before_ingest]\n";
    return 2;
  }
  return Run(argv[1], argc == 3);
}
