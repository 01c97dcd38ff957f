// ps/server/table/shard_checks.h — the checks both table shards run on rows from a peer or a file
// before touching anything (table_shard.h). Each failure is one line naming the table. Internal.
#ifndef PSFLOW_PS_SERVER_TABLE_SHARD_CHECKS_H_
#define PSFLOW_PS_SERVER_TABLE_SHARD_CHECKS_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "ps/server/table/table_config.h"
#include "ps/server/table/table_shard.h"

namespace psflow::ps::table {

// `floats` == ids * dim, else "table 'T': <what> has F floats for N ids of dim D".
absl::Status CheckRowsSize(const TableConfig& config, std::string_view what, size_t num_ids, size_t num_floats);
// Every value finite, else the first bad row's id.
absl::Status CheckFinite(const TableConfig& config, absl::Span<const int64_t> ids, absl::Span<const float> rows);
// No id twice, else the repeated id.
absl::Status CheckUnique(const TableConfig& config, absl::Span<const int64_t> ids);
// A checkpoint scan's options in range (table_shard.h ScanOptions), else InvalidArgument.
absl::Status CheckScanOptions(const TableConfig& config, const ScanOptions& options);
// FailedPrecondition: an increment since save `changed_since` that the shard cannot answer, its
// changes being known since save `known_since` only (-1: not at all).
absl::Status CannotIncrement(const TableConfig& config, int64_t changed_since, int64_t known_since);
// A part's sizes match the table's dim and the rule's slot count, and its ids ascend.
absl::Status CheckPart(const TableConfig& config, int num_slots, const RowsPart& part);

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_SHARD_CHECKS_H_
