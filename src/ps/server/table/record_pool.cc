// Memory for the disk tier's cached records (record_pool.h).
#include "ps/server/table/record_pool.h"

#include <cstdlib>

#include "core/check.h"
#include "ps/server/table/row_memory.h"

namespace psflow::ps::table {

// At the start of each slab (its first 64 bytes); the blocks follow.
struct RecordPool::Slab {
  Slab* prev;  // in its size's with_room list
  Slab* next;
  Slab* all_prev;  // in the pool's list of every slab
  Slab* all_next;
  void* free;  // a list of free blocks (each holds the next)
  RecordPool::Size* size;
  int32_t live;      // blocks out
  int32_t carved;    // blocks ever handed out of the slab's untouched tail
  int32_t capacity;  // blocks the slab holds
  bool listed;
};

RecordPool::~RecordPool() {
  for (Slab* s = all_; s != nullptr;) {
    Slab* next = s->all_next;
    std::free(s);
    s = next;
  }
}

RecordPool::Slab* RecordPool::SlabOf(void* block) {
  return reinterpret_cast<Slab*>(reinterpret_cast<uintptr_t>(block) & ~static_cast<uintptr_t>(kSlabBytes - 1));
}

void RecordPool::List(Slab* s) {
  s->prev = nullptr;
  s->next = s->size->with_room;
  if (s->next != nullptr) s->next->prev = s;
  s->size->with_room = s;
  s->listed = true;
}

void RecordPool::Unlist(Slab* s) {
  (s->prev != nullptr ? s->prev->next : s->size->with_room) = s->next;
  if (s->next != nullptr) s->next->prev = s->prev;
  s->prev = s->next = nullptr;
  s->listed = false;
}

void* RecordPool::Allocate(int64_t bytes) {
  static_assert(sizeof(Slab) <= 64, "a slab's header is one cache line");
  const int64_t block_bytes = (bytes + 63) / 64 * 64;
  CHECK(bytes >= 1 && block_bytes <= kSlabBytes - 64) << "a record of " << bytes << " bytes";
  Size& size = sizes_[block_bytes];
  Slab* s = size.with_room;
  if (s == nullptr) {
    // AllocateRowMemory: 2 MiB blocks come 2 MiB-aligned (SlabOf) as transparent huge pages.
    s = static_cast<Slab*>(AllocateRowMemory(static_cast<size_t>(kSlabBytes)));
    s->free = nullptr;
    s->size = &size;
    size.block_bytes = block_bytes;
    s->all_prev = nullptr;
    s->all_next = all_;
    if (all_ != nullptr) all_->all_prev = s;
    all_ = s;
    s->live = 0;
    s->carved = 0;
    s->capacity = static_cast<int32_t>((kSlabBytes - 64) / block_bytes);
    List(s);
    ++slabs_;
  }
  void* block;
  if (s->free != nullptr) {
    block = s->free;
    s->free = *static_cast<void**>(block);
  } else {
    block = reinterpret_cast<char*>(s) + 64 + s->carved * block_bytes;
    ++s->carved;
  }
  ++s->live;
  if (s->free == nullptr && s->carved == s->capacity) Unlist(s);  // full
  return block;
}

void RecordPool::Free(void* block) {
  Slab* s = SlabOf(block);
  *static_cast<void**>(block) = s->free;
  s->free = block;
  --s->live;
  if (!s->listed) List(s);
  if (s->live == 0 && (s->prev != nullptr || s->next != nullptr)) {  // empty, and not its size's last with room
    Unlist(s);
    (s->all_prev != nullptr ? s->all_prev->all_next : all_) = s->all_next;
    if (s->all_next != nullptr) s->all_next->all_prev = s->all_prev;
    std::free(s);
    --slabs_;
  }
}

}  // namespace psflow::ps::table
