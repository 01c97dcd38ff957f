// ps/server/table/record_pool.h — memory for the disk tier's cached records (disk_store.h): blocks of
// one size carved from 2 MiB slabs, 64-byte aligned, without a per-block header. Internal to the
// disk tier.
//
// Why not aligned_alloc per record: glibc's memalign takes size + alignment + 32 bytes and gives the
// ends back as small free chunks that records never reuse; with records of 576 bytes coming and going
// at random that is ~38 % over the records' bytes (measured: 1M records, 3M replaced: 756 MB of RSS
// for 562 MB of records), which a byte-bounded cache must not have. Here a block costs its bytes
// (rounded to 64) plus its share of a 64-byte slab header; the free space is the free blocks of
// partly used slabs, which the next records of that size take first. A slab whose blocks are all
// free goes back to the system unless it is its size's only slab with room.
//
// Not thread-safe: the owner (the tier's mutex) guards it.
#ifndef PSFLOW_PS_SERVER_TABLE_RECORD_POOL_H_
#define PSFLOW_PS_SERVER_TABLE_RECORD_POOL_H_

#include <cstdint>
#include <map>

namespace psflow::ps::table {

class RecordPool {
 public:
  static constexpr int64_t kSlabBytes = int64_t{1} << 21;
  RecordPool() = default;
  ~RecordPool();  // frees every slab (the owner has freed its blocks first)
  RecordPool(const RecordPool&) = delete;
  RecordPool& operator=(const RecordPool&) = delete;

  // A 64-byte aligned block of `bytes` (1 <= bytes <= kSlabBytes - 64), uninitialized. CHECK-fails
  // when out of memory.
  void* Allocate(int64_t bytes);
  // Returns a block from Allocate.
  void Free(void* block);

  // Bytes of the slabs held (what the pool costs in RSS at most).
  int64_t slab_bytes() const { return slabs_ * kSlabBytes; }

 private:
  struct Slab;
  struct Size {                 // the slabs of one block size
    Slab* with_room = nullptr;  // a list of the slabs with free blocks
    int64_t block_bytes = 0;
  };
  static Slab* SlabOf(void* block);
  void Unlist(Slab* s);
  void List(Slab* s);

  std::map<int64_t, Size> sizes_;  // by block bytes (a few: one per table shape); nodes stay put
  Slab* all_ = nullptr;            // every slab
  int64_t slabs_ = 0;
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_RECORD_POOL_H_
