// Fuzzes the safetensors reader (psflow/ckpt/safetensors.h): checkpoint files come from disk and
// may be truncated, corrupt or hostile. Any input must give a TensorFile or an error, never a crash,
// an exception or undefined behaviour. A file that parses must also survive a round trip through
// the writer: what WriteSafetensors stores, ParseSafetensors reads back identically.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "psflow/ckpt/safetensors.h"

namespace {

// A directory for the round trip, on tmpfs when there is one (the writer fsyncs every file).
const std::string& ScratchPath() {
  static const std::string path = [] {
    std::string dir = (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    dir += "/psflow_fuzz_safetensors_XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    static std::string dir_copy = dir;
    std::atexit([] {
      std::remove((dir_copy + "/t.safetensors").c_str());
      rmdir(dir_copy.c_str());
    });
    return dir + "/t.safetensors";
  }();
  return path;
}

bool SameTensor(const psflow::Tensor& a, const psflow::Tensor& b) {
  // Bytes, not floats: NaN payloads must survive too.
  return a.shape() == b.shape() && a.bytes() == b.bytes() &&
         (a.bytes() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<psflow::ckpt::TensorFile> file = psflow::ckpt::ParseSafetensors(bytes, "fuzz");
  if (!file.ok()) {
    if (file.status().message().empty()) std::abort();  // errors must say what is wrong
    return 0;
  }
  for (const auto& [name, t] : file->tensors) {
    // Every tensor holds exactly the floats its shape promises, within the input.
    if (psflow::NumElements(t.shape()) != t.size() || t.bytes() > size) std::abort();
  }

  std::vector<std::pair<std::string, const psflow::Tensor*>> order;
  for (const auto& [name, t] : file->tensors) order.emplace_back(name, &t);
  const std::string& path = ScratchPath();
  if (!psflow::ckpt::WriteSafetensors(path, order, file->metadata).ok()) std::abort();
  std::ifstream in(path, std::ios::binary);
  std::stringstream written;
  written << in.rdbuf();
  absl::StatusOr<psflow::ckpt::TensorFile> again = psflow::ckpt::ParseSafetensors(written.str(), path);
  if (!again.ok()) {
    std::fprintf(stderr, "round trip does not parse: %s\n", again.status().ToString().c_str());
    std::abort();
  }
  if (again->metadata != file->metadata || again->tensors.size() != file->tensors.size()) std::abort();
  for (const auto& [name, t] : file->tensors) {
    auto it = again->tensors.find(name);
    if (it == again->tensors.end() || !SameTensor(t, it->second)) std::abort();
  }
  return 0;
}
