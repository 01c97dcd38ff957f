// Fuzzes the checkpoint reader: the safetensors parser (psflow/ckpt/safetensors.h) and the
// checkpoint directory on top of it (psflow/ckpt/checkpoint.h). Checkpoint files come from disk
// and may be truncated, corrupt or hostile. Any input must give a TensorFile or an error, never a
// crash, an exception or undefined behaviour. An input that parses is then
//   - saved with SaveCheckpoint as step 1 (writer, checksum, atomic rename) and
//   - written as is, as the newer step 2, into the same directory;
// LoadLatestCheckpoint must then restore step 2 only when its checksum holds (equal to the parse),
// and otherwise skip it, naming it, and restore step 1 with exactly the tensors and metadata saved.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/safetensors.h"

namespace {

using psflow::ckpt::TensorFile;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}

// A checkpoint directory of this process, on tmpfs when there is one (the writer fsyncs). Never
// freed: the exit handler that removes the directory runs after static destructors would.
const std::string& ScratchDir() {
  static const std::string* const dir = [] {
    auto* d = new std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    *d += "/psflow_fuzz_ckpt_XXXXXX";
    if (mkdtemp(d->data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return d;
  }();
  return *dir;
}

void ClearDir(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) std::filesystem::remove(entry.path());
}

bool SameTensors(const TensorFile& a, const TensorFile& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [name, t] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end()) return false;
    const psflow::Tensor& u = it->second;
    // Bytes, not floats: NaN payloads must survive too.
    if (t.shape() != u.shape() || t.bytes() != u.bytes() ||
        (t.bytes() > 0 && std::memcmp(t.data(), u.data(), t.bytes()) != 0)) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<TensorFile> file = psflow::ckpt::ParseSafetensors(bytes, "fuzz");
  if (!file.ok()) {
    if (file.status().message().empty()) Fail("error without a message");
    return 0;
  }
  for (const auto& [name, t] : file->tensors) {
    // Every tensor holds exactly the floats its shape promises, and they came from the input.
    if (psflow::NumElements(t.shape()) != t.size() || t.bytes() > size) Fail("tensor size disagrees with its shape");
  }

  const std::string& dir = ScratchDir();
  ClearDir(dir);
  std::vector<std::pair<std::string, const psflow::Tensor*>> order;
  for (const auto& [name, t] : file->tensors) order.emplace_back(name, &t);
  if (!psflow::ckpt::SaveCheckpoint(dir, 1, order, file->metadata, /*keep=*/2).ok()) Fail("SaveCheckpoint failed");
  {
    std::ofstream raw(dir + "/model.ckpt-2.safetensors", std::ios::binary);
    raw.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::vector<std::string> skipped;
  auto loaded = psflow::ckpt::LoadLatestCheckpoint(dir, &skipped);
  if (!loaded.ok() || !loaded->has_value()) Fail("no checkpoint restored");
  const psflow::ckpt::Checkpoint& ckpt = **loaded;
  if (ckpt.global_step == 2) {
    // The input carried a valid checksum of its own: it is restored as parsed.
    if (!skipped.empty() || !SameTensors(ckpt.contents, *file) || ckpt.contents.metadata != file->metadata) {
      Fail("restored step 2 differs from its parse");
    }
    return 0;
  }
  if (ckpt.global_step != 1 || skipped.size() != 1 || skipped[0].find("model.ckpt-2") == std::string::npos) {
    Fail("a bad newer checkpoint was not skipped by name");
  }
  // Step 1 is what was saved: the input's tensors and metadata, plus the step and checksum.
  std::map<std::string, std::string> expected = file->metadata;
  std::map<std::string, std::string> restored = ckpt.contents.metadata;
  expected["global_step"] = "1";
  expected.erase("psflow.crc32");
  if (restored.erase("psflow.crc32") != 1 || restored != expected) Fail("metadata changed through a checkpoint");
  if (!SameTensors(ckpt.contents, *file)) Fail("tensors changed through a checkpoint");
  return 0;
}
