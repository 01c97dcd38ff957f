// Per-row initial values (row_init.h).
#include "ps/server/table/row_init.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "psflow/core/random.h"
#include "psflow/dist/table_routing.h"

namespace psflow::ps::table {
namespace {

// splitmix64 over one row's stream.
class RowStream {
 public:
  explicit RowStream(uint64_t state) : state_(state) {}
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return dist::Mix64(state_);
  }
  float Uniform() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    constexpr double kTwoPow53 = 9007199254740992.0;
    const double u1 = 1.0 - static_cast<double>(Next() >> 11) / kTwoPow53;  // (0, 1]
    const double u2 = static_cast<double>(Next() >> 11) / kTwoPow53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace

void RowInitializer::Fill(int64_t id, float* out, int64_t dim) const {
  switch (spec_.kind) {
    case InitKind::kZeros:
      std::fill(out, out + dim, 0.0f);
      return;
    case InitKind::kConstant:
      std::fill(out, out + dim, spec_.value);
      return;
    default:
      break;
  }
  RowStream stream(Rng::Mix(seed_, static_cast<uint64_t>(id)));
  for (int64_t i = 0; i < dim; ++i) {
    switch (spec_.kind) {
      case InitKind::kUniform:
        out[i] = spec_.minval + (spec_.maxval - spec_.minval) * stream.Uniform();
        break;
      case InitKind::kNormal:
        out[i] = static_cast<float>(spec_.mean + spec_.stddev * stream.Normal());
        break;
      case InitKind::kTruncatedNormal: {
        double z;
        do {
          z = stream.Normal();
        } while (std::abs(z) > 2.0);
        out[i] = static_cast<float>(spec_.mean + spec_.stddev * z);
        break;
      }
      default:
        break;
    }
  }
}

}  // namespace psflow::ps::table
