// Checkpoint chains: naming and the merged table reader (psflow/ckpt/checkpoint_chain.h).
#include "psflow/ckpt/checkpoint_chain.h"

#include <algorithm>
#include <cstring>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/random_id.h"

namespace psflow::ckpt {

std::string IncrementPath(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/model.ckpt-", step, ".increment.safetensors");
}

bool IsIncrementPath(const std::string& path) {
  static const std::regex kName(R"((^|.*/)model\.ckpt-\d+\.increment\.safetensors)");
  return std::regex_match(path, kName);
}

std::string NewChainId() { return absl::StrFormat("%016x", RandomNonZeroId()); }

// One file of the chain: its rows (ids and columns) a buffer at a time, and its removed ids.
struct ChainTableReader::Link {
  const SafetensorsReader* reader = nullptr;
  int64_t rows = 0;     // in the file
  int64_t next_id = 0;  // implicit ids (a fixed table's full save)
  std::unique_ptr<SafetensorsReader::Stream> ids, removed;
  std::vector<std::unique_ptr<SafetensorsReader::Stream>> columns;
  std::vector<size_t> row_bytes, row_elements;
  // The buffer: rows [0, buffered) of which pos is next.
  std::vector<int64_t> buf_ids;
  std::vector<std::vector<char>> buf_columns;
  size_t pos = 0;
  int64_t last_id = INT64_MIN;
  bool first = true;
  std::vector<int64_t> buf_removed;
  size_t removed_pos = 0;
  int64_t last_removed = INT64_MIN;
  bool first_removed = true;

  absl::Status NotAscending(const char* what, int64_t id) const {
    return absl::DataLossError(absl::StrCat(reader->path(), ": its ", what, " do not ascend (", id, ")"));
  }

  // The next row's id (refilling the buffer), or false when the file has no rows left.
  absl::StatusOr<bool> Head(int64_t* id) {
    if (pos == buf_ids.size()) {
      const int64_t left = ids != nullptr ? ids->remaining() : rows - next_id;
      if (left <= 0) return false;
      size_t bytes_a_row = 8;
      for (size_t b : row_bytes) bytes_a_row += b;
      const int64_t n = std::min<int64_t>(left, std::max<int64_t>(256, (int64_t{4} << 20) / bytes_a_row));
      buf_ids.resize(n);
      if (ids != nullptr) {
        if (auto s = ids->Read(buf_ids.data(), n); !s.ok()) return s;
      } else {
        for (int64_t q = 0; q < n; ++q) buf_ids[q] = next_id + q;
        next_id += n;
      }
      buf_columns.resize(columns.size());
      for (size_t c = 0; c < columns.size(); ++c) {
        buf_columns[c].resize(n * row_bytes[c]);
        if (auto s = columns[c]->Read(buf_columns[c].data(), n * row_elements[c]); !s.ok()) return s;
      }
      pos = 0;
      for (int64_t q : buf_ids) {
        if (!first && q <= last_id) return NotAscending("ids", q);
        first = false;
        last_id = q;
      }
    }
    *id = buf_ids[pos];
    return true;
  }

