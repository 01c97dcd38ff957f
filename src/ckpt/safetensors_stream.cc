// Streamed safetensors writer and reader (psflow/ckpt/safetensors_stream.h).
#include "psflow/ckpt/safetensors_stream.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace psflow::ckpt {
namespace {

constexpr size_t kPiece = size_t{1} << 20;
constexpr uint64_t kMaxHeader = uint64_t{256} << 20;

uint32_t Crc(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // crc32 takes a uInt length
    const uInt k = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, k));
    p += k;
    n -= k;
  }
  return crc;
}

// The name-ordered checksum from each tensor's own CRC (of its name, then its bytes).
uint32_t Combine(std::vector<std::pair<std::string, std::pair<uint32_t, uint64_t>>> crcs) {
  std::sort(crcs.begin(), crcs.end());
  uint32_t crc = static_cast<uint32_t>(crc32(0L, Z_NULL, 0));
  for (const auto& [name, c] : crcs)
    crc = static_cast<uint32_t>(crc32_combine(crc, c.first, static_cast<z_off_t>(c.second)));
  return crc;
}

}  // namespace

const char* DtypeName(Dtype dtype) { return dtype == Dtype::kF32 ? "F32" : "I64"; }

int64_t TensorEntry::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

struct SafetensorsWriter::Entry {
  std::string name;
  Dtype dtype = Dtype::kF32;
  Shape shape;                 // whole; streamed: the row shape (rows prepended at Finish)
  const void* data = nullptr;  // whole tensors
  uint64_t bytes = 0;
  uint32_t crc = 0;       // of name + bytes so far
  std::string temp_path;  // streamed tensors
  std::unique_ptr<io::WritableFile> temp;
};

SafetensorsWriter::SafetensorsWriter(std::string path, io::Env* env) : path_(std::move(path)), env_(env) {}

SafetensorsWriter::~SafetensorsWriter() {
  for (auto& e : entries_) {
    if (e->temp != nullptr) (void)e->temp->Close();
    if (!e->temp_path.empty()) (void)env_->RemoveFile(e->temp_path);
  }
  if (!finished_) (void)env_->RemoveFile(path_ + ".tmp");
}

absl::Status SafetensorsWriter::CheckName(const std::string& name) const {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path_, ": tensor '", name, "' added after Finish"));
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": a tensor cannot be named '", name, "'"));
  }
  for (const auto& e : entries_) {
    if (e->name == name) return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' is added twice"));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AddF32(const std::string& name, const Tensor* t) {
  if (auto s = CheckName(name); !s.ok()) return s;
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->shape = t->shape();
  e->data = t->data();
  e->bytes = t->bytes();
  e->crc = Crc(Crc(static_cast<uint32_t>(crc32(0L, Z_NULL, 0)), name.data(), name.size()), e->data, e->bytes);
  entries_.push_back(std::move(e));
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AddI64(const std::string& name, Shape shape, const int64_t* data) {
  if (auto s = CheckName(name); !s.ok()) return s;
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->dtype = Dtype::kI64;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  e->shape = std::move(shape);
  e->data = data;
  e->bytes = static_cast<uint64_t>(n) * 8;
  e->crc = Crc(Crc(static_cast<uint32_t>(crc32(0L, Z_NULL, 0)), name.data(), name.size()), e->data, e->bytes);
  entries_.push_back(std::move(e));
  return absl::OkStatus();
}

absl::StatusOr<int> SafetensorsWriter::BeginStreamed(const std::string& name, Dtype dtype, Shape row_shape) {
  if (auto s = CheckName(name); !s.ok()) return s;
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->dtype = dtype;
  e->shape = std::move(row_shape);
  e->temp_path = absl::StrCat(path_, ".tmp.", entries_.size());
  auto file = env_->NewWritableFile(e->temp_path);
  if (!file.ok()) return file.status();
  e->temp = *std::move(file);
  e->crc = Crc(static_cast<uint32_t>(crc32(0L, Z_NULL, 0)), name.data(), name.size());
  entries_.push_back(std::move(e));
  return static_cast<int>(entries_.size()) - 1;
}

absl::Status SafetensorsWriter::Append(int handle, const void* data, size_t elements) {
  if (handle < 0 || handle >= static_cast<int>(entries_.size()) || entries_[handle]->temp == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": Append to tensor ", handle, ", which is not streamed"));
  }
  Entry& e = *entries_[handle];
  int64_t row = 1;
  for (int64_t d : e.shape) row *= d;
  if (row > 0 && elements % static_cast<size_t>(row) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", e.name, "' gets ", elements, " values, not a whole number of rows of ", row));
  }
  const size_t bytes = elements * DtypeBytes(e.dtype);
  if (auto s = e.temp->Append(std::string_view(static_cast<const char*>(data), bytes)); !s.ok()) return s;
  e.bytes += bytes;
  e.crc = Crc(e.crc, data, bytes);
  return absl::OkStatus();
}

uint32_t SafetensorsWriter::Crc32() const {
  std::vector<std::pair<std::string, std::pair<uint32_t, uint64_t>>> crcs;
  for (const auto& e : entries_) crcs.push_back({e->name, {e->crc, e->name.size() + e->bytes}});
  return Combine(std::move(crcs));
}

