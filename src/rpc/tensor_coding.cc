// Encoding and decoding of psflow messages in gRPC byte buffers (see tensor_coding.h).
#include "rpc/tensor_coding.h"

#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace psflow::rpc {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian floats; add byte swapping for this platform");

// Keeps a zero-copy slice's memory alive: the tensor's owner and the caller's release guard.
struct SliceOwner {
  std::shared_ptr<const void> tensor_owner;
  std::shared_ptr<const void> release_guard;
};

void DestroySliceOwner(void* p) { delete static_cast<SliceOwner*>(p); }

void AppendU32(std::string* out, uint32_t v) {
  char bytes[4];
  std::memcpy(bytes, &v, 4);
  out->append(bytes, 4);
}

size_t PaddingAfter(size_t header_bytes) { return (8 - header_bytes % 8) % 8; }

// Reads bytes [offset, offset + n) of a slice list into `out`; false when the list is shorter.
bool ReadBytes(const std::vector<IncomingMessage::Segment>& segments, size_t offset, size_t n, char* out) {
  for (const auto& s : segments) {
    if (n == 0) break;
    if (offset >= s.size) {
      offset -= s.size;
      continue;
    }
    const size_t take = std::min(n, s.size - offset);
    std::memcpy(out, s.data + offset, take);
    out += take;
    n -= take;
    offset = 0;
  }
  return n == 0;
}

}  // namespace

grpc::ByteBuffer EncodeMessage(OutgoingMessage message, const std::shared_ptr<const void>& release_guard) {
  std::vector<WireBytes> wire;  // before the metas move into the list: a 16-bit dtype's converted copy
  wire.reserve(message.tensors.size());
  for (const OutgoingTensor& t : message.tensors) wire.push_back(ToWireBytes(t));
  wire::TensorList list;
  for (OutgoingTensor& t : message.tensors) {
    if (t.meta.dtype().empty()) t.meta.set_dtype(kWireDtype);  // a test may name another, to be refused
    *list.add_tensors() = std::move(t.meta);
  }
  if (message.delta.client() != 0) *list.mutable_delta() = std::move(message.delta);
  const std::string list_bytes = list.SerializeAsString();

  std::string inline_bytes;
  AppendMessageHeaders(message.header, list_bytes, &inline_bytes);

  std::vector<grpc::Slice> slices;
  slices.reserve(1 + message.tensors.size());
  for (size_t k = 0; k < message.tensors.size(); ++k) {
    const OutgoingTensor& t = message.tensors[k];
    const WireBytes& w = wire[k];
    const size_t bytes = w.bytes;
    if (bytes == 0) continue;
    if (bytes < kInlineTensorBytes) {
      inline_bytes.append(static_cast<const char*>(w.data), bytes);
      continue;
    }
    if (!inline_bytes.empty()) {
      slices.emplace_back(inline_bytes);
      inline_bytes.clear();
    }
    // gRPC only reads through the pointer; the const_cast is for its C signature.
    slices.emplace_back(const_cast<void*>(w.data), bytes, &DestroySliceOwner,
                        new SliceOwner{w.owner != nullptr ? w.owner : t.owner, release_guard});
  }
  if (!inline_bytes.empty()) slices.emplace_back(inline_bytes);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::StatusOr<IncomingMessage> DecodeMessage(const grpc::ByteBuffer& buffer) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!buffer.Valid()) return absl::InvalidArgumentError("malformed message: empty byte buffer");
  grpc::Status dumped = buffer.Dump(slices.get());
  if (!dumped.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: cannot read byte buffer: ", dumped.error_message()));
  }
  return DecodeSlices(std::move(slices));
}

absl::StatusOr<IncomingMessage> DecodeSlices(std::shared_ptr<const std::vector<grpc::Slice>> slices) {
  std::vector<IncomingMessage::Segment> segments = SegmentsOf(*slices);
  absl::StatusOr<MessageHeaders> headers = ReadMessageHeaders(segments);
  if (!headers.ok()) return headers.status();
  size_t total = 0;
  for (const auto& s : segments) total += s.size;

  // The payload: the segments from the headers' end on, referenced in place.
  std::vector<IncomingMessage::Segment> payload;
  size_t skip = headers->payload_at;
  for (const auto& s : segments) {
    if (skip >= s.size) {
      skip -= s.size;
      continue;
    }
    payload.push_back({s.data + skip, s.size - skip});
    skip = 0;
  }
  return IncomingMessage::Make(std::move(headers->header), std::move(headers->list), std::move(payload),
                               std::move(slices), static_cast<int64_t>(total));
}

void AppendMessageHeaders(std::string_view header, std::string_view list_bytes, std::string* out) {
  out->reserve(out->size() + 8 + header.size() + list_bytes.size() + 8);
  AppendU32(out, static_cast<uint32_t>(header.size()));
  out->append(header);
  AppendU32(out, static_cast<uint32_t>(list_bytes.size()));
  out->append(list_bytes);
  out->append(PaddingAfter(out->size()), '\0');
}

absl::StatusOr<MessageHeaders> ReadMessageHeaders(const std::vector<IncomingMessage::Segment>& segments,
                                                  bool* truncated) {
  size_t total = 0;
  for (const auto& s : segments) total += s.size;
  if (truncated != nullptr) *truncated = false;
  auto truncated_in = [total, truncated](const char* what) {
    if (truncated != nullptr) *truncated = true;
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: truncated in the ", what, " (", total, " bytes in all)"));
  };
  MessageHeaders out;
  size_t pos = 0;
  uint32_t header_size = 0;
  if (!ReadBytes(segments, pos, 4, reinterpret_cast<char*>(&header_size))) {
    return truncated_in("header size");
  }
  pos += 4;
  if (header_size > total - pos) return truncated_in("header");
  out.header.resize(header_size);
  ReadBytes(segments, pos, header_size, out.header.data());
  pos += header_size;
  uint32_t list_size = 0;
  if (!ReadBytes(segments, pos, 4, reinterpret_cast<char*>(&list_size))) {
    return truncated_in("tensor list size");
  }
  pos += 4;
  if (list_size > total - pos) return truncated_in("tensor list");
  std::string list_bytes(list_size, '\0');
  ReadBytes(segments, pos, list_size, list_bytes.data());
  pos += list_size;
  if (!out.list.ParseFromString(list_bytes)) {
    return absl::InvalidArgumentError("malformed message: tensor list does not parse");
  }
  pos += PaddingAfter(pos);
  if (pos > total) return truncated_in("padding");
  out.payload_at = pos;
  return out;
}

std::vector<IncomingMessage::Segment> SegmentsOf(const std::vector<grpc::Slice>& slices) {
  std::vector<IncomingMessage::Segment> segments;
  segments.reserve(slices.size());
  for (const grpc::Slice& s : slices) segments.push_back({reinterpret_cast<const char*>(s.begin()), s.size()});
  return segments;
}

}  // namespace psflow::rpc
