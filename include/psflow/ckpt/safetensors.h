// psflow/ckpt/safetensors.h — reading and writing tensors in the safetensors layout
// (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N, N bytes
// of JSON {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the raw little-endian data. Other tools read these
// files directly. Writes are atomic (io::WriteFileAtomically: temporary file, fsync, close, rename,
// directory fsync) — a crash or a full disk leaves the old file or the new one, never a torn one.
// All file access goes through an io::Env (the POSIX one unless a test passes another; borrowed).
// Stateless functions; thread-safe.
#ifndef PSFLOW_CKPT_SAFETENSORS_H_
#define PSFLOW_CKPT_SAFETENSORS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/core/tensor.h"
#include "psflow/io/env.h"

namespace psflow::ckpt {

struct TensorFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::vector<int64_t>> int64s;  // I64 tensors (ReadCheckpoint only), flattened
  std::map<std::string, std::string> metadata;
};

// Writes float32 tensors (stored in the given order) and string metadata to `path` atomically.
// Errors name the file and the cause ("cannot sync PATH.tmp: Input/output error").
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                              const std::map<std::string, std::string>& metadata, io::Env* env = io::Env::Default());

// Reads a file written in the layout above; F32 tensors only. Every inconsistency (short file,
// header length beyond the file, bad JSON, unknown dtype, offsets out of range or overlapping,
// shape not matching the byte count) is an error naming the file and the problem.
absl::StatusOr<TensorFile> ReadSafetensors(const std::string& path, io::Env* env = io::Env::Default());
// The same, from bytes in memory (the fuzzer's entry point); `name` is used in messages.
absl::StatusOr<TensorFile> ParseSafetensors(std::string_view bytes, const std::string& name);

}  // namespace psflow::ckpt

#endif  // PSFLOW_CKPT_SAFETENSORS_H_
