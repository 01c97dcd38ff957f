// Criteo's text layout, line by line (psflow/data/criteo.h): the parser the reader runs on every
// line, the dense transform, the line writer, and file patterns.
//
// The parser walks a line once, byte by byte, with no bounds checks: the text it is given always
// holds a '\n' at the end of each line (the reader appends one to a last line that lacks it), and
// '\n' stops every field. A line that breaks the grammar is described afterwards from its text
// (slow, but only for bad lines).
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "data/criteo_internal.h"

namespace psflow::data {
namespace {

constexpr int kMaxFieldCount = 4096;
constexpr int64_t kDenseTableSize = 4096;  // CriteoDenseValue of 0..4095 precomputed

// 0..15 for a hex digit, 0xff for any other byte.
constexpr std::array<uint8_t, 256> MakeHexTable() {
  std::array<uint8_t, 256> t{};
  for (auto& v : t) v = 0xff;
  for (int c = '0'; c <= '9'; ++c) t[c] = static_cast<uint8_t>(c - '0');
  for (int c = 'a'; c <= 'f'; ++c) t[c] = static_cast<uint8_t>(c - 'a' + 10);
  for (int c = 'A'; c <= 'F'; ++c) t[c] = static_cast<uint8_t>(c - 'A' + 10);
  return t;
}
constexpr std::array<uint8_t, 256> kHex = MakeHexTable();

float DenseOfCount(int64_t x) { return x <= 0 ? 0.0f : static_cast<float>(std::log1p(static_cast<double>(x))); }

const float* DenseTable() {
  static const float* table = [] {
    auto* t = new float[kDenseTableSize];
    for (int64_t i = 0; i < kDenseTableSize; ++i) t[i] = DenseOfCount(i);
    return t;
  }();
  return table;
}

enum class Fault : uint8_t { kNone, kLabel, kInteger, kIntegerRange, kHex, kHexLong, kFieldCount };
struct LineFault {
  Fault fault = Fault::kNone;
  int field = 0;  // among all fields: 0 is the label, then the integers, then the categoricals
};

inline bool IsDigit(char c) { return static_cast<unsigned>(static_cast<unsigned char>(c)) - '0' < 10u; }

// After field `field` (the last one if `last`): steps over its separator, or records why not.
inline bool Separator(const char*& p, bool last, int field, Fault value_fault, LineFault* fault) {
  if (!last) {
    if (*p == '\t') {
      ++p;
      return true;
    }
  } else {
    if (*p == '\n') {
      ++p;
      return true;
    }
    if (*p == '\r' && p[1] == '\n') {
      p += 2;
      return true;
    }
  }
  const bool boundary = *p == '\t' || *p == '\n' || (*p == '\r' && p[1] == '\n');
  fault->fault = boundary ? Fault::kFieldCount : value_fault;
  fault->field = field;
  return false;
}

// Digits of a decimal integer of more than 18 digits (leading zeros included) in int64's range?
bool LongIntegerFits(const char* digits, size_t n, bool negative) {
  while (n > 1 && *digits == '0') {
    ++digits;
    --n;
  }
  if (n < 19) return true;
  if (n > 19) return false;
  return std::memcmp(digits, negative ? "9223372036854775808" : "9223372036854775807", 19) <= 0;
}

// Parses the line at p (the text holds a '\n' at or after p) into ids, dense and *label; returns a
// pointer just past its '\n', or null with *fault set.
inline const char* ParseLine(const char* p, int num_dense, int num_fields, const float* dense_table, int64_t* ids,
                             float* dense, float* label, LineFault* fault) {
  const int total = 1 + num_dense + num_fields;
  if ((*p != '0' && *p != '1')) {
    const bool boundary = *p == '\t' || *p == '\n' || (*p == '\r' && p[1] == '\n');
    *fault = {boundary && total > 1 && *p == '\n' ? Fault::kFieldCount : Fault::kLabel, 0};
    return nullptr;
  }
  *label = static_cast<float>(*p - '0');
  ++p;
  if (!Separator(p, total == 1, 0, Fault::kLabel, fault)) return nullptr;
  for (int d = 0; d < num_dense; ++d) {
    const bool negative = *p == '-';
    p += negative;
    const char* digits = p;
    uint64_t v = 0;
    while (IsDigit(*p)) {
      v = v * 10 + static_cast<uint64_t>(*p - '0');
      ++p;
    }
    const size_t n = static_cast<size_t>(p - digits);
    const int field = 1 + d;
    if (n == 0 && negative) {
      *fault = {Fault::kInteger, field};
      return nullptr;
    }
    if (n > 18 && !LongIntegerFits(digits, n, negative)) {
      *fault = {Fault::kIntegerRange, field};
      return nullptr;
    }
    dense[d] = negative ? 0.0f
                        : (v < static_cast<uint64_t>(kDenseTableSize) ? dense_table[v]
                                                                      : DenseOfCount(static_cast<int64_t>(v)));
    if (!Separator(p, field == total - 1, field, Fault::kInteger, fault)) return nullptr;
  }
  for (int f = 0; f < num_fields; ++f) {
    const char* digits = p;
    uint64_t v = 0;
    uint8_t h;
    while ((h = kHex[static_cast<unsigned char>(*p)]) < 16) {
      v = (v << 4) | h;
      ++p;
    }
    const int field = 1 + num_dense + f;
    if (p - digits > 16) {
      *fault = {Fault::kHexLong, field};
      return nullptr;
    }
    ids[f] = static_cast<int64_t>(v);
    if (!Separator(p, field == total - 1, field, Fault::kHex, fault)) return nullptr;
  }
  return p;
}

std::string FieldName(int field, const CriteoLayout& layout) {
  if (field == 0) return "label";
  if (field <= layout.num_dense) return absl::StrCat("I", field);
  return absl::StrCat("C", field - layout.num_dense);
}

std::vector<std::string_view> SplitTabs(std::string_view line) {
  std::vector<std::string_view> fields;
  for (size_t at = 0;;) {
    const size_t tab = line.find('\t', at);
    fields.push_back(line.substr(at, tab == std::string_view::npos ? std::string_view::npos : tab - at));
    if (tab == std::string_view::npos) return fields;
    at = tab + 1;
  }
}

// What is wrong with `line` (no '\n'), which ParseLine refused with `fault`.
std::string DescribeFault(std::string_view line, const LineFault& fault, const CriteoLayout& layout) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const std::vector<std::string_view> fields = SplitTabs(line);
  const size_t expected = 1 + static_cast<size_t>(layout.num_dense) + static_cast<size_t>(layout.num_fields);
  if (fault.fault == Fault::kFieldCount || fields.size() != expected) {
    return absl::StrCat(fields.size(), " tab-separated field", fields.size() == 1 ? "" : "s", "; expected ", expected,
                        " (", internal::DescribeLayout(layout), "): set --ctr_dense and --ctr_fields to the files' "
                        "counts");
  }
  std::string_view text = fields[fault.field];
  std::string shown(text.substr(0, 40));
  if (text.size() > 40) shown += "…";
  const std::string name = FieldName(fault.field, layout);
  switch (fault.fault) {
    case Fault::kLabel:
      return absl::StrCat("label '", shown, "' is not 0 or 1");
    case Fault::kInteger:
      return absl::StrCat("integer field ", name, " '", shown, "' is not a decimal integer (or empty)");
    case Fault::kIntegerRange:
      return absl::StrCat("integer field ", name, " '", shown, "' is outside the int64 range");
    case Fault::kHex:
      return absl::StrCat("categorical field ", name, " '", shown, "' is not a hex string (0-9, a-f; or empty)");
    case Fault::kHexLong:
      return absl::StrCat("categorical field ", name, " '", shown, "' has ", text.size(),
                          " hex digits; at most 16 fit an int64");
    default:
      return "bad line";
  }
}

void AppendHex(uint64_t v, std::string* out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const int n = v == 0 ? 1 : (67 - std::countl_zero(v)) / 4;
  char buf[16];
  for (int i = n - 1; i >= 0; --i) {
    buf[i] = kDigits[v & 15];
    v >>= 4;
  }
  out->append(buf, n);
}

}  // namespace

