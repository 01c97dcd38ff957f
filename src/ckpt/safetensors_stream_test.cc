// Streamed safetensors: round trips of whole and streamed F32/I64 tensors, the checksum against
// the one computed from memory, a second reader (Python's json + struct, written independently
// from the format's description), temporary files, and bad input.
#include "psflow/ckpt/safetensors_stream.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/fault_injection_env.h"
#include "psflow/ckpt/checkpoint.h"

namespace psflow::ckpt {
namespace {

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The table-like file: ids I64 streamed in parts, values F32 [n, 3] streamed, a dense tensor whole.
struct Written {
  std::vector<int64_t> ids;
  std::vector<float> values;
  Tensor dense{Shape{2, 2}, {1.5f, -2, 3, 4e-30f}};
};

Written WriteTable(SafetensorsWriter& w, int parts, int rows_per_part) {
  Written x;
  EXPECT_TRUE(w.AddF32("dense", &x.dense).ok());
  auto ids = w.BeginStreamed("t/ids", Dtype::kI64, {});
  auto vals = w.BeginStreamed("t", Dtype::kF32, {3});
  EXPECT_TRUE(ids.ok() && vals.ok());
  for (int p = 0; p < parts; ++p) {
    std::vector<int64_t> id;
    std::vector<float> v;
    for (int r = 0; r < rows_per_part; ++r) {
      // Ids spanning the whole int64 range (negative, beyond 2^53) to catch any float conversion.
      id.push_back(int64_t(0x7000000000000001) / 977 * (p * rows_per_part + r) - (int64_t(1) << 62));
      for (int c = 0; c < 3; ++c) v.push_back(0.25f * (p * rows_per_part + r) - c);
    }
    EXPECT_TRUE(w.Append(*ids, id.data(), id.size()).ok());
    EXPECT_TRUE(w.Append(*vals, v.data(), v.size()).ok());
    x.ids.insert(x.ids.end(), id.begin(), id.end());
    x.values.insert(x.values.end(), v.begin(), v.end());
  }
  return x;
}

TEST(SafetensorsStreamTest, StreamedRoundTripInPartsAndWhole) {
  const std::string dir = TempDir("st_stream");
  const std::string path = dir + "/a.safetensors";
  SafetensorsWriter w(path);
  Written x = WriteTable(w, 5, 7);
  ASSERT_TRUE(w.Finish({{"k", "v"}}).ok());
  // Only the file remains: the streamed tensors' temporary files are gone.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);

  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->metadata().at("k"), "v");
  ASSERT_NE((*r)->Find("t"), nullptr);
  EXPECT_EQ((*r)->Find("t")->shape, (Shape{35, 3}));
  EXPECT_EQ((*r)->Find("t/ids")->shape, (Shape{35}));
  EXPECT_EQ((*r)->Find("t/ids")->dtype, Dtype::kI64);
  auto ids = (*r)->ReadI64("t/ids");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, x.ids);
  auto dense = (*r)->ReadF32("dense");
  ASSERT_TRUE(dense.ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ((*dense)[i], x.dense[i]);
  // Two columns read side by side in parts of 4 rows (the restore's pattern).
  auto s_ids = (*r)->OpenStream("t/ids", Dtype::kI64);
  auto s_val = (*r)->OpenStream("t", Dtype::kF32);
  ASSERT_TRUE(s_ids.ok() && s_val.ok());
  std::vector<int64_t> got_ids;
  std::vector<float> got_vals;
  while ((*s_ids)->remaining() > 0) {
    const size_t n = std::min<int64_t>(4, (*s_ids)->remaining());
    std::vector<int64_t> i(n);
    std::vector<float> v(n * 3);
    ASSERT_TRUE((*s_ids)->Read(i.data(), n).ok());
    ASSERT_TRUE((*s_val)->Read(v.data(), n * 3).ok());
    got_ids.insert(got_ids.end(), i.begin(), i.end());
    got_vals.insert(got_vals.end(), v.begin(), v.end());
  }
  EXPECT_EQ(got_ids, x.ids);
  EXPECT_EQ(got_vals, x.values);
  EXPECT_FALSE((*s_val)->Read(got_vals.data(), 1).ok());  // nothing left
  EXPECT_FALSE((*r)->OpenStream("t", Dtype::kI64).ok());  // wrong dtype
}

TEST(SafetensorsStreamTest, ChecksumEqualsTheOneOverNamesAndBytesInNameOrder) {
  const std::string path = TempDir("st_crc") + "/a.safetensors";
  SafetensorsWriter w(path);
  Written x = WriteTable(w, 3, 5);
  const uint32_t written = w.Crc32();
  ASSERT_TRUE(w.Finish({}).ok());
  // Independent: zlib over name then bytes, names sorted: "dense" < "t" < "t/ids".
  uLong crc = crc32(0L, Z_NULL, 0);
  auto add = [&](const std::string& name, const void* p, size_t n) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(name.data()), name.size());
    crc = crc32(crc, static_cast<const Bytef*>(p), n);
  };
  add("dense", x.dense.data(), x.dense.bytes());
  add("t", x.values.data(), x.values.size() * 4);
  add("t/ids", x.ids.data(), x.ids.size() * 8);
  EXPECT_EQ(written, static_cast<uint32_t>(crc));
  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok());
  auto read = (*r)->Crc32();
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, written);
}

