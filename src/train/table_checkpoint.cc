// Embedding tables in checkpoint files (train/table_checkpoint.h).
#include "train/table_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "ps/server/ps_tables.h"
#include "ps/server/table/sparse_rule.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/checkpoint_chain.h"

namespace psflow::train {
namespace {

// Rows per part: about 4 MiB of values and slots, at least 256 rows.
int64_t PartRows(int64_t dim, size_t slots) {
  return std::max<int64_t>(256, (int64_t{4} << 20) / (dim * 4 * static_cast<int64_t>(1 + slots)));
}

struct Names {
  std::string ids, values, last_step, count;
  std::vector<std::string> slots;
};

Names NamesOf(const dist::TableSpec& t, const TableLayout& layout) {
  Names n;
  n.values = t.name;
  n.count = t.name + "/count";
  if (t.dynamic()) {
    n.ids = t.name + "/ids";
    n.last_step = t.name + "/last_step";
    for (const std::string& s : layout.slot_names) n.slots.push_back(t.name + "/" + s);
  } else {
    for (const std::string& s : layout.slot_names) n.slots.push_back(ckpt::SlotTensorName(t.name, s));
  }
  return n;
}

bool HasCount(const dist::TableSpec& t, const TableLayout& layout) { return t.dynamic() || layout.fixed_count; }

}  // namespace

absl::StatusOr<TableLayout> TableLayoutOf(const ps::TrainingConfig& config) {
  return TableLayoutOf(ps::SparseRuleOf(config));
}

absl::StatusOr<TableLayout> TableLayoutOf(const ps::table::SparseRuleConfig& config) {
  auto rule = ps::table::SparseRule::Make(config);
  if (!rule.ok()) return rule.status();
  return TableLayout{rule->slot_names(), rule->kind() == ps::table::SparseRuleKind::kAdam};
}

absl::Status WriteTables(ps::PsClient& client, const std::vector<dist::TableSpec>& tables, const TableLayout& layout,
                         ckpt::SafetensorsWriter& writer, const ps::TableScanOptions& options) {
  return WriteTables(
      [&client, &options](const std::string& table, int64_t max_rows,
                          const std::function<absl::Status(ps::TableRowsPart part)>& sink) {
        return client.ScanTable(table, max_rows, options, sink);
      },
      tables, layout, writer, options.increment);
}

absl::Status WriteTables(const TableScan& scan, const std::vector<dist::TableSpec>& tables, const TableLayout& layout,
                         ckpt::SafetensorsWriter& writer, bool increment) {
  for (const dist::TableSpec& t : tables) {
    const Names names = NamesOf(t, layout);
    const size_t num_slots = layout.slot_names.size();
    int ids = -1, last = -1, count = -1;
    std::vector<int> slots;
    auto begin = [&](const std::string& name, ckpt::Dtype dtype, Shape row, int* handle) -> absl::Status {
      auto h = writer.BeginStreamed(name, dtype, std::move(row));
      if (!h.ok()) return h.status();
      *handle = *h;
      return absl::OkStatus();
    };
    int values = -1, removed = -1;
    // An increment lists a fixed table's ids too (its rows are some of 0..N-1).
    if (t.dynamic() || increment) {
      if (auto s = begin(t.name + "/ids", ckpt::Dtype::kI64, {}, &ids); !s.ok()) return s;
    }
    if (t.dynamic() && increment) {
      if (auto s = begin(t.name + "/removed", ckpt::Dtype::kI64, {}, &removed); !s.ok()) return s;
    }
    if (auto s = begin(names.values, ckpt::Dtype::kF32, {t.dim}, &values); !s.ok()) return s;
    for (const std::string& slot : names.slots) {
      slots.push_back(-1);
      if (auto s = begin(slot, ckpt::Dtype::kF32, {t.dim}, &slots.back()); !s.ok()) return s;
    }
    if (t.dynamic()) {
      if (auto s = begin(names.last_step, ckpt::Dtype::kI64, {}, &last); !s.ok()) return s;
    }
    if (HasCount(t, layout)) {
      if (auto s = begin(names.count, ckpt::Dtype::kI64, {}, &count); !s.ok()) return s;
    }
    int64_t next_fixed = 0;  // a fixed table's rows come as ids 0..N-1
    absl::Status scanned = scan(t.name, PartRows(t.dim, num_slots), [&](ps::TableRowsPart part) -> absl::Status {
      const size_t n = part.ids.size();
      if (part.slots.size() != num_slots) {
        return absl::DataLossError(absl::StrCat("table '", t.name, "': the ps tasks keep ", part.slots.size(),
                                                " slots a row, the sparse rule has ", num_slots));
      }
      if (!part.removed_ids.empty()) {
        if (removed < 0) {
          return absl::DataLossError(absl::StrCat("table '", t.name, "': removed ids in a full save's scan"));
        }
        if (auto s = writer.Append(removed, part.removed_ids.data(), part.removed_ids.size()); !s.ok()) return s;
      }
      if (!t.dynamic() && !increment) {
        for (size_t q = 0; q < n; ++q) {
          if (part.ids[q] != next_fixed++) {
            return absl::DataLossError(absl::StrCat("table '", t.name, "': the scan gave row ", part.ids[q],
                                                    " where row ", next_fixed - 1, " was due"));
          }
        }
      } else if (auto s = writer.Append(ids, part.ids.data(), n); !s.ok()) {
        return s;
      }
      if (auto s = writer.Append(values, part.values.data(), n * static_cast<size_t>(t.dim)); !s.ok()) return s;
      for (size_t j = 0; j < num_slots; ++j) {
        if (auto s = writer.Append(slots[j], part.slots[j].data(), n * static_cast<size_t>(t.dim)); !s.ok()) return s;
      }
      if (last >= 0) {
        if (auto s = writer.Append(last, part.last_step.data(), n); !s.ok()) return s;
      }
      if (count >= 0) {
        if (auto s = writer.Append(count, part.count.data(), n); !s.ok()) return s;
      }
      return absl::OkStatus();
    });
    if (!scanned.ok()) return scanned;
    if (!t.dynamic() && !increment && next_fixed != t.num_embeddings) {
      return absl::DataLossError(
          absl::StrCat("table '", t.name, "': the scan gave ", next_fixed, " rows of ", t.num_embeddings));
    }
  }
  return absl::OkStatus();
}

namespace {

// Checks that `name` is in the file with `dtype` and shape [rows, dim...]; rows < 0: any.
absl::Status Expect(const ckpt::SafetensorsReader& reader, const std::string& table, const std::string& name,
                    ckpt::Dtype dtype, int64_t rows, int64_t dim, int64_t* rows_found) {
  const ckpt::TensorEntry* e = reader.Find(name);
  auto bad = [&](auto&&... parts) {
    return absl::FailedPreconditionError(absl::StrCat(reader.path(), ": table '", table, "': ", parts...));
  };
  if (e == nullptr) return bad("the file has no tensor '", name, "' (another --sparse_optimizer or model?)");
  if (e->dtype != dtype) return bad("'", name, "' is ", ckpt::DtypeName(e->dtype), ", not ", ckpt::DtypeName(dtype));
  if (dim > 0 && (e->shape.size() != 2 || e->shape[1] != dim)) {
    return bad("'", name, "' has shape ", ShapeToString(e->shape), ", the table's dim is ", dim,
               "; use another --checkpoint_dir or the checkpoint's dim");
  }
  if (dim == 0 && e->shape.size() != 1) return bad("'", name, "' has shape ", ShapeToString(e->shape), ", not [n]");
  if (rows >= 0 && e->shape[0] != rows) {
    return bad("'", name, "' has ", e->shape[0], " rows, the table has ", rows,
               "; use another --checkpoint_dir or the checkpoint's size");
  }
  if (rows_found != nullptr) *rows_found = e->shape[0];
  return absl::OkStatus();
}

// A table's columns read side by side.
struct TableReader {
  const ckpt::SafetensorsReader* reader = nullptr;
  dist::TableSpec spec;
  Names names;
  bool has_count = false;
  int64_t rows = 0, next = 0;
  std::unique_ptr<ckpt::SafetensorsReader::Stream> ids, values, last_step, count;
  std::vector<std::unique_ptr<ckpt::SafetensorsReader::Stream>> slots;

