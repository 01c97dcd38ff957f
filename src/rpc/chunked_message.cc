// A message in chunks on one stream (rpc/chunked_message.h).
#include "rpc/chunked_message.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/simd_dispatch.h"
#include "rpc/tensor_coding.h"

namespace psflow::rpc {

std::vector<grpc::ByteBuffer> CutIntoChunks(const grpc::ByteBuffer& encoded, size_t chunk_bytes) {
  std::vector<grpc::Slice> slices;
  (void)encoded.Dump(&slices);  // fails only on an invalid buffer, which then has no slices
  std::vector<grpc::ByteBuffer> chunks;
  std::vector<grpc::Slice> chunk;
  size_t in_chunk = 0;
  for (const grpc::Slice& s : slices) {
    for (size_t at = 0; at < s.size();) {
      const size_t take = std::min(s.size() - at, chunk_bytes - in_chunk);
      chunk.push_back(take == s.size() ? s : s.sub(at, at + take));
      at += take;
      in_chunk += take;
      if (in_chunk == chunk_bytes) {
        chunks.emplace_back(chunk.data(), chunk.size());
        chunk.clear();
        in_chunk = 0;
      }
    }
  }
  if (!chunk.empty()) chunks.emplace_back(chunk.data(), chunk.size());
  return chunks;
}

absl::Status ChunkedMessageReader::Add(const grpc::ByteBuffer& chunk) {
  std::vector<grpc::Slice> slices;
  if (grpc::Status s = chunk.Dump(&slices); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("malformed message: cannot read a chunk: ", s.error_message()));
  }
  for (grpc::Slice& s : slices) {
    received_ += static_cast<int64_t>(s.size());
    slices_.push_back(std::move(s));
  }
  if (!parsed_) ParseHeaders();
  const int64_t size = std::max(expected_, received_);
  if (size > max_bytes_) {
    // gRPC's own wording for a message over the limit, which the client turns into its one line.
    return absl::ResourceExhaustedError(
        absl::StrCat("Received message larger than max (", size, " vs. ", max_bytes_, ")"));
  }
  if (parsed_) ScanNewBytes();
  return absl::OkStatus();
}

void ChunkedMessageReader::ParseHeaders() {
  bool truncated = false;
  absl::StatusOr<MessageHeaders> headers = ReadMessageHeaders(SegmentsOf(slices_), &truncated);
  if (!headers.ok() && truncated) return;  // the rest of the headers is on its way
  parsed_ = true;                          // whatever the headers hold, they are read once
  if (!headers.ok()) return;               // Finish reports the defect
  absl::StatusOr<std::vector<IncomingMessage::TensorPlace>> places =
      IncomingMessage::PlaceTensors(&headers->list, /*payload_bytes=*/-1);
  if (!places.ok()) return;  // malformed: nothing is checked early, and Finish reports the defect
  const int64_t payload_at = static_cast<int64_t>(headers->payload_at);
  expected_ = payload_at;
  for (size_t i = 0; i < places->size(); ++i) {
    const IncomingMessage::TensorPlace& p = (*places)[i];
    if (!headers->list.tensors(static_cast<int>(i)).sparse() && p.dtype == WireDtype::kFloat32 && p.num_floats > 0) {
      checked_.push_back({.tensor = static_cast<int>(i), .begin = payload_at + p.offset, .end = payload_at + p.end()});
    }
    expected_ = payload_at + p.end();
  }
}

void ChunkedMessageReader::ScanNewBytes() {
  while (scanned_ < received_) {
    const int64_t slice_end = scan_slice_start_ + static_cast<int64_t>(slices_[scan_slice_].size());
    if (scanned_ >= slice_end) {
      scan_slice_start_ = slice_end;
      ++scan_slice_;
      continue;
    }
    const char* p = reinterpret_cast<const char*>(slices_[scan_slice_].begin()) + (scanned_ - scan_slice_start_);
    Scan(p, slice_end - scanned_);
  }
}

void ChunkedMessageReader::Scan(const char* p, int64_t n) {
  const int64_t end_of_piece = scanned_ + n;
  while (scanned_ < end_of_piece) {
    while (current_ < checked_.size() && checked_[current_].end <= scanned_) ++current_;
    if (current_ == checked_.size()) {
      scanned_ = end_of_piece;
      return;
    }
    Checked& c = checked_[current_];
    const char* here = p + (n - (end_of_piece - scanned_));
    if (scanned_ < c.begin) {
      scanned_ = std::min(end_of_piece, c.begin);
      continue;
    }
    const int64_t room = std::min(end_of_piece, c.end) - scanned_;
    int64_t used = 0;
    if (!c.stopped && carry_n_ > 0) {  // the rest of a float begun in the previous slice
      const int take = static_cast<int>(std::min<int64_t>(4 - carry_n_, room));
      std::memcpy(carry_ + carry_n_, here, static_cast<size_t>(take));
      carry_n_ += take;
      used = take;
      if (carry_n_ == 4) {
        carry_n_ = 0;
        if (simd::AnyNonFinite(carry_, 1)) {
          c.stopped = true;
        } else {
          ++c.finite;
        }
      }
    }
    if (!c.stopped) {
      const int64_t floats = (room - used) / 4;
      if (floats > 0 && simd::AnyNonFinite(here + used, floats)) {
        c.stopped = true;  // its index is the handler's check's to find
      } else {
        c.finite += floats;
        used += floats * 4;
        if (room > used) {  // a float split across two slices: its first bytes
          carry_n_ = static_cast<int>(room - used);
          std::memcpy(carry_, here + used, static_cast<size_t>(carry_n_));
        }
      }
    }
    if (c.stopped) carry_n_ = 0;
    scanned_ += room;
  }
}

absl::StatusOr<IncomingMessage> ChunkedMessageReader::Finish() {
  if (expected_ >= 0 && received_ != expected_) {
    return absl::InvalidArgumentError(absl::StrCat("malformed message: its chunks ended after ", received_,
                                                   " bytes of the ", expected_, " its headers announce"));
  }
  absl::StatusOr<IncomingMessage> message =
      DecodeSlices(std::make_shared<const std::vector<grpc::Slice>>(std::move(slices_)));
  if (!message.ok()) return message.status();
  for (const Checked& c : checked_) message->MarkFinitePrefix(c.tensor, c.finite);
  return message;
}

}  // namespace psflow::rpc
