// Pushes and pulls cut into parts (ps/client/call_parts.h).
#include "ps/client/call_parts.h"

#include <algorithm>

namespace psflow::ps {

std::vector<std::vector<rpc::OutgoingTensor>> SplitIntoParts(std::vector<rpc::OutgoingTensor> tensors,
                                                             int64_t max_part_bytes) {
  const int64_t max_floats = std::max<int64_t>(1, max_part_bytes / static_cast<int64_t>(sizeof(float)));
  int64_t total = 0;
  for (const rpc::OutgoingTensor& t : tensors) total += t.num_floats;
  std::vector<std::vector<rpc::OutgoingTensor>> parts;
  if (total <= max_floats) {
    parts.push_back(std::move(tensors));
    return parts;
  }
  parts.emplace_back();
  int64_t room = max_floats;  // floats left in the last part
  auto next_part = [&] {
    parts.emplace_back();
    room = max_floats;
  };
  for (rpc::OutgoingTensor& t : tensors) {
    if (t.meta.sparse() || t.num_floats <= room) {
      if (t.num_floats > room && !parts.back().empty()) next_part();
      room -= t.num_floats;
      parts.back().push_back(std::move(t));
      continue;
    }
    // A dense tensor that does not fit: element runs, the first filling this part.
    for (int64_t offset = 0; offset < t.num_floats;) {
      if (room <= 0) next_part();
      const int64_t n = std::min(room, t.num_floats - offset);
      rpc::OutgoingTensor piece;
      piece.meta = t.meta;  // name (and an Initialize's slot)
      piece.meta.clear_shape();
      piece.meta.add_shape(n);
      piece.meta.set_slice(true);
      piece.meta.set_slice_offset(t.meta.slice_offset() + offset);
      piece.data = t.data + offset;
      piece.num_floats = n;
      piece.owner = t.owner;
      parts.back().push_back(std::move(piece));
      room -= n;
      offset += n;
    }
  }
  if (parts.back().empty()) parts.pop_back();
  return parts;
}

std::vector<std::vector<SliceTarget>> SplitPullIntoParts(const std::vector<SliceTarget>& runs, int64_t max_part_bytes,
                                                         int64_t floats_per_element) {
  const int64_t max_elements = std::max<int64_t>(
      1, max_part_bytes / static_cast<int64_t>(sizeof(float)) / std::max<int64_t>(floats_per_element, 1));
  std::vector<std::vector<SliceTarget>> parts(1);
  int64_t room = max_elements;  // elements left in the last part
  for (const SliceTarget& run : runs) {
    const int64_t end = run.offset + run.count;
    int64_t offset = run.offset;
    do {  // an empty run stays one empty run
      if (room <= 0) {
        parts.emplace_back();
        room = max_elements;
      }
      const int64_t n = std::min(room, end - offset);
      parts.back().push_back({run.target, offset, n});
      room -= n;
      offset += n;
    } while (offset < end);
  }
  if (parts.back().empty()) parts.pop_back();
  return parts;
}

}  // namespace psflow::ps