TEST(SafetensorsStreamTest, PythonReadsTheInt64AndFloatTensors) {
  if (std::system("python3 -c 'import json, struct' 2>/dev/null") != 0) GTEST_SKIP() << "no python3";
  const std::string dir = TempDir("st_py");
  const std::string path = dir + "/a.safetensors";
  SafetensorsWriter w(path);
  Written x = WriteTable(w, 2, 3);
  ASSERT_TRUE(w.Finish({{"global_step", "9"}}).ok());
  // A reader from the format's description: 8-byte little-endian length, JSON, raw little-endian data.
  const std::string script = dir + "/read.py";
  std::ofstream(script) << R"(import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n]); d = b[8 + n:]
for name in ('t/ids', 't', 'dense'):
    e = h[name]; lo, hi = e['data_offsets']
    fmt = {'I64': 'q', 'F32': 'f'}[e['dtype']]
    vals = struct.unpack('<%d%s' % ((hi - lo) // struct.calcsize(fmt), fmt), d[lo:hi])
    print(name, e['dtype'], 'x'.join(map(str, e['shape'])), ' '.join(repr(v) for v in vals))
print('step', h['__metadata__']['global_step'])
)";
  FILE* pipe = popen(("python3 " + script + " " + path).c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  std::ostringstream want_ids;
  want_ids << "t/ids I64 6";
  for (int64_t id : x.ids) want_ids << ' ' << id;
  want_ids << "\nt F32 6x3";
  const std::string want = want_ids.str();
  EXPECT_EQ(out.substr(0, want.size()), want) << out;
  // Floats: python's repr of each float32 widened to double, parsed back and compared exactly.
  const size_t at = out.find("\nt F32 6x3 ") + 11;
  std::istringstream values(out.substr(at, out.find('\n', at) - at));
  for (float v : x.values) {
    double d;
    values >> d;
    EXPECT_EQ(static_cast<float>(d), v);
  }
  EXPECT_NE(out.find("dense F32 2x2 1.5 -2.0 3.0 "), std::string::npos) << out;
  EXPECT_NE(out.find("step 9"), std::string::npos);
}

TEST(SafetensorsStreamTest, AWriterNotFinishedLeavesNoFile) {
  const std::string dir = TempDir("st_abandon");
  {
    SafetensorsWriter w(dir + "/a.safetensors");
    WriteTable(w, 2, 2);
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 0);
}

TEST(SafetensorsStreamTest, BadInputIsOneLineNamingTheProblem) {
  const std::string dir = TempDir("st_bad");
  SafetensorsWriter w(dir + "/a.safetensors");
  Tensor t({2});
  ASSERT_TRUE(w.AddF32("x", &t).ok());
  EXPECT_NE(w.AddF32("x", &t).message().find("'x' is added twice"), std::string::npos);
  auto rows = w.BeginStreamed("r", Dtype::kF32, {4});
  ASSERT_TRUE(rows.ok());
  float v[6] = {};
  EXPECT_NE(w.Append(*rows, v, 6).message().find("not a whole number of rows of 4"), std::string::npos);
  EXPECT_FALSE(w.Append(0, v, 2).ok());  // a whole tensor is not streamed
  // A file cut short: the header reads, the data does not.
  ASSERT_TRUE(w.Append(*rows, v, 4).ok());
  ASSERT_TRUE(w.Finish({}).ok());
  const std::string path = dir + "/a.safetensors";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok());
  auto crc = (*r)->Crc32();
  ASSERT_FALSE(crc.ok());
  EXPECT_NE(crc.status().message().find("lies outside"), std::string::npos) << crc.status();
  EXPECT_FALSE((*r)->ReadF32("r").ok());
  // An unknown dtype.
  const std::string header = R"({"x":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})";
  std::string len(8, '\0');
  len[0] = static_cast<char>(header.size());
  std::ofstream(dir + "/b.safetensors", std::ios::binary) << len << header << "  ";
  auto b = SafetensorsReader::Open(dir + "/b.safetensors");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("psflow reads F32 and I64"), std::string::npos) << b.status();
}

