// rpc/shm_wire.h — the pieces of the shared-memory transport (shm_transport.h): sealed memfd
// regions both processes map, the small packets on the Unix socket that announce calls and
// answers (passing a region's fd with SCM_RIGHTS when it is new), and psflow messages written into
// / read in place from one contiguous region.
//
// The message layout in a region is tensor_coding.h's, contiguous: [u32 H][header][u32 L][TensorList]
// [zero padding to 8][floats...]. Regions are sealed against shrinking and growing before their fd
// is passed, so a peer cannot make the other fault (SIGBUS) by truncating a mapping under it.
// Free functions and a value-like Region; thread-safe.
#ifndef PSFLOW_RPC_SHM_WIRE_H_
#define PSFLOW_RPC_SHM_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/transport.h"

namespace psflow::rpc::shm {

// A mapped memfd. Unmapped and closed on destruction; shared by whoever reads or writes it.
class Region {
 public:
  // A new region of at least `size` bytes (rounded up to pages), sealed against resizing.
  static absl::StatusOr<std::shared_ptr<Region>> Create(size_t size);
  // Maps a region received from the peer (takes ownership of `fd`); refused unless it is sealed
  // against resizing.
  static absl::StatusOr<std::shared_ptr<Region>> Adopt(int fd);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  Region(int fd, char* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_;
  char* data_;
  size_t size_;
};

enum class PacketKind : uint32_t {
  kHello = 1,    // client -> server: version in `size`, the cluster secret as text
  kWelcome = 2,  // server -> client: code 0, or the refusal's code and text
  kCall = 3,     // client -> server: request of `size` bytes in slot `slot`'s request region
  kReply = 4,    // server -> client: code 0 and `size` bytes in the slot's response region, or an error
};

struct Packet {
  PacketKind kind = PacketKind::kHello;
  uint32_t slot = 0;
  uint32_t method = 0;
  int32_t code = 0;  // absl::StatusCode
  uint64_t size = 0;
};

struct ReceivedPacket {
  Packet packet;
  std::string text;
  int fd = -1;  // a region's fd passed along (the receiver owns it), or -1
};

// Sends one packet (SOCK_SEQPACKET: delivered whole or not at all), with `fd` attached when >= 0.
absl::Status SendPacket(int sock, const Packet& packet, std::string_view text, int fd);
// Blocks for the next packet. Unavailable on end of stream or a socket error; InvalidArgument on
// a malformed packet (the connection should be dropped).
absl::StatusOr<ReceivedPacket> ReceivePacket(int sock);

// A message ready to be written: its header bytes and its tensors' memory.
struct PreparedMessage {
  std::string prefix;                                   // [u32 H][header][u32 L][TensorList][padding]
  std::vector<std::pair<const void*, size_t>> payload;  // (data, bytes)
  std::vector<std::shared_ptr<const void>> converted;   // 16-bit tensors' converted copies
  size_t total_bytes = 0;
};
// Borrows the tensors' memory of `message` (which must outlive the result).
PreparedMessage Prepare(OutgoingMessage& message);
// Writes `message` to dst[0, message.total_bytes).
void WriteMessage(const PreparedMessage& message, char* dst);
// Decodes bytes [data, data + size) in place; `keepalive` owns them. InvalidArgument describing
// the defect for truncated or inconsistent bytes.
absl::StatusOr<IncomingMessage> ReadMessage(const char* data, size_t size, std::shared_ptr<const void> keepalive);

// Waits up to `secs` for the socket to be readable (a packet, or the peer's close); false on timeout.
bool WaitReadable(int fd, double secs);

}  // namespace psflow::rpc::shm

#endif  // PSFLOW_RPC_SHM_WIRE_H_
