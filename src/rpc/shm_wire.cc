// Regions, packets and contiguous message coding of the shared-memory transport (shm_wire.h).
#include "rpc/shm_wire.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "rpc/tensor_coding.h"

namespace psflow::rpc::shm {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian floats; add byte swapping for this platform");

constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
// Packets carry error texts and the secret; longer ones are cut by the sender.
constexpr size_t kMaxPacketText = 16 << 10;

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

}  // namespace

absl::StatusOr<std::shared_ptr<Region>> Region::Create(size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size = std::max<size_t>(page, (size + page - 1) / page * page);
  const int fd = memfd_create("psflow-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::ResourceExhaustedError(Errno("memfd_create"));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 || fcntl(fd, F_ADD_SEALS, kSeals) != 0) {
    const std::string why = Errno("sizing a shared-memory region");
    close(fd);
    return absl::ResourceExhaustedError(why);
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const std::string why = Errno("mmap");
    close(fd);
    return absl::ResourceExhaustedError(why);
  }
  return std::shared_ptr<Region>(new Region(fd, static_cast<char*>(data), size));
}

absl::StatusOr<std::shared_ptr<Region>> Region::Adopt(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  struct stat st {};
  if (seals < 0 || (static_cast<unsigned>(seals) & kSeals) != kSeals || fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    return absl::InvalidArgumentError("peer passed a shared-memory region that is not a sealed memfd");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const std::string why = Errno("mmap");
    close(fd);
    return absl::ResourceExhaustedError(why);
  }
  return std::shared_ptr<Region>(new Region(fd, static_cast<char*>(data), size));
}

Region::~Region() {
  munmap(data_, size_);
  close(fd_);
}

absl::Status SendPacket(int sock, const Packet& packet, std::string_view text, int fd) {
  text = text.substr(0, kMaxPacketText);
  iovec iov[2] = {{const_cast<Packet*>(&packet), sizeof(Packet)}, {const_cast<char*>(text.data()), text.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = text.empty() ? 1 : 2;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  for (;;) {
    if (sendmsg(sock, &msg, MSG_NOSIGNAL) >= 0) return absl::OkStatus();
    if (errno != EINTR) return absl::UnavailableError(Errno("shared-memory connection lost (send)"));
  }
}

absl::StatusOr<ReceivedPacket> ReceivePacket(int sock) {
  ReceivedPacket out;
  std::string buffer(sizeof(Packet) + kMaxPacketText, '\0');
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return absl::UnavailableError(Errno("shared-memory connection lost (receive)"));
  if (n == 0) return absl::UnavailableError("shared-memory connection closed by the peer");
  // Take every passed fd first so none leaks on the error paths.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (out.fd < 0) {
        out.fd = fd;
      } else {
        close(fd);
      }
    }
  }
  auto malformed = [&](const char* why) {
    if (out.fd >= 0) close(out.fd);
    return absl::InvalidArgumentError(absl::StrCat("malformed shared-memory packet: ", why));
  };
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) return malformed("too long");
  if (static_cast<size_t>(n) < sizeof(Packet)) return malformed("too short");
  std::memcpy(&out.packet, buffer.data(), sizeof(Packet));
  out.text.assign(buffer.data() + sizeof(Packet), static_cast<size_t>(n) - sizeof(Packet));
  return out;
}

PreparedMessage Prepare(OutgoingMessage& message) {
  PreparedMessage out;
  wire::TensorList list;
  for (OutgoingTensor& t : message.tensors) {
    if (t.meta.dtype().empty()) t.meta.set_dtype(kWireDtype);
    *list.add_tensors() = t.meta;
    WireBytes wire = ToWireBytes(t);  // a 16-bit dtype: a converted copy
    if (wire.bytes > 0) out.payload.emplace_back(wire.data, wire.bytes);
    if (wire.owner != nullptr) out.converted.push_back(std::move(wire.owner));
  }
  if (message.delta.client() != 0) *list.mutable_delta() = message.delta;
  const std::string list_bytes = list.SerializeAsString();
  AppendMessageHeaders(message.header, list_bytes, &out.prefix);
  out.total_bytes = out.prefix.size();
  for (const auto& [data, bytes] : out.payload) out.total_bytes += bytes;
  return out;
}

void WriteMessage(const PreparedMessage& message, char* dst) {
  std::memcpy(dst, message.prefix.data(), message.prefix.size());
  dst += message.prefix.size();
  for (const auto& [data, bytes] : message.payload) {
    std::memcpy(dst, data, bytes);
    dst += bytes;
  }
}

absl::StatusOr<IncomingMessage> ReadMessage(const char* data, size_t size, std::shared_ptr<const void> keepalive) {
  absl::StatusOr<MessageHeaders> headers = ReadMessageHeaders({{data, size}});
  if (!headers.ok()) return headers.status();
  const size_t pos = headers->payload_at;
  std::vector<IncomingMessage::Segment> payload;
  if (pos < size) payload.push_back({data + pos, size - pos});
  return IncomingMessage::Make(std::move(headers->header), std::move(headers->list), std::move(payload),
                               std::move(keepalive), static_cast<int64_t>(size));
}

bool WaitReadable(int fd, double secs) {
  pollfd p{fd, POLLIN, 0};
  int r;
  do {
    r = poll(&p, 1, static_cast<int>(secs * 1000));
  } while (r < 0 && errno == EINTR);
  return r > 0;
}

}  // namespace psflow::rpc::shm