TEST(SafetensorsStreamTest, CheckpointWithStreamedTablesPassesItsChecksumAndReadsBack) {
  const std::string dir = TempDir("st_ckpt");
  Written x;
  auto path = SaveCheckpointStreamed(dir, 12,
                                     [&](SafetensorsWriter& w) {
                                       x = WriteTable(w, 4, 3);
                                       return absl::OkStatus();
                                     },
                                     {{"model", "m"}});
  ASSERT_TRUE(path.ok()) << path.status();
  auto ck = ReadCheckpoint(*path);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->global_step, 12);
  EXPECT_EQ(ck->contents.int64s.at("t/ids"), x.ids);
  EXPECT_EQ(ck->contents.tensors.at("t").shape(), (Shape{12, 3}));
  // One flipped byte of the int64 data: refused.
  {
    std::fstream f(*path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x5a');
  }
  auto opened = OpenLatestCheckpoint(dir);
  ASSERT_TRUE(opened.ok());
  EXPECT_FALSE(opened->has_value());
}

// A full disk at any write of a streamed save (a table's column file or the assembled file) fails
// the save in one line naming the file, keeps the previous checkpoint readable, and leaves no
// temporary file; a crash before the rename leaves temporaries that the next successful save removes.
TEST(SafetensorsStreamTest, AFailedStreamedSaveKeepsThePreviousOneAndLeavesNoTemporaries) {
  const std::string dir = TempDir("st_faults");
  io::FaultInjectionEnv env;
  const Tensor dense({2, 2}, {1, 2, 3, 4});
  auto fill = [&](SafetensorsWriter& w) -> absl::Status {
    if (auto s = w.AddF32("dense", &dense); !s.ok()) return s;
    auto ids = w.BeginStreamed("t/ids", Dtype::kI64, {});
    if (!ids.ok()) return ids.status();
    auto vals = w.BeginStreamed("t", Dtype::kF32, {3});
    if (!vals.ok()) return vals.status();
    for (int64_t p = 0; p < 4; ++p) {
      const int64_t id[2] = {2 * p, 2 * p + 1};
      const float v[6] = {1, 2, 3, 4, 5, float(p)};
      if (auto s = w.Append(*ids, id, 2); !s.ok()) return s;
      if (auto s = w.Append(*vals, v, 6); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  ASSERT_TRUE(SaveCheckpointStreamed(dir, 10, fill, {}, 5, &env).ok());
  const int64_t appends = env.Count(io::FileOp::kAppend);
  ASSERT_GT(appends, 8);
  for (int64_t nth = 1; nth <= appends; ++nth) {
    env.Reset();
    env.Inject({io::FileOp::kAppend, nth});
    auto saved = SaveCheckpointStreamed(dir, 20, fill, {}, 5, &env);
    ASSERT_FALSE(saved.ok()) << "write " << nth;
    EXPECT_NE(saved.status().message().find("No space left on device"), std::string::npos) << saved.status();
    EXPECT_NE(saved.status().message().find("the previous checkpoints are kept"), std::string::npos);
    env.Reset();
    auto latest = OpenLatestCheckpoint(dir, nullptr, &env);
    ASSERT_TRUE(latest.ok() && latest->has_value());
    EXPECT_EQ((*latest)->global_step, 10);
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1) << "write " << nth;
  }
  env.Reset();
  env.Inject({io::FileOp::kRename, 1, 0, /*crash=*/true});
  EXPECT_FALSE(SaveCheckpointStreamed(dir, 30, fill, {}, 5, &env).ok());
  env.Reset();
  ASSERT_TRUE(SaveCheckpointStreamed(dir, 40, fill, {}, 5, &env).ok());
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"model.ckpt-10.safetensors", "model.ckpt-40.safetensors"}));
}

}  // namespace
}  // namespace psflow::ckpt
