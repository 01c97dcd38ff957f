#include "psflow/ckpt/safetensors.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace psflow::ckpt {

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                              const std::map<std::string, std::string>& metadata, io::Env* env) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", "F32"}, {"shape", t->shape()}, {"data_offsets", {offset, offset + t->bytes()}}};
    offset += t->bytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format pads the header to 8-byte alignment
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));

  std::vector<std::string_view> pieces = {std::string_view(reinterpret_cast<const char*>(len), 8), text};
  for (const auto& [name, t] : tensors) {
    pieces.emplace_back(reinterpret_cast<const char*>(t->data()), t->bytes());
  }
  return io::WriteFileAtomically(env, path, pieces);
}

absl::StatusOr<TensorFile> ParseSafetensors(std::string_view bytes, const std::string& name) {
  auto bad = [&](auto&&... parts) { return absl::DataLossError(absl::StrCat(name, ": ", parts...)); };
  if (bytes.size() < 8) return bad("too short for a safetensors header (", bytes.size(), " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8) return bad("header length ", n, " exceeds the file (", bytes.size(), " bytes)");
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return bad("header is not a JSON object");
  const std::string_view data = bytes.substr(8 + n);
  TensorFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return bad("__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return bad("metadata '", m.key(), "' is not a string");
        file.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    // psflow's writer refuses a tensor without a name, so a file holding one is not a checkpoint
    // (found by fuzz_safetensors: read, then refused on save).
    if (it.key().empty()) return bad("a tensor has an empty name");
    const nlohmann::json& entry = *it;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      return bad("tensor '", it.key(), "' lacks dtype, shape or data_offsets");
    }
    if (entry["dtype"] != "F32")
      return bad("tensor '", it.key(), "' has dtype ", entry["dtype"].dump(), "; psflow reads F32");
    Shape shape;
    if (!entry["shape"].is_array()) return bad("tensor '", it.key(), "' shape is not an array");
    int64_t elements = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t(1) << 40)) {
        return bad("tensor '", it.key(), "' has a bad dimension ", d.dump());
      }
      shape.push_back(d.get<int64_t>());
      // Checked before multiplying: two dimensions of 2^40 overflow int64 (and wrapped to 0 elements).
      if (shape.back() != 0 && elements > (int64_t(1) << 40) / shape.back()) {
        return bad("tensor '", it.key(), "' is impossibly large");
      }
      elements *= shape.back();
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad("tensor '", it.key(), "' has malformed data_offsets");
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data.size()) {
      return bad("tensor '", it.key(), "' data [", begin, ",", end, ") lies outside the ", data.size(), " data bytes");
    }
    if (end - begin != uint64_t(elements) * 4) {
      return bad("tensor '", it.key(), "' shape ", ShapeToString(shape), " needs ", elements * 4,
                 " bytes, offsets give ", end - begin);
    }
    ranges.emplace_back(begin, end);
    Tensor t(shape);
    if (elements > 0) std::memcpy(t.data(), data.data() + begin, end - begin);
    file.tensors.emplace(it.key(), std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return bad("tensor data ranges overlap");
  }
  return file;
}

absl::StatusOr<TensorFile> ReadSafetensors(const std::string& path, io::Env* env) {
  auto bytes = env->ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  return ParseSafetensors(*bytes, path);
}

}  // namespace psflow::ckpt
