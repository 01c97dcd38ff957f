// Fuzzes the IDX reader (psflow/data/idx.h), plain and gzip: data files are downloaded and may be
// truncated, corrupt or hostile.
//
// ReadIdxFile reads a path (through an io::Env, and psflow has no in-memory one), so each input is
// written to a memfd and read back through /proc/self/fd/N (no disk traffic). The first input byte picks
// the mode: even = the rest as is (raw bytes, which may themselves look like gzip), odd = the rest
// gzip-compressed here, so the fuzzer also explores the IDX parser behind the decompressor.
//
// Beyond "no crash", the reader is checked against an independent statement of the format: it may
// accept only a well-formed unsigned-byte IDX file whose size matches its header exactly, must
// then return exactly its dims and data, and must accept every such file of plausible size.
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "psflow/data/idx.h"

namespace {

int MemFd() {
  static const int fd = [] {
    const int fd = memfd_create("fuzz_idx", MFD_CLOEXEC);
    if (fd < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    return fd;
  }();
  return fd;
}

void WriteMemFd(const std::string& bytes) {
  const int fd = MemFd();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
    std::perror("memfd write");
    std::abort();
  }
}

std::string Gzip(const std::string& in) {
  z_stream z{};
  if (deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 15 + 16 /* gzip wrapper */, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    std::abort();
  }
  std::string out(deflateBound(&z, in.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// The format, stated independently of the reader. `plausible` is false when a prefix product of
// the dimensions exceeds 2^36 elements, which the reader may refuse as implausible (real MNIST
// files hold under 2^26 bytes).
struct Expected {
  bool valid = false;
  bool plausible = true;
  std::vector<int64_t> dims;
  std::string data;
};

Expected Describe(const std::string& f) {
  Expected e;
  if (f.size() < 4 || f[0] != 0 || f[1] != 0 || static_cast<uint8_t>(f[2]) != 0x08 || f[3] == 0) return e;
  const size_t ndims = static_cast<uint8_t>(f[3]);
  const size_t header = 4 + 4 * ndims;
  if (f.size() < header) return e;
  // Up to 255 dims of 32 bits overflow any fixed width: saturate just above the limit instead.
  using u128 = unsigned __int128;
  u128 elements = 1;
  for (size_t d = 0; d < ndims; ++d) {
    const auto* b = reinterpret_cast<const uint8_t*>(f.data() + 4 + 4 * d);
    const uint64_t dim = (uint64_t{b[0]} << 24) | (uint64_t{b[1]} << 16) | (uint64_t{b[2]} << 8) | b[3];
    e.dims.push_back(static_cast<int64_t>(dim));
    elements *= dim;
    if (elements > (u128{1} << 36)) {
      e.plausible = false;
      elements = (u128{1} << 36) + 1;  // still too large for any input, or 0 after a zero dim
    }
  }
  e.valid = elements == f.size() - header;
  e.data = f.substr(header);
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool compress = data[0] & 1;
  const std::string idx(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string file = compress ? Gzip(idx) : idx;
  WriteMemFd(file);
  const std::string path = "/proc/self/fd/" + std::to_string(MemFd());
  absl::StatusOr<psflow::data::IdxArray> array = psflow::data::ReadIdxFile(path);

  // Raw input that starts like gzip is decompressed by the reader: only "no crash" applies.
  const bool raw_gzip =
      !compress && idx.size() >= 2 && static_cast<uint8_t>(idx[0]) == 0x1f && static_cast<uint8_t>(idx[1]) == 0x8b;
  if (raw_gzip) return 0;
  const Expected expected = Describe(idx);
  if (array.ok()) {
    if (!expected.valid || array->dims != expected.dims ||
        std::string(array->data.begin(), array->data.end()) != expected.data) {
      std::fprintf(stderr, "reader accepted a file the format does not allow, or misread it\n");
      std::abort();
    }
  } else {
    if (array.status().message().find(path) == std::string::npos) std::abort();  // errors name the file
    if (expected.valid && expected.plausible) {
      std::fprintf(stderr, "reader refused a well-formed file: %s\n", array.status().ToString().c_str());
      std::abort();
    }
  }
  return 0;
}
