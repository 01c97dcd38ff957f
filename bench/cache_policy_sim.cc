// cache_policy_sim — the disk tier's hot-row cache policy (src/ps/server/table/disk_store.h) beside
// a frequency-aware one, simulated on Zipf(s) ids (docs/tables.md, "The cache's policy"). No psflow
// code: ids only, so a policy can be judged at sizes a run cannot reach.
//
// A step draws D ids from Zipf(s) over N rows, de-duplicates them, and looks them up twice (the
// pull, then the push, as a ps task sees one worker's step); records are pinned during a lookup,
// and the cache is brought back within K rows after it (as DiskRowStore::Release does).
//   policy 0  CLOCK, as disk_store.cc: a record read goes to the front unmarked, a hit marks it,
//             eviction walks from the back: a marked record goes to the front unmarked, an
//             unmarked one leaves.
//   policy 1  a window and TinyLFU admission (Einziger, Friedman, Manes 2017) counting misses only
//             (no work on a hit): a record read enters a FIFO window of W % of K; one leaving the
//             window enters the CLOCK part only if a count-min sketch (4 x uint8 per id, halved
//             every 10·K counts) has seen it missed more often than the CLOCK part's next victim,
//             else it leaves.
// Prints the hit rate over the second half of the steps, per lookup (pull and push counted, as the
// ps tasks' counters do) and per pull.
//   build/bench/psflow_cache_policy_sim N K D STEPS POLICY [W]
//   e.g. 7820000 700000 8192 6000 0     (the 40 GB run's table and cache, 1/10 scale)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

class Sketch {
 public:
  explicit Sketch(int64_t k) : halve_every_(10 * k) {
    uint64_t n = 1;
    while (n < 4 * static_cast<uint64_t>(k)) n <<= 1;
    counts_.assign(n, 0);
    mask_ = n - 1;
  }
  int Estimate(uint64_t id) const {
    int m = 255;
    for (int i = 0; i < 4; ++i) m = std::min<int>(m, counts_[Hash(id, i) & mask_]);
    return m;
  }
  void Add(uint64_t id) {  // conservative update
    const int m = Estimate(id);
    for (int i = 0; i < 4; ++i) {
      uint8_t& c = counts_[Hash(id, i) & mask_];
      if (c == m && c < 255) ++c;
    }
    if (++adds_ >= halve_every_) {
      for (uint8_t& c : counts_) c >>= 1;
      adds_ = 0;
    }
  }

 private:
  static uint64_t Hash(uint64_t x, int i) {
    x += 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 29);
  }
  std::vector<uint8_t> counts_;
  uint64_t mask_ = 0;
  int64_t adds_ = 0;
  const int64_t halve_every_;
};

// Doubly linked lists over row numbers (the rows' links shared: a row is in one list at most).
struct List {
  std::vector<int64_t>& prev;
  std::vector<int64_t>& next;
  int64_t head = -1, tail = -1, size = 0;
  void Unlink(int64_t e) {
    (prev[e] >= 0 ? next[prev[e]] : head) = next[e];
    (next[e] >= 0 ? prev[next[e]] : tail) = prev[e];
    --size;
  }
  void PushFront(int64_t e) {
    prev[e] = -1;
    next[e] = head;
    if (head >= 0) prev[head] = e;
    head = e;
    if (tail < 0) tail = e;
    ++size;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s N K D STEPS POLICY(0 clock, 1 window+TinyLFU) [WINDOW_PERCENT=5]\n", argv[0]);
    return 2;
  }
  const int64_t n = std::atoll(argv[1]), k = std::atoll(argv[2]), d = std::atoll(argv[3]), steps = std::atoll(argv[4]);
  const int policy = std::atoi(argv[5]);
  const double window_percent = argc > 6 ? std::atof(argv[6]) : 5.0;
  if (n < 2 || k < 1 || k >= n || d < 1 || steps < 2 || (policy != 0 && policy != 1) || !(window_percent > 0)) {
    std::fprintf(stderr, "need N > K >= 1, D >= 1, STEPS >= 2, POLICY 0 or 1, WINDOW_PERCENT > 0\n");
    return 2;
  }
  const double s = 1.1;
  std::vector<double> cdf(static_cast<size_t>(n));
  double z = 0;
  for (int64_t r = 0; r < n; ++r) cdf[r] = (z += std::pow(r + 1.0, -s));
  for (double& c : cdf) c /= z;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> uniform(0, 1);
  std::vector<int64_t> prev(n), next(n), stamp(n, -1);
  std::vector<char> marked(n, 0), where(n, 0);  // where: 0 out, 1 window, 2 CLOCK part
  List window{prev, next}, clock{prev, next};
  Sketch sketch(k);
  const int64_t window_rows = policy == 1 ? std::max<int64_t>(1, static_cast<int64_t>(k * window_percent / 100)) : 0;
  auto victim = [&]() -> int64_t {  // the CLOCK part's next victim, second chances given
    for (;;) {
      const int64_t e = clock.tail;
      if (e < 0 || !marked[e]) return e;
      marked[e] = 0;
      clock.Unlink(e);
      clock.PushFront(e);
    }
  };
  int64_t hits = 0, misses = 0;
  std::vector<int64_t> ids;
  for (int64_t step = 0; step < steps; ++step) {
    ids.clear();
    for (int64_t i = 0; i < d; ++i) {
      int64_t r = std::lower_bound(cdf.begin(), cdf.end(), uniform(rng)) - cdf.begin();
      r = std::min(r, n - 1);
      if (stamp[r] != step) {
        stamp[r] = step;
        ids.push_back(r);
      }
    }
    const bool counted = step >= steps / 2;
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t id : ids) {
        if (where[id] != 0) {
          marked[id] = 1;
          hits += counted;
          continue;
        }
        misses += counted;
        marked[id] = 0;
        if (policy == 0) {
          where[id] = 2;
          clock.PushFront(id);
        } else {
          sketch.Add(id);
          where[id] = 1;
          window.PushFront(id);
        }
      }
      while (window.size > window_rows) {  // policy 1: the window's oldest are admitted or leave
        const int64_t c = window.tail;
        window.Unlink(c);
        const int64_t v = clock.size + window.size < k ? -1 : victim();
        if (v >= 0 && sketch.Estimate(c) <= sketch.Estimate(v)) {
          where[c] = 0;
          continue;
        }
        if (v >= 0) {
          clock.Unlink(v);
          where[v] = 0;
        }
        where[c] = 2;
        marked[c] = 0;
        clock.PushFront(c);
      }
      while (clock.size + window.size > k) {
        const int64_t v = victim();
        clock.Unlink(v);
        where[v] = 0;
      }
    }
  }
  const double lookups = static_cast<double>(hits + misses);
  std::printf(
      "N=%lld K=%lld D=%lld steps=%lld policy=%s: second half: hit rate per lookup (pull+push) %.4f, "
      "per pull %.4f\n",
      static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(d), static_cast<long long>(steps),
      policy == 0 ? "clock" : "window+tinylfu(misses)", static_cast<double>(hits) / lookups,
      1 - 2.0 * static_cast<double>(misses) / lookups);
  return 0;
}
