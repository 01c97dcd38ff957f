// Fuzzes the cluster and flag parsers of psflow/dist (cluster.h, partition.h): TF_CONFIG comes from
// the environment and the host lists and partitioner from the command line. Every input goes to
// every parser, so JSON seeds and flag seeds share one corpus:
//   - ClusterSpec::FromTfConfig(input) and ResolveCluster(TF_CONFIG = input);
//   - ClusterSpec::FromHostLists(ps, workers), the input split at its first newline;
//   - ParsePartitioner(input), then NumShards / ShardRows over a few shapes and PlanPlacement of a
//     small model; ParsePlacement(input);
//   - IsLoopbackHost(input).
// Properties beyond "no crash, no exception, no UB": a parsed cluster validates its own task and
// survives a round trip through its canonical host lists; shard counts stay within 1..dim.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_join.h"
#include "psflow/dist/cluster.h"
#include "psflow/dist/partition.h"

namespace {

using psflow::dist::ClusterSpec;

[[noreturn]] void Fail(const char* what, std::string_view input) {
  std::fprintf(stderr, "%s (input: %.*s)\n", what, static_cast<int>(input.size()), input.data());
  std::abort();
}

// The flags a parsed cluster prints must parse back to the same cluster.
void CheckRoundTrip(const ClusterSpec& spec, std::string_view input) {
  if (spec.Fingerprint() != psflow::dist::Fnv1a64(spec.ToString())) Fail("fingerprint mismatch", input);
  absl::StatusOr<ClusterSpec> again =
      ClusterSpec::FromHostLists(absl::StrJoin(spec.ps(), ","), absl::StrJoin(spec.workers(), ","));
  if (!again.ok() || !(*again == spec)) Fail("cluster does not survive its host lists", input);
}

void FuzzTfConfig(std::string_view input) {
  auto parsed = ClusterSpec::FromTfConfig(input);
  auto resolved = psflow::dist::ResolveCluster("", "", "", 0, input);
  if (!parsed.ok()) {
    if (parsed.status().message().empty()) Fail("empty error message", input);
    // Whitespace-only TF_CONFIG means "no cluster" to ResolveCluster; anything else must fail alike.
    if (resolved.ok() && !resolved->first.empty()) Fail("ResolveCluster accepted a bad TF_CONFIG", input);
    return;
  }
  const auto& [spec, task] = *parsed;
  if (!spec.Validate(task).ok()) Fail("TF_CONFIG task does not validate against its own cluster", input);
  (void)spec.address(task);
  CheckRoundTrip(spec, input);
  if (!resolved.ok() || resolved->first != spec || resolved->second != task) {
    Fail("ResolveCluster disagrees with FromTfConfig", input);
  }
}

void FuzzHostLists(std::string_view input) {
  const size_t newline = input.find('\n');
  const std::string_view ps = input.substr(0, newline);
  const std::string_view workers = newline == std::string_view::npos ? "" : input.substr(newline + 1);
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::FromHostLists(ps, workers);
  if (!spec.ok()) return;
  CheckRoundTrip(*spec, input);
  for (int i = 0; i < spec->num_ps(); ++i) {
    if (!spec->Validate({"ps", i}).ok()) Fail("listed ps task does not validate", input);
    (void)psflow::dist::IsLoopbackHost(spec->address({"ps", i}));
  }
  if (spec->Validate({"ps", spec->num_ps()}).ok()) Fail("ps index past the end validates", input);
}

void FuzzPartitioner(std::string_view input) {
  absl::StatusOr<psflow::dist::PartitionerSpec> spec = psflow::dist::ParsePartitioner(input);
  if (!spec.ok()) return;
  // Shapes like the seed models' variables, plus the edge cases.
  static const std::vector<psflow::Shape> kShapes = {
      {}, {0}, {1}, {7}, {3, 0}, {10, 784}, {784, 10}, {1000, 3}, {1 << 20, 512}, {int64_t{1} << 30, 64}};
  for (const psflow::Shape& shape : kShapes) {
    const int n = psflow::dist::NumShards(*spec, shape);
    const int64_t dim = shape.empty() ? 1 : shape[0];
    if (n < 1 || (dim >= 1 && n > dim)) Fail("shard count outside 1..dim", input);
    if (n > (1 << 16)) continue;  // ShardRows materializes one entry per shard: keep inputs fast
    int64_t rows = 0;
    for (int64_t r : psflow::dist::ShardRows(dim, n)) rows += r;
    if (rows != dim) Fail("shard rows do not add up to the dimension", input);
  }

  // A small model placed with the parsed partitioner on 1..4 ps: every row of every variable lands
  // in exactly one shard, and the ps byte counts add up to the model (plus global_step's 8 bytes).
  static const std::vector<psflow::dist::VariableSpec> kModel = {
      {"hidden/kernel", {784, 128}}, {"hidden/bias", {128}}, {"logits/kernel", {128, 10}}, {"logits/bias", {10}}};
  const int num_ps = 1 + static_cast<int>(input.size() % 4);
  for (auto strategy : {psflow::dist::PlacementStrategy::kRoundRobin, psflow::dist::PlacementStrategy::kGreedy}) {
    const psflow::dist::PlacementPlan plan = psflow::dist::PlanPlacement(kModel, *spec, strategy, num_ps);
    int64_t model_bytes = 8, placed_bytes = 0;
    for (int64_t b : plan.bytes_per_ps) placed_bytes += b;
    for (const psflow::dist::VariableSpec& v : kModel) {
      model_bytes += 4 * psflow::NumElements(v.shape);
      int64_t next_row = 0;
      for (const psflow::dist::ShardSpec* shard : plan.ShardsOf(v.name)) {
        if (shard->offset != next_row || shard->ps_task < 0 || shard->ps_task >= num_ps)
          Fail("shards leave a gap", input);
        next_row += shard->shape[shard->axis];
      }
      if (next_row != v.shape[0]) Fail("shards do not cover the variable", input);
    }
    if (placed_bytes != model_bytes) Fail("placed bytes differ from the model's", input);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  FuzzTfConfig(input);
  FuzzHostLists(input);
  FuzzPartitioner(input);
  (void)psflow::dist::ParsePlacement(input);
  (void)psflow::dist::IsLoopbackHost(input);
  return 0;
}
