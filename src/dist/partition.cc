// psflow/dist/partition.cc — partitioners and placement (TF 1.x semantics,
// docs/design.md#partitioners-and-placement).
#include "psflow/dist/partition.h"

#include <algorithm>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/check.h"
#include "dist/next_ps.h"
#include "psflow/dist/cluster.h"

namespace psflow::dist {
namespace {

// Debian's abseil has its own absl::string_view (not std::string_view): convert at the API edge.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr int64_t kFloatBytes = 4;
constexpr int64_t kGlobalStepBytes = 8;  // an int64 scalar, as TF's byte_size_load_fn counts it

constexpr absl::string_view kPartitionerForms =
    "use none, fixed:N, min_max:P[:MIN_SLICE_BYTES] or axis_size:MAX_SHARD_BYTES";

absl::Status BadPartitioner(absl::string_view flag, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--partitioner=", flag, " ", why, ": ", kPartitionerForms));
}

// A positive count, e.g. the N of fixed:N.
bool ParsePositiveInt(absl::string_view text, int* out) { return absl::SimpleAtoi(text, out) && *out >= 1; }

// A positive byte count with an optional K/M/G suffix (powers of 1024).
bool ParseBytes(absl::string_view text, int64_t* out) {
  int64_t multiplier = 1;
  if (!text.empty()) {
    switch (absl::ascii_toupper(text.back())) {
      case 'K':
        multiplier = int64_t{1} << 10;
        break;
      case 'M':
        multiplier = int64_t{1} << 20;
        break;
      case 'G':
        multiplier = int64_t{1} << 30;
        break;
      default:
        break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 1) return false;
  if (value > std::numeric_limits<int64_t>::max() / multiplier) return false;
  *out = value * multiplier;
  return true;
}

// a >= 0, b >= 1. Not (a + b - 1) / b, which overflows when b is near INT64_MAX
// (--partitioner=min_max:1:9223372036854775807).
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

}  // namespace

absl::StatusOr<PartitionerSpec> ParsePartitioner(std::string_view flag_in) {
  const absl::string_view flag = ToAbsl(flag_in);
  const absl::string_view text = absl::StripAsciiWhitespace(flag);
  PartitionerSpec spec;
  if (text.empty() || text == "none") return spec;
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  const absl::string_view kind = parts[0];
  if (kind == "fixed") {
    if (parts.size() != 2 || !ParsePositiveInt(parts[1], &spec.num_shards)) {
      return BadPartitioner(flag, "needs a shard count >= 1, e.g. fixed:2");
    }
    spec.kind = PartitionerKind::kFixedSize;
  } else if (kind == "min_max") {
    if (parts.size() < 2 || parts.size() > 3 || !ParsePositiveInt(parts[1], &spec.max_partitions)) {
      return BadPartitioner(flag, "needs a maximum partition count >= 1, e.g. min_max:8 or min_max:8:256K");
    }
    if (parts.size() == 3 && !ParseBytes(parts[2], &spec.min_slice_bytes)) {
      return BadPartitioner(flag, "has a bad MIN_SLICE_BYTES (a byte count >= 1, optional K/M/G suffix)");
    }
    spec.kind = PartitionerKind::kMinMax;
  } else if (kind == "axis_size") {
    if (parts.size() != 2 || !ParseBytes(parts[1], &spec.max_shard_bytes)) {
      return BadPartitioner(flag, "needs MAX_SHARD_BYTES >= 1 (optional K/M/G suffix), e.g. axis_size:1M");
    }
    spec.kind = PartitionerKind::kVariableAxisSize;
  } else {
    return BadPartitioner(flag, "is not a known partitioner");
  }
  return spec;
}

int NumShards(const PartitionerSpec& spec, const Shape& shape) {
  if (shape.empty() || spec.axis < 0 || spec.axis >= static_cast<int>(shape.size())) return 1;
  const int64_t dim = shape[spec.axis];
  if (dim <= 1) return 1;
  const int64_t total_bytes = kFloatBytes * NumElements(shape);
  int64_t shards = 1;
  switch (spec.kind) {
    case PartitionerKind::kNone:
      shards = 1;
      break;
    case PartitionerKind::kFixedSize:
      shards = std::min<int64_t>(spec.num_shards, dim);
      break;
    case PartitionerKind::kMinMax:
      CHECK_GE(spec.min_slice_bytes, 1);
      shards = std::min({dim, int64_t{spec.max_partitions}, CeilDiv(total_bytes, spec.min_slice_bytes)});
      break;
    case PartitionerKind::kVariableAxisSize: {
      CHECK_GE(spec.max_shard_bytes, 1);
      // total_bytes is a multiple of dim, so TF's float division is exact here.
      const int64_t bytes_per_slice = total_bytes / dim;
      if (bytes_per_slice == 0) return 1;  // other dims are zero: nothing to split
      const int64_t slices_per_shard = std::max<int64_t>(1, spec.max_shard_bytes / bytes_per_slice);
      shards = CeilDiv(dim, slices_per_shard);
      break;
    }
  }
  return static_cast<int>(std::max<int64_t>(1, shards));
}

std::vector<int64_t> ShardRows(int64_t dim, int num_shards) {
  CHECK_GE(num_shards, 1);
  CHECK_GE(dim, 0);
  std::vector<int64_t> rows(num_shards, dim / num_shards);
  for (int64_t i = 0; i < dim % num_shards; ++i) ++rows[i];
  return rows;
}

absl::StatusOr<PlacementStrategy> ParsePlacement(std::string_view flag_in) {
  const absl::string_view flag = ToAbsl(flag_in);
  const absl::string_view text = absl::StripAsciiWhitespace(flag);
  if (text == "round_robin") return PlacementStrategy::kRoundRobin;
  if (text == "greedy") return PlacementStrategy::kGreedy;
  return absl::InvalidArgumentError(
      absl::StrCat("--placement=", flag, " is not a placement strategy: use round_robin or greedy"));
}

int64_t ShardSpec::bytes() const { return kFloatBytes * NumElements(shape); }

std::vector<const ShardSpec*> PlacementPlan::ShardsOf(const std::string& variable) const {
  std::vector<const ShardSpec*> out;
  for (const ShardSpec& s : shards) {
    if (s.variable == variable) out.push_back(&s);
  }
  return out;
}

std::vector<const ShardSpec*> PlacementPlan::ShardsOn(int ps_task) const {
  std::vector<const ShardSpec*> out;
  for (const ShardSpec& s : shards) {
    if (s.ps_task == ps_task) out.push_back(&s);
  }
  return out;
}

double PlacementPlan::MaxOverMeanBytes() const {
  if (bytes_per_ps.empty()) return 1.0;
  int64_t total = 0;
  int64_t max = 0;
  for (int64_t b : bytes_per_ps) {
    total += b;
    max = std::max(max, b);
  }
  if (total == 0) return 1.0;
  return static_cast<double>(max) * static_cast<double>(bytes_per_ps.size()) / static_cast<double>(total);
}

std::string FormatTables(const PlacementPlan& plan);     // table_placement.cc
std::string TablesSignature(const PlacementPlan& plan);  // table_placement.cc

std::string PlacementPlan::ModelSignature() const {
  std::string out;
  for (const VariableSpec& v : variables) absl::StrAppend(&out, v.name, ShapeToString(v.shape), "\n");
  absl::StrAppend(&out, TablesSignature(*this));
  return out;
}

uint64_t PlacementPlan::ModelFingerprint() const { return Fnv1a64(ModelSignature()); }

std::string PlacementPlan::Format() const {
  std::string out = absl::StrFormat("%-32s %-14s %10d bytes -> /job:ps/task:%d\n", "global_step", "[]",
                                    kGlobalStepBytes, global_step_ps);
  for (const ShardSpec& s : shards) {
    absl::StrAppendFormat(&out, "%-32s %-14s %10d bytes -> /job:ps/task:%d\n", s.name, ShapeToString(s.shape),
                          s.bytes(), s.ps_task);
  }
  absl::StrAppend(&out, FormatTables(*this));
  for (int p = 0; p < num_ps; ++p) {
    absl::StrAppendFormat(&out, "/job:ps/task:%d holds %d bytes, %d parameters\n", p, bytes_per_ps[p],
                          params_per_ps[p]);
  }
  absl::StrAppendFormat(&out, "max/mean bytes over ps: %.3f\n", MaxOverMeanBytes());
  return out;
}

PlacementPlan PlanPlacement(const std::vector<VariableSpec>& variables, const PartitionerSpec& partitioner,
                            PlacementStrategy strategy, int num_ps) {
  CHECK_GE(num_ps, 1) << "PlanPlacement needs at least one ps task";
  PlacementPlan plan;
  plan.num_ps = num_ps;
  plan.variables = variables;
  plan.bytes_per_ps.assign(num_ps, 0);
  plan.params_per_ps.assign(num_ps, 0);

  int64_t round_robin_counter = 0;
  // Picks the ps for the next created variable (or shard) and advances the strategy's state.
  auto next_ps = [&] { return NextPs(strategy, round_robin_counter, plan.bytes_per_ps); };

  plan.global_step_ps = next_ps();
  plan.bytes_per_ps[plan.global_step_ps] += kGlobalStepBytes;

  std::set<std::string> names;
  for (const VariableSpec& v : variables) {
    CHECK(names.insert(v.name).second) << "PlanPlacement: duplicate variable name " << v.name;
    for (int64_t d : v.shape) CHECK_GE(d, 0) << "PlanPlacement: negative dimension in " << v.name;
    const int n = NumShards(partitioner, v.shape);
    const int axis = n > 1 ? partitioner.axis : 0;
    const std::vector<int64_t> rows = n > 1 ? ShardRows(v.shape[axis], n) : std::vector<int64_t>{};
    int64_t offset = 0;
    for (int i = 0; i < n; ++i) {
      ShardSpec shard;
      shard.variable = v.name;
      shard.name = n > 1 ? absl::StrCat(v.name, "/part_", i) : v.name;
      shard.shard_index = i;
      shard.num_shards = n;
      shard.axis = axis;
      shard.offset = offset;
      shard.shape = v.shape;
      if (n > 1) {
        shard.shape[axis] = rows[i];
        offset += rows[i];
      }
      shard.ps_task = next_ps();
      plan.bytes_per_ps[shard.ps_task] += shard.bytes();
      plan.params_per_ps[shard.ps_task] += NumElements(shard.shape);
      plan.shards.push_back(std::move(shard));
    }
  }
  return plan;
}

}  // namespace psflow::dist
