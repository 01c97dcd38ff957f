// psflow/ckpt/safetensors_stream.h — the safetensors layout (safetensors.h) written and read in
// parts, for tensors bigger than anyone should hold twice (embedding tables: docs/tables.md#semantics,
// checkpoints), with float32 (F32) and int64 (I64) tensors.
//
// Writing: the header comes first in the file but needs every tensor's size, which a streamed
// tensor only knows at its end. SafetensorsWriter therefore appends each streamed tensor's data to
// its own temporary file (PATH.tmp.K) as it comes; Finish writes PATH.tmp = the 8-byte length,
// the JSON header, then each tensor's data (a tensor given whole straight from memory, a streamed
// one copied from its temporary file in 1 MiB pieces), syncs it and renames it over PATH (atomic,
// as io::WriteFileAtomically). Memory: one 1 MiB buffer beyond the caller's own parts. A writer
// destroyed without a successful Finish removes its temporary files (best effort); a crash leaves
// them, and ckpt::SaveCheckpoint removes them after its next successful save.
// The CRC-32 (zlib) of every tensor's name and bytes in name order is computed on the way
// (Crc32(): the checkpoints' "psflow.crc32", the same value checkpoint.cc computes from memory).
//
// Reading: SafetensorsReader reads and checks the header only; Crc32() reads the data section once;
// a tensor is read whole (ReadF32, ReadI64) or in parts (OpenStream: its own file handle, so a
// table's columns — ids, values, slots — are read side by side, one part at a time).
// All files go through an io::Env (borrowed). A writer or reader is used by one thread at a time.
#ifndef PSFLOW_CKPT_SAFETENSORS_STREAM_H_
#define PSFLOW_CKPT_SAFETENSORS_STREAM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/core/tensor.h"
#include "psflow/io/env.h"

namespace psflow::ckpt {

enum class Dtype { kF32, kI64 };
const char* DtypeName(Dtype dtype);  // "F32", "I64"
inline size_t DtypeBytes(Dtype dtype) { return dtype == Dtype::kF32 ? 4 : 8; }

class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, io::Env* env = io::Env::Default());
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // A tensor given whole; `t` (or `data`, shape.elements() values) is borrowed until Finish.
  absl::Status AddF32(const std::string& name, const Tensor* t);
  absl::Status AddI64(const std::string& name, Shape shape, const int64_t* data);
  // A streamed tensor: [rows, row_shape...], rows being what Append gives. Returns its handle.
  absl::StatusOr<int> BeginStreamed(const std::string& name, Dtype dtype, Shape row_shape);
  // Appends `elements` values (a whole number of rows) to streamed tensor `handle`.
  absl::Status Append(int handle, const void* data, size_t elements);

  // Name-ordered CRC-32 of the tensors added so far (names and bytes).
  uint32_t Crc32() const;
  // Writes the file with `metadata` (atomic; see above). The writer is done after it.
  absl::Status Finish(const std::map<std::string, std::string>& metadata);

  const std::string& path() const { return path_; }

 private:
  struct Entry;
  absl::Status CheckName(const std::string& name) const;
  absl::Status AssembleTemporary(const std::string& header);

  const std::string path_;
  io::Env* const env_;
  std::vector<std::unique_ptr<Entry>> entries_;
  bool finished_ = false;
};

struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // offsets in the data section
  int64_t elements() const;
};

class SafetensorsReader {
 public:
  // Reads the header of `path`: DataLoss naming the file for a short file, a header length beyond
  // 256 MiB, bad JSON, an unknown dtype, a shape that does not match its byte count, or overlapping
  // data ranges. (Ranges beyond the end of the file are found when read, or by Crc32.)
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path,
                                                                 io::Env* env = io::Env::Default());

  const std::vector<TensorEntry>& tensors() const { return entries_; }  // in file order
  const TensorEntry* Find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  // Reads the data section once (1 MiB at a time): the name-ordered CRC-32 of names and bytes, as
  // SafetensorsWriter::Crc32. DataLoss when the file ends before a tensor's data does.
  absl::StatusOr<uint32_t> Crc32() const;
  absl::StatusOr<Tensor> ReadF32(const std::string& name) const;
  absl::StatusOr<std::vector<int64_t>> ReadI64(const std::string& name) const;

  // A tensor's data read from its start in parts, through its own file handle.
  class Stream {
   public:
    // Reads the next `elements` values into `out` (elements <= remaining()).
    absl::Status Read(void* out, size_t elements);
    // Moves past the next `elements` values (elements <= remaining()).
    absl::Status Skip(size_t elements);
    int64_t remaining() const { return remaining_; }

   private:
    friend class SafetensorsReader;
    std::unique_ptr<io::SequentialFile> file_;
    const TensorEntry* entry_ = nullptr;
    int64_t remaining_ = 0;
  };
  // `dtype` must be the tensor's (an error naming it otherwise).
  absl::StatusOr<std::unique_ptr<Stream>> OpenStream(const std::string& name, Dtype dtype) const;

 private:
  SafetensorsReader(std::string path, io::Env* env) : path_(std::move(path)), env_(env) {}

  const std::string path_;
  io::Env* const env_;
  uint64_t data_start_ = 0;
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace psflow::ckpt

#endif  // PSFLOW_CKPT_SAFETENSORS_STREAM_H_
