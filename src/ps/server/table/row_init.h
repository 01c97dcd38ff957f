// ps/server/table/row_init.h — a table row's initial value as a function of (table seed, id) only
// (docs/tables.md#semantics): never sent by the chief, the same on any number of ps tasks, whatever the shard,
// the partitioner or the order in which rows are first touched.
//
// Each row has its own counter-based stream: state0 = Rng::Mix(seed, uint64(id)), then splitmix64
// (state += 0x9e3779b97f4a7c15; output dist::Mix64(state)). Uniform floats take the top 24 bits;
// normals are Box-Muller on 53-bit uniforms (both values used, as core/random.h does); truncated
// normals redraw values beyond 2 stddev (core/init.h's TruncatedNormal). Immutable; thread-safe.
#ifndef PSFLOW_PS_SERVER_TABLE_ROW_INIT_H_
#define PSFLOW_PS_SERVER_TABLE_ROW_INIT_H_

#include <cstdint>

#include "ps/server/table/table_config.h"

namespace psflow::ps::table {

class RowInitializer {
 public:
  RowInitializer(const InitializerSpec& spec, uint64_t seed) : spec_(spec), seed_(seed) {}
  // Writes the initial value of row `id` into out[0, dim).
  void Fill(int64_t id, float* out, int64_t dim) const;

 private:
  InitializerSpec spec_;
  uint64_t seed_;
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_ROW_INIT_H_
