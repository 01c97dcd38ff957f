// rpc/chunked_message.h (internal) — one large message sent as several gRPC messages, in order, on
// one stream, so that the receiver works on each chunk while the next one travels.
//
// Why: a push is all-or-nothing (one NaN anywhere refuses it, nothing applied), so the ps checks
// every float before its update. Sent as one gRPC message, the whole gradient has arrived before
// the check can start, and by then its first megabytes have left the caches: a 16 MiB push paid a
// memory-bound pass of about 0.6-0.9 ms after its last byte. Sent in chunks, each chunk's floats
// are checked as the chunk is read, while still in cache, and after the last byte only the last
// chunk's remain. Nothing else changes: the chunks are the bytes of the message's one-message
// encoding (rpc/tensor_coding.h) cut at fixed offsets, and the receiver hands its handler one
// IncomingMessage equal to the one-message decoding, with the floats already checked marked
// (IncomingMessage::MarkFinitePrefix). A stream that ends early decodes to nothing (its size
// disagrees with its headers): no part of it reaches the handler.
//
// The gRPC transport sends a Push of at least kChunkedMinBytes this way (grpc_transport.cc).
// Free functions and a single-threaded reader; thread-compatible.
#ifndef PSFLOW_RPC_CHUNKED_MESSAGE_H_
#define PSFLOW_RPC_CHUNKED_MESSAGE_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "rpc/transport.h"

namespace psflow::rpc {

// Pushes from this size on travel in chunks (smaller ones gain nothing worth a stream's extra
// round of completions), in chunks of kChunkBytes (a few per 16 MiB push; each costs the receiver
// one read completion).
inline constexpr size_t kChunkedMinBytes = size_t{4} << 20;
inline constexpr size_t kChunkBytes = size_t{2} << 20;

// Cuts an encoded message into consecutive pieces of `chunk_bytes` (the last one shorter). The
// pieces share the message's slices (no copy; zero-copy tensor slices keep their owners).
std::vector<grpc::ByteBuffer> CutIntoChunks(const grpc::ByteBuffer& encoded, size_t chunk_bytes);

// Reassembles the chunks of one message as they arrive, checking the dense float32 tensors'
// floats chunk by chunk.
class ChunkedMessageReader {
 public:
  // `max_bytes`: the largest message accepted (--max_message_mb), checked as soon as the headers
  // tell the message's size.
  explicit ChunkedMessageReader(int64_t max_bytes) : max_bytes_(max_bytes) {}

  // The next chunk. ResourceExhausted (worded as gRPC's own message-size error) when the message
  // is larger than max_bytes.
  absl::Status Add(const grpc::ByteBuffer& chunk);
  // Every chunk was read: the message, as DecodeMessage of the chunks' bytes joined would give it,
  // with the checked floats marked. InvalidArgument when the bytes are not one whole message
  // (the stream ended early, or malformed headers).
  absl::StatusOr<IncomingMessage> Finish();

  int64_t bytes() const { return received_; }

 private:
  // The headers, once received: where the payload starts and where each dense float32 tensor lies.
  void ParseHeaders();
  // Checks the floats of the bytes received since the last call.
  void ScanNewBytes();
  void Scan(const char* p, int64_t n);

  struct Checked {  // a dense float32 tensor and how many of its floats are known finite
    int tensor = 0;
    int64_t begin = 0, end = 0;  // bytes of the message
    int64_t finite = 0;
    bool stopped = false;  // a NaN or Inf was seen: the rest is left to the handler's check
  };

  const int64_t max_bytes_;
  std::vector<grpc::Slice> slices_;
  int64_t received_ = 0;
  bool parsed_ = false;
  int64_t expected_ = -1;  // the whole message's bytes, once the headers are in (-1: unknown)
  std::vector<Checked> checked_;
  size_t current_ = 0;     // the first entry of checked_ that may still hold unscanned bytes
  int64_t scanned_ = 0;    // bytes of the message scanned so far
  size_t scan_slice_ = 0;  // the slice holding byte scanned_ (or the next one to arrive)
  int64_t scan_slice_start_ = 0;
  char carry_[4] = {};  // a float split across two slices
  int carry_n_ = 0;
};

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_CHUNKED_MESSAGE_H_
