// psflow/core/check.h — CHECK macros for programmer errors only (broken invariants inside psflow).
// Never use them for bad input from a user, a file or a peer: return absl::Status instead.
// (Debian 12's abseil 20220623 predates absl/log, so this small stand-in exists.)
#ifndef PSFLOW_CORE_CHECK_H_
#define PSFLOW_CORE_CHECK_H_

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace psflow::internal {
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    stream_ << file << ":" << line << ": CHECK failed: " << cond << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};
}  // namespace psflow::internal

#define CHECK(cond) \
  if (cond) {       \
  } else            \
    ::psflow::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()
#define CHECK_EQ(a, b) CHECK((a) == (b))
#define CHECK_NE(a, b) CHECK((a) != (b))
#define CHECK_LT(a, b) CHECK((a) < (b))
#define CHECK_LE(a, b) CHECK((a) <= (b))
#define CHECK_GT(a, b) CHECK((a) > (b))
#define CHECK_GE(a, b) CHECK((a) >= (b))

#endif  // PSFLOW_CORE_CHECK_H_