absl::Status SafetensorsWriter::AssembleTemporary(const std::string& header) {
  const std::string tmp = path_ + ".tmp";
  auto out = env_->NewWritableFile(tmp);
  if (!out.ok()) return out.status();
  io::WritableFile& file = **out;
  absl::Status status;
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * i));
  status = file.Append(std::string_view(reinterpret_cast<const char*>(len), 8));
  if (status.ok()) status = file.Append(header);
  std::vector<char> buf;
  for (size_t i = 0; i < entries_.size() && status.ok(); ++i) {
    const Entry& e = *entries_[i];
    if (e.temp_path.empty()) {
      status = file.Append(std::string_view(static_cast<const char*>(e.data), e.bytes));
      continue;
    }
    auto in = env_->NewSequentialFile(e.temp_path);
    if (!in.ok()) {
      status = in.status();
      break;
    }
    buf.resize(kPiece);
    uint64_t copied = 0;
    while (status.ok()) {
      absl::StatusOr<size_t> got = (*in)->Read(buf.data(), buf.size());
      if (!got.ok()) status = got.status();
      if (!status.ok() || *got == 0) break;
      status = file.Append(std::string_view(buf.data(), *got));
      copied += *got;
    }
    if (status.ok() && copied != e.bytes) {
      status = absl::DataLossError(absl::StrCat(e.temp_path, " holds ", copied, " bytes, ", e.bytes, " were written"));
    }
  }
  if (status.ok()) status = file.Sync();
  if (absl::Status closed = file.Close(); status.ok()) status = closed;
  if (status.ok()) status = env_->RenameFile(tmp, path_);
  return status;
}

absl::Status SafetensorsWriter::Finish(const std::map<std::string, std::string>& metadata) {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path_, ": Finish called twice"));
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (auto& e : entries_) {
    if (e->temp != nullptr) {
      absl::Status closed = e->temp->Close();
      e->temp.reset();
      if (!closed.ok()) return closed;
      int64_t row = 1;
      for (int64_t d : e->shape) row *= d;
      const int64_t rows = row == 0 ? 0 : static_cast<int64_t>(e->bytes / DtypeBytes(e->dtype)) / row;
      e->shape.insert(e->shape.begin(), rows);
    }
    header[e->name] = {
        {"dtype", DtypeName(e->dtype)}, {"shape", e->shape}, {"data_offsets", {offset, offset + e->bytes}}};
    offset += e->bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format pads the header to 8-byte alignment
  if (absl::Status s = AssembleTemporary(text); !s.ok()) {
    (void)env_->RemoveFile(path_ + ".tmp");
    return s;
  }
  finished_ = true;
  for (auto& e : entries_) {
    if (!e->temp_path.empty()) (void)env_->RemoveFile(e->temp_path);
    e->temp_path.clear();
  }
  return env_->SyncDir(io::DirName(path_));
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path, io::Env* env) {
  auto bad = [&](auto&&... parts) { return absl::DataLossError(absl::StrCat(path, ": ", parts...)); };
  auto file = env->NewSequentialFile(path);
  if (!file.ok()) return file.status();
  unsigned char len[8];
  auto got = (*file)->Read(reinterpret_cast<char*>(len), 8);
  if (!got.ok()) return got.status();
  if (*got < 8) return bad("too short for a safetensors header (", *got, " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
  if (n > kMaxHeader) return bad("header length ", n, " is beyond ", kMaxHeader, " bytes");
  std::string text(n, '\0');
  got = (*file)->Read(text.data(), n);
  if (!got.ok()) return got.status();
  if (*got < n) return bad("header length ", n, " exceeds the file (", 8 + *got, " bytes)");
  nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return bad("header is not a JSON object");
  std::unique_ptr<SafetensorsReader> reader(new SafetensorsReader(path, env));
  reader->data_start_ = 8 + n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return bad("__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return bad("metadata '", m.key(), "' is not a string");
        reader->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const nlohmann::json& entry = *it;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      return bad("tensor '", it.key(), "' lacks dtype, shape or data_offsets");
    }
    TensorEntry t;
    t.name = it.key();
    if (entry["dtype"] == "F32") {
      t.dtype = Dtype::kF32;
    } else if (entry["dtype"] == "I64") {
      t.dtype = Dtype::kI64;
    } else {
      return bad("tensor '", it.key(), "' has dtype ", entry["dtype"].dump(), "; psflow reads F32 and I64");
    }
    if (!entry["shape"].is_array()) return bad("tensor '", it.key(), "' shape is not an array");
    int64_t elements = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t(1) << 40)) {
        return bad("tensor '", it.key(), "' has a bad dimension ", d.dump());
      }
      t.shape.push_back(d.get<int64_t>());
      if (t.shape.back() != 0 && elements > (int64_t(1) << 40) / t.shape.back()) {
        return bad("tensor '", it.key(), "' is impossibly large");
      }
      elements *= t.shape.back();
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad("tensor '", it.key(), "' has malformed data_offsets");
    }
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.begin > t.end || t.end - t.begin != uint64_t(elements) * DtypeBytes(t.dtype)) {
      return bad("tensor '", it.key(), "' shape ", ShapeToString(t.shape), " needs ", elements * DtypeBytes(t.dtype),
                 " bytes, offsets give [", t.begin, ",", t.end, ")");
    }
    reader->entries_.push_back(std::move(t));
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const TensorEntry& t : reader->entries_) ranges.emplace_back(t.begin, t.end);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return bad("tensor data ranges overlap");
  }
  std::sort(reader->entries_.begin(), reader->entries_.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.name < b.name);
  });
  return reader;
}