  absl::StatusOr<bool> RemovedHead(int64_t* id) {
    if (removed_pos == buf_removed.size()) {
      if (removed == nullptr || removed->remaining() <= 0) return false;
      const int64_t n = std::min<int64_t>(removed->remaining(), 1 << 16);
      buf_removed.resize(n);
      if (auto s = removed->Read(buf_removed.data(), n); !s.ok()) return s;
      removed_pos = 0;
      for (int64_t q : buf_removed) {
        if (!first_removed && q <= last_removed) return NotAscending("removed ids", q);
        first_removed = false;
        last_removed = q;
      }
    }
    *id = buf_removed[removed_pos];
    return true;
  }
};

ChainTableReader::~ChainTableReader() = default;

absl::StatusOr<std::unique_ptr<ChainTableReader>> ChainTableReader::Open(std::vector<const SafetensorsReader*> links,
                                                                         const std::string& table) {
  if (links.empty()) return absl::InvalidArgumentError("a checkpoint chain of no files");
  const SafetensorsReader& full = *links.front();
  const TensorEntry* values = full.Find(table);
  if (values == nullptr || values->shape.empty()) {
    return absl::NotFoundError(absl::StrCat(full.path(), " has no table '", table, "'"));
  }
  std::unique_ptr<ChainTableReader> r(new ChainTableReader());
  r->base_rows_ = values->shape[0];
  r->has_ids_ = full.Find(table + "/ids") != nullptr;
  auto row_elements = [](const TensorEntry& e) {
    int64_t n = 1;
    for (size_t d = 1; d < e.shape.size(); ++d) n *= e.shape[d];
    return n;
  };
  r->columns_.push_back({table, values->dtype, row_elements(*values)});
  const std::string prefix = table + "/";
  for (const TensorEntry& e : full.tensors()) {
    if (e.name.rfind(prefix, 0) != 0 || e.name == table + "/ids" || e.name == table + "/removed") continue;
    if (e.shape.empty() || e.shape[0] != r->base_rows_) continue;
    r->columns_.push_back({e.name, e.dtype, row_elements(e)});
  }
  for (size_t i = 0; i < links.size(); ++i) {
    const SafetensorsReader& file = *links[i];
    auto link = std::make_unique<Link>();
    link->reader = &file;
    const TensorEntry* v = file.Find(table);
    if (v == nullptr || v->shape.empty()) {
      return absl::DataLossError(absl::StrCat(file.path(), ": no table '", table, "' (its chain's full save has it)"));
    }
    link->rows = v->shape[0];
    const bool need_ids = i > 0 || r->has_ids_;
    if (need_ids) {
      const TensorEntry* ids = file.Find(table + "/ids");
      if (ids == nullptr || ids->dtype != Dtype::kI64 || ids->shape.size() != 1 || ids->shape[0] != link->rows) {
        return absl::DataLossError(
            absl::StrCat(file.path(), ": table '", table, "' has no int64 '", table, "/ids' of ", link->rows, " rows"));
      }
      auto s = file.OpenStream(table + "/ids", Dtype::kI64);
      if (!s.ok()) return s.status();
      link->ids = *std::move(s);
    }
    if (i > 0) {
      if (const TensorEntry* gone = file.Find(table + "/removed"); gone != nullptr) {
        if (gone->dtype != Dtype::kI64 || gone->shape.size() != 1) {
          return absl::DataLossError(absl::StrCat(file.path(), ": '", table, "/removed' is not int64 [n]"));
        }
        auto s = file.OpenStream(table + "/removed", Dtype::kI64);
        if (!s.ok()) return s.status();
        link->removed = *std::move(s);
      }
    }
    for (const Column& c : r->columns_) {
      const TensorEntry* e = file.Find(c.name);
      if (e == nullptr || e->dtype != c.dtype || e->shape.empty() || e->shape[0] != link->rows ||
          row_elements(*e) != c.row_elements) {
        return absl::DataLossError(absl::StrCat(file.path(), ": table '", table, "' column '", c.name,
                                                "' is missing or differs from its chain's full save"));
      }
      auto s = file.OpenStream(c.name, c.dtype);
      if (!s.ok()) return s.status();
      link->columns.push_back(*std::move(s));
      link->row_bytes.push_back(static_cast<size_t>(c.row_elements) * DtypeBytes(c.dtype));
      link->row_elements.push_back(static_cast<size_t>(c.row_elements));
    }
    r->links_.push_back(std::move(link));
  }
  return r;
}

absl::StatusOr<bool> ChainTableReader::Next(int64_t max_rows, std::vector<int64_t>* ids,
                                            std::vector<std::vector<char>>* columns) {
  max_rows = std::max<int64_t>(max_rows, 1);
  ids->clear();
  columns->assign(columns_.size(), {});
  const size_t n = links_.size();
  std::vector<int64_t> head(n), removed_head(n);
  std::vector<char> has(n), has_removed(n);
  while (static_cast<int64_t>(ids->size()) < max_rows) {
    bool any = false;
    int64_t id = 0;
    for (size_t i = 0; i < n; ++i) {
      auto h = links_[i]->Head(&head[i]);
      if (!h.ok()) return h.status();
      has[i] = *h;
      auto g = links_[i]->RemovedHead(&removed_head[i]);
      if (!g.ok()) return g.status();
      has_removed[i] = *g;
      if (has[i] && (!any || head[i] < id)) id = head[i], any = true;
      if (has_removed[i] && (!any || removed_head[i] < id)) id = removed_head[i], any = true;
    }
    if (!any) break;
    // The newest file that mentions the id decides (its row wins over its own removal).
    size_t decided = n;  // the file whose row is taken (n: none)
    for (size_t k = n; k-- > 0;) {
      if (has[k] && head[k] == id) {
        decided = k;
        break;
      }
      if (has_removed[k] && removed_head[k] == id) break;
    }
    for (size_t i = 0; i < n; ++i) {
      if (has[i] && head[i] == id && i != decided) ++links_[i]->pos;
      if (has_removed[i] && removed_head[i] == id) ++links_[i]->removed_pos;
    }
    if (decided == n) continue;
    // A run of that file's buffered rows below every other file's next id (rows or removed): taken
    // at once (between increments, most of a full save's rows are such runs).
    int64_t bound = INT64_MAX;
    for (size_t i = 0; i < n; ++i) {
      if (i != decided) {
        auto h = links_[i]->Head(&head[i]);
        if (!h.ok()) return h.status();
        if (*h) bound = std::min(bound, head[i]);
      }
      auto g = links_[i]->RemovedHead(&removed_head[i]);
      if (!g.ok()) return g.status();
      if (*g) bound = std::min(bound, removed_head[i]);
    }
    Link& l = *links_[decided];
    const size_t begin = l.pos;
    size_t end = begin + 1;  // the decided row itself
    const size_t room = static_cast<size_t>(max_rows) - ids->size();
    while (end < l.buf_ids.size() && end - begin < room && l.buf_ids[end] < bound) ++end;
    ids->insert(ids->end(), l.buf_ids.begin() + begin, l.buf_ids.begin() + end);
    for (size_t c = 0; c < columns_.size(); ++c) {
      const char* from = l.buf_columns[c].data() + begin * l.row_bytes[c];
      (*columns)[c].insert((*columns)[c].end(), from, from + (end - begin) * l.row_bytes[c]);
    }
    l.pos = end;
  }
  return !ids->empty();
}

}  // namespace psflow::ckpt
