// rpc/tensor_coding.h — psflow messages to and from gRPC byte buffers without copying tensors
// through protobuf (the approach of TensorFlow's grpc_tensor_coding).
//
// Layout of one message (all integers little-endian):
//   [u32 H][H bytes: the method's header proto][u32 L][L bytes: wire::TensorList]
//   [zero padding to a multiple of 8 bytes][tensor 0 floats][tensor 1 floats]...
// Encoding puts the headers (and tensors smaller than kInlineTensorBytes, whose copy is cheaper
// than a slice of their own) in one owned slice and wraps every larger tensor's memory in a slice
// whose destroy callback releases the tensor's owner: no copy on send. Decoding parses the headers
// and keeps the received slices referenced, so the receiver copies each tensor once into its
// destination (IncomingMessage::CopyTo / AddTo / ForEachRun). Malformed input is an error, never a
// crash. Free functions, thread-safe.
#ifndef PSFLOW_RPC_TENSOR_CODING_H_
#define PSFLOW_RPC_TENSOR_CODING_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "rpc/transport.h"

namespace psflow::rpc {

// Marks the calling thread as one that runs transport completions (gRPC's queue pollers, the
// shared-memory readers), so OnTransportThread() catches blocking calls made from them.
void MarkTransportThread();
// Sets whether the calling thread runs transport completions now and returns the previous
// setting: a caller that polls for its own calls' completions (CompletionsHere) is one meanwhile.
bool SetTransportThread(bool on);

// Below this size a tensor is copied into the header slice: copying 64 KiB costs a few
// microseconds, less than a slice of its own and the release bookkeeping it needs.
inline constexpr size_t kInlineTensorBytes = 64 << 10;

// Encodes `message`. Every zero-copy slice keeps its tensor's owner and `release_guard` (may be
// null) alive, so the last slice released destroys the guard: callers use it to learn when the
// transport no longer reads their memory.
grpc::ByteBuffer EncodeMessage(OutgoingMessage message, const std::shared_ptr<const void>& release_guard = nullptr);

// Decodes a received buffer (referencing, not copying, its slices). InvalidArgument describing
// the defect for truncated buffers, headers that do not parse, negative or overflowing dims, and
// payloads whose size disagrees with the tensor headers.
absl::StatusOr<IncomingMessage> DecodeMessage(const grpc::ByteBuffer& buffer);
// The same over a message's bytes already taken out of their buffer (the slices stay referenced by
// the result): the chunked reader's, without a second buffer and dump.
absl::StatusOr<IncomingMessage> DecodeSlices(std::shared_ptr<const std::vector<grpc::Slice>> slices);

// The layout's parts before the payload, for every coder of it (this one, the chunked reader's in
// rpc/chunked_message.h, the shared-memory transport's in rpc/shm_wire.h).
//
// Appends [u32 H][header][u32 L][list_bytes][zero padding to a multiple of 8 bytes] to `out`, which
// holds nothing else (the padding counts from its start).
void AppendMessageHeaders(std::string_view header, std::string_view list_bytes, std::string* out);
// The headers of a message and where its payload starts.
struct MessageHeaders {
  std::string header;
  wire::TensorList list;
  size_t payload_at = 0;  // the headers' bytes and the padding's
};
// Reads the headers from a message's bytes in `segments` (all of them, or its first ones).
// InvalidArgument describing the defect when the bytes end before the headers and their padding do
// ("truncated in the ..."; then `*truncated` is set, when given, for a reader whose bytes are still
// arriving) or when the tensor list does not parse.
absl::StatusOr<MessageHeaders> ReadMessageHeaders(const std::vector<IncomingMessage::Segment>& segments,
                                                  bool* truncated = nullptr);
// The segments of a buffer's slices, in order.
std::vector<IncomingMessage::Segment> SegmentsOf(const std::vector<grpc::Slice>& slices);

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_TENSOR_CODING_H_