const TensorEntry* SafetensorsReader::Find(const std::string& name) const {
  for (const TensorEntry& t : entries_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<uint32_t> SafetensorsReader::Crc32() const {
  auto file = env_->NewSequentialFile(path_);
  if (!file.ok()) return file.status();
  if (auto s = (*file)->Skip(data_start_); !s.ok()) return s;
  std::vector<std::pair<std::string, std::pair<uint32_t, uint64_t>>> crcs;
  std::vector<char> buf(kPiece);
  uint64_t at = 0;                         // offset in the data section
  for (const TensorEntry& t : entries_) {  // file order
    if (auto s = (*file)->Skip(t.begin - at); !s.ok()) return s;
    at = t.begin;
    uint32_t crc = Crc(static_cast<uint32_t>(crc32(0L, Z_NULL, 0)), t.name.data(), t.name.size());
    while (at < t.end) {
      auto got = (*file)->Read(buf.data(), std::min<uint64_t>(buf.size(), t.end - at));
      if (!got.ok()) return got.status();
      if (*got == 0) {
        return absl::DataLossError(absl::StrCat(path_, ": tensor '", t.name, "' data [", t.begin, ",", t.end,
                                                ") lies outside the ", at, " data bytes"));
      }
      crc = Crc(crc, buf.data(), *got);
      at += *got;
    }
    crcs.push_back({t.name, {crc, t.name.size() + (t.end - t.begin)}});
  }
  return Combine(std::move(crcs));
}

absl::StatusOr<std::unique_ptr<SafetensorsReader::Stream>> SafetensorsReader::OpenStream(const std::string& name,
                                                                                         Dtype dtype) const {
  const TensorEntry* t = Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(path_, " has no tensor '", name, "'"));
  if (t->dtype != dtype) {
    return absl::DataLossError(
        absl::StrCat(path_, ": tensor '", name, "' is ", DtypeName(t->dtype), ", not ", DtypeName(dtype)));
  }
  auto file = env_->NewSequentialFile(path_);
  if (!file.ok()) return file.status();
  if (auto s = (*file)->Skip(data_start_ + t->begin); !s.ok()) return s;
  auto stream = std::unique_ptr<Stream>(new Stream());
  stream->file_ = *std::move(file);
  stream->entry_ = t;
  stream->remaining_ = t->elements();
  return stream;
}

absl::Status SafetensorsReader::Stream::Read(void* out, size_t elements) {
  if (static_cast<int64_t>(elements) > remaining_) {
    return absl::OutOfRangeError(absl::StrCat(file_->path(), ": tensor '", entry_->name, "' has ", remaining_,
                                              " values left, ", elements, " asked"));
  }
  const size_t bytes = elements * DtypeBytes(entry_->dtype);
  auto got = file_->Read(static_cast<char*>(out), bytes);
  if (!got.ok()) return got.status();
  if (*got < bytes) {
    return absl::DataLossError(
        absl::StrCat(file_->path(), ": tensor '", entry_->name, "' ends early (the file is short)"));
  }
  remaining_ -= static_cast<int64_t>(elements);
  return absl::OkStatus();
}

absl::Status SafetensorsReader::Stream::Skip(size_t elements) {
  if (static_cast<int64_t>(elements) > remaining_) {
    return absl::OutOfRangeError(absl::StrCat(file_->path(), ": tensor '", entry_->name, "' has ", remaining_,
                                              " values left, ", elements, " skipped"));
  }
  if (auto s = file_->Skip(elements * DtypeBytes(entry_->dtype)); !s.ok()) return s;
  remaining_ -= static_cast<int64_t>(elements);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> SafetensorsReader::ReadF32(const std::string& name) const {
  auto stream = OpenStream(name, Dtype::kF32);
  if (!stream.ok()) return stream.status();
  Tensor t = Tensor::Uninitialized(Find(name)->shape);
  if (auto s = (*stream)->Read(t.data(), t.size()); !s.ok()) return s;
  return t;
}

absl::StatusOr<std::vector<int64_t>> SafetensorsReader::ReadI64(const std::string& name) const {
  auto stream = OpenStream(name, Dtype::kI64);
  if (!stream.ok()) return stream.status();
  std::vector<int64_t> v(static_cast<size_t>(Find(name)->elements()));
  if (auto s = (*stream)->Read(v.data(), v.size()); !s.ok()) return s;
  return v;
}

}  // namespace psflow::ckpt