  absl::Status Open() {
    auto open = [&](const std::string& name, ckpt::Dtype dtype, std::unique_ptr<ckpt::SafetensorsReader::Stream>* to) {
      auto s = reader->OpenStream(name, dtype);
      if (!s.ok()) return s.status();
      *to = *std::move(s);
      return absl::OkStatus();
    };
    if (spec.dynamic()) {
      if (auto s = open(names.ids, ckpt::Dtype::kI64, &ids); !s.ok()) return s;
      if (auto s = open(names.last_step, ckpt::Dtype::kI64, &last_step); !s.ok()) return s;
    }
    if (auto s = open(names.values, ckpt::Dtype::kF32, &values); !s.ok()) return s;
    if (has_count) {
      if (auto s = open(names.count, ckpt::Dtype::kI64, &count); !s.ok()) return s;
    }
    slots.resize(names.slots.size());
    for (size_t j = 0; j < slots.size(); ++j) {
      if (auto s = open(names.slots[j], ckpt::Dtype::kF32, &slots[j]); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> NextPart(ps::TableRowsPart* part) {
    if (values == nullptr) {
      if (auto s = Open(); !s.ok()) return s;
    }
    const int64_t n = std::min(rows - next, PartRows(spec.dim, slots.size()));
    if (n <= 0) {
      ids.reset(), values.reset(), last_step.reset(), count.reset(), slots.clear();  // closes the file handles
      return false;
    }
    part->table = spec.name;
    part->ids.resize(n);
    part->last_step.assign(n, 0);
    part->count.assign(n, 0);
    if (spec.dynamic()) {
      if (auto s = ids->Read(part->ids.data(), n); !s.ok()) return s;
      if (auto s = last_step->Read(part->last_step.data(), n); !s.ok()) return s;
    } else {
      for (int64_t q = 0; q < n; ++q) part->ids[q] = next + q;
    }
    if (count != nullptr) {
      if (auto s = count->Read(part->count.data(), n); !s.ok()) return s;
    }
    part->values = Tensor::Uninitialized({n, spec.dim});
    if (auto s = values->Read(part->values.data(), n * spec.dim); !s.ok()) return s;
    part->slots.clear();
    for (auto& slot : slots) {
      part->slots.push_back(Tensor::Uninitialized({n, spec.dim}));
      if (auto s = slot->Read(part->slots.back().data(), n * spec.dim); !s.ok()) return s;
    }
    next += n;
    return true;
  }
};

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, ps::TablePartSource>>> TableSources(
    const ckpt::SafetensorsReader& reader, const std::vector<dist::TableSpec>& tables, const TableLayout& layout) {
  std::vector<std::pair<std::string, ps::TablePartSource>> sources;
  for (const dist::TableSpec& t : tables) {
    auto r = std::make_shared<TableReader>();
    r->reader = &reader;
    r->spec = t;
    r->names = NamesOf(t, layout);
    r->has_count = HasCount(t, layout);
    const int64_t want = t.dynamic() ? -1 : t.num_embeddings;
    if (auto s = Expect(reader, t.name, r->names.values, ckpt::Dtype::kF32, want, t.dim, &r->rows); !s.ok()) return s;
    for (const std::string& slot : r->names.slots) {
      if (auto s = Expect(reader, t.name, slot, ckpt::Dtype::kF32, r->rows, t.dim, nullptr); !s.ok()) return s;
    }
    if (t.dynamic()) {
      for (const std::string& name : {r->names.ids, r->names.last_step}) {
        if (auto s = Expect(reader, t.name, name, ckpt::Dtype::kI64, r->rows, 0, nullptr); !s.ok()) return s;
      }
    }
    if (r->has_count) {
      if (auto s = Expect(reader, t.name, r->names.count, ckpt::Dtype::kI64, r->rows, 0, nullptr); !s.ok()) return s;
    }
    sources.emplace_back(t.name, [r](ps::TableRowsPart* part) { return r->NextPart(part); });
  }
  return sources;
}

namespace {

// A file's ascending int64 column (a table's NAME/ids) searched without reading it whole: a binary
// search over blocks of kBlock ids, each probe one read of a block's first id (cached), then the
// block read once. Lookups must come in ascending id order (a sorted request): each starts where
// the previous one ended.
class SortedIds {
 public:
  static constexpr int64_t kBlock = 4096;

  SortedIds(const ckpt::SafetensorsReader& reader, std::string name, int64_t rows)
      : reader_(reader), name_(std::move(name)), rows_(rows), blocks_((rows + kBlock - 1) / kBlock) {}

  // The row of `id` in the column, or -1.
  absl::StatusOr<int64_t> Find(int64_t id) {
    if (rows_ == 0) return -1;
    if (loaded_ < 0 || id > block_.back()) {
      // The last block (from the current one on) whose first id is <= id.
      int64_t lo = std::max<int64_t>(loaded_, 0), hi = blocks_ - 1;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        auto first = FirstId(mid);
        if (!first.ok()) return first.status();
        if (*first <= id) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      if (lo != loaded_) {
        if (auto s = Load(lo); !s.ok()) return s;
      }
    }
    auto it = std::lower_bound(block_.begin(), block_.end(), id);
    if (it == block_.end() || *it != id) return -1;
    return loaded_ * kBlock + (it - block_.begin());
  }

 private:
  absl::StatusOr<int64_t> FirstId(int64_t block) {
    if (auto it = first_.find(block); it != first_.end()) return it->second;
    auto stream = reader_.OpenStream(name_, ckpt::Dtype::kI64);
    if (!stream.ok()) return stream.status();
    if (auto s = (*stream)->Skip(static_cast<size_t>(block * kBlock)); !s.ok()) return s;
    int64_t id = 0;
    if (auto s = (*stream)->Read(&id, 1); !s.ok()) return s;
    first_[block] = id;
    return id;
  }
  absl::Status Load(int64_t block) {
    auto stream = reader_.OpenStream(name_, ckpt::Dtype::kI64);
    if (!stream.ok()) return stream.status();
    if (auto s = (*stream)->Skip(static_cast<size_t>(block * kBlock)); !s.ok()) return s;
    block_.resize(static_cast<size_t>(std::min(kBlock, rows_ - block * kBlock)));
    if (auto s = (*stream)->Read(block_.data(), block_.size()); !s.ok()) return s;
    loaded_ = block;
    return absl::OkStatus();
  }

  const ckpt::SafetensorsReader& reader_;
  const std::string name_;
  const int64_t rows_, blocks_;
  std::map<int64_t, int64_t> first_;  // block -> its first id
  int64_t loaded_ = -1;
  std::vector<int64_t> block_;
};

// From one file of a chain, the rows of the wanted ids it decides: for each index q in `pending`
// (ascending ids), the file's row (copied into out, found) or its removal (not found); the ids it
// does not mention stay in `pending` for the files before it. `fixed_full`: a fixed table's full
// save (ids implicit, 0..N-1).
absl::Status ReadFromLink(const ckpt::SafetensorsReader& file, const dist::TableSpec& table,
                          const std::vector<int64_t>& ids, bool fixed_full, std::vector<size_t>* pending, Tensor* out,
                          std::vector<bool>* found) {
  const ckpt::TensorEntry* values = file.Find(table.name);
  if (values == nullptr || values->dtype != ckpt::Dtype::kF32 || values->shape.size() != 2 ||
      values->shape[1] != table.dim) {
    return absl::FailedPreconditionError(
        absl::StrCat(file.path(), ": table '", table.name, "' is not [rows, ", table.dim, "] float32 there"));
  }
  const int64_t rows = values->shape[0];
  std::vector<std::pair<int64_t, size_t>> at;  // (row in the file, index in ids), ascending
  std::vector<size_t> left;
  if (fixed_full) {
    for (size_t q : *pending) {
      if (ids[q] >= 0 && ids[q] < rows) {
        at.emplace_back(ids[q], q);
      } else {
        left.push_back(q);
      }
    }
  } else {
    const ckpt::TensorEntry* file_ids = file.Find(table.name + "/ids");
    if (file_ids == nullptr || file_ids->dtype != ckpt::Dtype::kI64 || file_ids->elements() != rows) {
      return absl::FailedPreconditionError(absl::StrCat(file.path(), ": table '", table.name, "' has no int64 '",
                                                        table.name, "/ids' of ", rows, " ids"));
    }
    // An increment's removed ids (what changed since the save before: small).
    std::vector<int64_t> removed;
    if (file.Find(table.name + "/removed") != nullptr) {
      auto read = file.ReadI64(table.name + "/removed");
      if (!read.ok()) return read.status();
      removed = *std::move(read);
    }
    SortedIds index(file, table.name + "/ids", rows);
    for (size_t q : *pending) {
      auto row = index.Find(ids[q]);
      if (!row.ok()) return row.status();
      if (*row >= 0) {
        at.emplace_back(*row, q);  // within one file the row wins over a removal
      } else if (std::binary_search(removed.begin(), removed.end(), ids[q])) {
        (*found)[q] = false;  // removed since the saves before: absent
      } else {
        left.push_back(q);
      }
    }
  }
  if (!at.empty()) {
    auto stream = file.OpenStream(table.name, ckpt::Dtype::kF32);
    if (!stream.ok()) return stream.status();
    int64_t row = 0;
    for (const auto& [r, q] : at) {
      if (auto s = (*stream)->Skip(static_cast<size_t>((r - row) * table.dim)); !s.ok()) return s;
      if (auto s = (*stream)->Read(out->data() + q * table.dim, table.dim); !s.ok()) return s;
      row = r + 1;
      (*found)[q] = true;
    }
  }
  pending->swap(left);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> ReadTableRows(const ckpt::SafetensorsReader& reader, const dist::TableSpec& table,
                                     const std::vector<int64_t>& ids, std::vector<bool>* found) {
  int64_t rows = 0;
  const int64_t want = table.dynamic() ? -1 : table.num_embeddings;
  if (auto s = Expect(reader, table.name, table.name, ckpt::Dtype::kF32, want, table.dim, &rows); !s.ok()) return s;
  Tensor out({static_cast<int64_t>(ids.size()), table.dim});
  found->assign(ids.size(), false);
  std::vector<size_t> pending(ids.size());
  for (size_t q = 0; q < ids.size(); ++q) pending[q] = q;
  if (auto s = ReadFromLink(reader, table, ids, !table.dynamic(), &pending, &out, found); !s.ok()) return s;
  return out;
}

namespace {

// A table's rows merged over a checkpoint chain, as TableRowsParts (the columns by the layout's
// names).
struct ChainSource {
  dist::TableSpec spec;
  std::unique_ptr<ckpt::ChainTableReader> merged;
  int values = -1, last_step = -1, count = -1;
  std::vector<int> slots;
  size_t num_slots = 0;

  absl::StatusOr<bool> NextPart(ps::TableRowsPart* part) {
    std::vector<int64_t> ids;
    std::vector<std::vector<char>> columns;
    auto more = merged->Next(PartRows(spec.dim, num_slots), &ids, &columns);
    if (!more.ok() || !*more) return more;
    const int64_t n = static_cast<int64_t>(ids.size());
    part->table = spec.name;
    part->ids = std::move(ids);
    auto floats = [&](int c) {
      Tensor t = Tensor::Uninitialized({n, spec.dim});
      std::memcpy(t.data(), columns[c].data(), columns[c].size());
      return t;
    };
    auto int64s = [&](int c) {
      std::vector<int64_t> v(static_cast<size_t>(n), 0);
      if (c >= 0) std::memcpy(v.data(), columns[c].data(), columns[c].size());
      return v;
    };
    part->values = floats(values);
    part->slots.clear();
    for (int c : slots) part->slots.push_back(floats(c));
    part->last_step = int64s(last_step);
    part->count = int64s(count);
    part->removed_ids.clear();
    return true;
  }
};

absl::StatusOr<std::unique_ptr<ChainSource>> OpenChainSource(const ckpt::OpenedCheckpoint& checkpoint,
                                                             const dist::TableSpec& t, const TableLayout& layout) {
  auto merged = ckpt::ChainTableReader::Open(checkpoint.chain(), t.name);
  if (!merged.ok()) return merged.status();
  auto source = std::make_unique<ChainSource>();
  source->spec = t;
  source->merged = *std::move(merged);
  const Names names = NamesOf(t, layout);
  auto column = [&](const std::string& name, ckpt::Dtype dtype, int64_t row_elements) -> absl::StatusOr<int> {
    const auto& columns = source->merged->columns();
    for (size_t c = 0; c < columns.size(); ++c) {
      if (columns[c].name == name && columns[c].dtype == dtype && columns[c].row_elements == row_elements) {
        return static_cast<int>(c);
      }
    }
    return absl::FailedPreconditionError(
        absl::StrCat(checkpoint.path, ": table '", t.name, "': its chain has no column '", name, "'"));
  };
  auto v = column(names.values, ckpt::Dtype::kF32, t.dim);
  if (!v.ok()) return v.status();
  source->values = *v;
  for (const std::string& slot : names.slots) {
    auto c = column(slot, ckpt::Dtype::kF32, t.dim);
    if (!c.ok()) return c.status();
    source->slots.push_back(*c);
  }
  source->num_slots = names.slots.size();
  if (t.dynamic()) {
    auto c = column(names.last_step, ckpt::Dtype::kI64, 1);
    if (!c.ok()) return c.status();
    source->last_step = *c;
  }
  if (HasCount(t, layout)) {
    auto c = column(names.count, ckpt::Dtype::kI64, 1);
    if (!c.ok()) return c.status();
    source->count = *c;
  }
  return source;
}

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, ps::TablePartSource>>> TableSources(
    const ckpt::OpenedCheckpoint& checkpoint, const std::vector<dist::TableSpec>& tables, const TableLayout& layout) {
  // The full save is checked as a lone file is; the increments against it (ChainTableReader).
  const ckpt::SafetensorsReader& full = *checkpoint.chain().front();
  auto checked = TableSources(full, tables, layout);
  if (!checked.ok() || checkpoint.earlier.empty()) return checked;
  std::vector<std::pair<std::string, ps::TablePartSource>> sources;
  for (const dist::TableSpec& t : tables) {
    auto source = OpenChainSource(checkpoint, t, layout);
    if (!source.ok()) return source.status();
    std::shared_ptr<ChainSource> shared = *std::move(source);
    sources.emplace_back(t.name, [shared](ps::TableRowsPart* part) { return shared->NextPart(part); });
  }
  return sources;
}

absl::StatusOr<Tensor> ReadTableRows(const ckpt::OpenedCheckpoint& checkpoint, const dist::TableSpec& table,
                                     const std::vector<int64_t>& ids, std::vector<bool>* found) {
  if (checkpoint.earlier.empty()) return ReadTableRows(*checkpoint.reader, table, ids, found);
  // A chain: the newest file first, each asked only for the ids the files after it did not
  // mention (a search of its sorted ids, not a read of its rows), the full save last. What this
  // reads grows with the ids asked and the chain's length, not with the table.
  const std::vector<const ckpt::SafetensorsReader*> links = checkpoint.chain();
  Tensor out({static_cast<int64_t>(ids.size()), table.dim});
  found->assign(ids.size(), false);
  std::vector<size_t> pending(ids.size());
  for (size_t q = 0; q < ids.size(); ++q) pending[q] = q;
  for (size_t k = links.size(); k-- > 0 && !pending.empty();) {
    const bool full = k == 0;
    if (auto s = ReadFromLink(*links[k], table, ids, full && !table.dynamic(), &pending, &out, found); !s.ok()) {
      return s;
    }
  }
  return out;
}

namespace {

// One file's ascending ids, a buffer at a time, and its removed ids.
struct IdCursor {
  std::unique_ptr<ckpt::SafetensorsReader::Stream> stream;
  std::vector<int64_t> buf;
  size_t pos = 0;
  std::vector<int64_t> removed;
  size_t removed_pos = 0;

  absl::Status Fill() {
    if (pos < buf.size() || stream == nullptr || stream->remaining() == 0) return absl::OkStatus();
    buf.resize(static_cast<size_t>(std::min<int64_t>(stream->remaining(), 1 << 16)));
    pos = 0;
    return stream->Read(buf.data(), buf.size());
  }
  bool has_id() const { return pos < buf.size(); }
  bool has_removed() const { return removed_pos < removed.size(); }
};

}  // namespace

absl::StatusOr<int64_t> CountTableRows(const ckpt::OpenedCheckpoint& checkpoint, const dist::TableSpec& table) {
  const std::vector<const ckpt::SafetensorsReader*> links = checkpoint.chain();
  const ckpt::SafetensorsReader& full = *links.front();
  const ckpt::TensorEntry* values = full.Find(table.name);
  if (values == nullptr || values->shape.empty()) {
    return absl::NotFoundError(absl::StrCat(full.path(), " has no table '", table.name, "'"));
  }
  // A fixed table holds every row always; a lone full save, the rows it lists.
  if (!table.dynamic() || links.size() == 1) return values->shape[0];
  std::vector<IdCursor> cursors(links.size());
  for (size_t k = 0; k < links.size(); ++k) {
    auto stream = links[k]->OpenStream(table.name + "/ids", ckpt::Dtype::kI64);
    if (!stream.ok()) return stream.status();
    cursors[k].stream = *std::move(stream);
    if (links[k]->Find(table.name + "/removed") != nullptr) {
      auto removed = links[k]->ReadI64(table.name + "/removed");
      if (!removed.ok()) return removed.status();
      cursors[k].removed = *std::move(removed);
    }
    if (auto s = cursors[k].Fill(); !s.ok()) return s;
  }
  int64_t rows = 0;
  while (true) {
    // The smallest id any file mentions next.
    bool any = false;
    int64_t id = 0;
    for (const IdCursor& c : cursors) {
      if (c.has_id() && (!any || c.buf[c.pos] < id)) id = c.buf[c.pos], any = true;
      if (c.has_removed() && (!any || c.removed[c.removed_pos] < id)) id = c.removed[c.removed_pos], any = true;
    }
    if (!any) break;
    // The newest file that mentions it decides (within a file, its row wins over its removal).
    bool decided = false;
    for (size_t k = cursors.size(); k-- > 0;) {
      IdCursor& c = cursors[k];
      const bool row = c.has_id() && c.buf[c.pos] == id;
      const bool gone = c.has_removed() && c.removed[c.removed_pos] == id;
      if (!decided && (row || gone)) {
        rows += row ? 1 : 0;
        decided = true;
      }
      if (row) {
        ++c.pos;
        if (auto s = c.Fill(); !s.ok()) return s;
        if (c.has_id() && c.buf[c.pos] <= id) {
          return absl::DataLossError(absl::StrCat(links[k]->path(), ": '", table.name, "/ids' does not ascend"));
        }
      }
      if (gone) ++c.removed_pos;
    }
  }
  return rows;
}

}  // namespace psflow::train