namespace internal {

std::string DescribeLayout(const CriteoLayout& layout) {
  return absl::StrCat("label, ", layout.num_dense, " integer", layout.num_dense == 1 ? "" : "s", " and ",
                      layout.num_fields, " categorical", layout.num_fields == 1 ? "" : "s");
}

void ParseCriteoChunk(const char* text, size_t size, const CriteoLayout& layout, ParsedChunk* out) {
  const int64_t lines = std::count(text, text + size, '\n');
  const int num_dense = layout.num_dense, num_fields = layout.num_fields;
  if (static_cast<int64_t>(out->labels.size()) < lines) {
    out->ids.resize(lines * num_fields);
    out->dense.resize(lines * num_dense);
    out->labels.resize(lines);
  }
  out->bad.clear();
  const float* table = DenseTable();
  const char* p = text;
  const char* const end = text + size;
  int64_t n = 0;
  while (p < end) {
    LineFault fault;
    const char* next = ParseLine(p, num_dense, num_fields, table, out->ids.data() + n * num_fields,
                                 out->dense.data() + n * num_dense, out->labels.data() + n, &fault);
    if (next != nullptr) {
      ++n;
      p = next;
      continue;
    }
    const char* line_end = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
    out->bad.push_back({p - text, DescribeFault(std::string_view(p, line_end - p), fault, layout)});
    p = line_end + 1;
  }
  out->lines = lines;
  out->examples = n;
}

}  // namespace internal

float CriteoDenseValue(int64_t x) { return x >= 0 && x < kDenseTableSize ? DenseTable()[x] : DenseOfCount(x); }

absl::Status ParseCriteoLine(std::string_view line, const CriteoLayout& layout, int64_t* ids, float* dense,
                             float* label) {
  if (layout.num_dense < 0 || layout.num_dense > kMaxFieldCount || layout.num_fields < 0 ||
      layout.num_fields > kMaxFieldCount) {
    return absl::InvalidArgumentError(absl::StrCat("Criteo layout: ", layout.num_dense, " integers and ",
                                                   layout.num_fields, " categoricals; each must be in [0, 4096]"));
  }
  if (line.find('\n') != std::string_view::npos) {
    return absl::InvalidArgumentError("a line holds a '\\n': pass one line without its end");
  }
  std::string text(line);
  text.push_back('\n');
  LineFault fault;
  if (ParseLine(text.data(), layout.num_dense, layout.num_fields, DenseTable(), ids, dense, label, &fault) == nullptr) {
    return absl::InvalidArgumentError(DescribeFault(line, fault, layout));
  }
  return absl::OkStatus();
}

void AppendCriteoLine(float label, absl::Span<const int64_t> counts, absl::Span<const int64_t> ids, std::string* out) {
  out->push_back(label > 0.5f ? '1' : '0');
  char buf[24];
  for (int64_t c : counts) {
    out->push_back('\t');
    const auto r = std::to_chars(buf, buf + sizeof(buf), c);
    out->append(buf, r.ptr);
  }
  for (int64_t id : ids) {
    out->push_back('\t');
    AppendHex(static_cast<uint64_t>(id), out);
  }
  out->push_back('\n');
}

absl::StatusOr<std::vector<std::string>> ExpandCriteoFiles(std::string_view patterns) {
  std::vector<std::string> files;
  bool any_pattern = false;
  for (absl::string_view piece : absl::StrSplit(absl::string_view(patterns.data(), patterns.size()), ',')) {
    const std::string pattern(absl::StripAsciiWhitespace(piece));
    if (pattern.empty()) continue;
    any_pattern = true;
    glob_t g;
    const int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
    std::vector<std::string> matches;
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        struct stat st;
        if (stat(g.gl_pathv[i], &st) == 0 && S_ISREG(st.st_mode)) matches.emplace_back(g.gl_pathv[i]);
      }
    }
    globfree(&g);
    if (rc != 0 && rc != GLOB_NOMATCH) {
      return absl::NotFoundError(absl::StrCat("data files '", pattern, "': cannot read a directory of the pattern"));
    }
    if (matches.empty()) {
      return absl::NotFoundError(
          absl::StrCat("data files '", pattern, "' match no file; check the path (a glob such as DIR/train-*)"));
    }
    std::sort(matches.begin(), matches.end());
    files.insert(files.end(), matches.begin(), matches.end());
  }
  if (!any_pattern) {
    return absl::InvalidArgumentError("data files: the list is empty; give a file, a glob (DIR/train-*) or a list");
  }
  return files;
}

std::vector<CriteoSlice> WholeFiles(const std::vector<std::string>& paths) {
  std::vector<CriteoSlice> slices;
  for (const std::string& p : paths) slices.push_back({p, 0, CriteoSlice::kToEnd});
  return slices;
}

}  // namespace psflow::data
