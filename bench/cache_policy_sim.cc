// cache_policy_sim — the disk tier's hot-row cache policy (src/ps/server/table/disk_store.h) beside
// a frequency-aware one, simulated on Zipf(s) ids (docs/table-storage-figures.md#the-caches-policy-and-zipf-ids). No
// psflow code: ids only, so a policy can be judged at sizes a run cannot reach.
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
//   policy 2  the tier as disk_store.cc runs it: a record read from disk (or created) enters a FIFO
//             window of W % of K; one leaving it goes to the CLOCK part's front if the sketch (of rows
//             read from disk, not of rows created) has seen it more often than the first unmarked of
//             CLOCK's last 5 records, else to its back; then CLOCK evicts from the back, second chances
//             given, then the window's oldest.
//   policy 3  policy 2, and a record's second chance (a marked record met by the eviction walk) also
//             counts once in the sketch: rows that always hit keep their weight.
// HOT_PERCENT (optional, 0..100, policies 2-4; -1 or none: Zipf): instead of Zipf, the ids of
// bench/disk_tier_ps_worker.cc: D unique ids a step, each from the hot set (every 16th row) with probability
// HOT_PERCENT %, else uniform over the N rows; the steps begin with its fill (every row created, D a step, looked up
// first as absent) and 16 warm steps of the hot set, as the bench's ps sees them. Prints the hit rate over the second
// half of the steps, per lookup (pull and push counted, as the ps tasks' counters do) and per pull.
//   build/bench/psflow_cache_policy_sim N K D STEPS POLICY [W] [HOT_PERCENT]
//   e.g. 7820000 700000 8192 6000 0     (the 40 GB run's table and cache, 1/10 scale)
//        262144 32768 4096 400 3 5 82    (bench/disk_tier_ps.py's table, cache and ids at p = 82 %)
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

// Policies 2-4: the tier's window, admission and CLOCK walk (disk_store.cc's AdmitFromWindow and
// EvictToBudget, without pins: the sim evicts after a pass, when the tier's batch is released).
struct TierSim {
  TierSim(int64_t n, int64_t k, int64_t window_rows, int count_mode)
      : prev(n),
        next(n),
        marked(n, 0),
        where(n, 0),
        stored(n, 0),
        k(k),
        window_rows(window_rows),
        count_mode(count_mode),
        sketch(k) {}
  std::vector<int64_t> prev, next;
  std::vector<char> marked, where, stored;  // where: 0 out, 1 window, 2 CLOCK part
  List window{prev, next}, clock{prev, next};
  const int64_t k, window_rows;
  const int count_mode;  // 2: rows read from disk; 3: and second chances; 4: every lookup that missed
  Sketch sketch;

  // One lookup of `id` by a pull (create = false) or a push (create = true: an absent id is created).
  // Returns true on a hit.
  bool Lookup(int64_t id, bool create) {
    if (where[id] != 0) {
      marked[id] = 1;
      return true;
    }
    if (stored[id] || count_mode == 4) sketch.Add(id);
    if (!stored[id] && !create) return false;
    stored[id] = 1;
    marked[id] = 0;
    where[id] = 1;
    window.PushFront(id);
    return false;
  }
  void Move(int64_t e, char to, bool front) {
    (where[e] == 1 ? window : clock).Unlink(e);
    where[e] = to;
    if (to == 0) return;
    List& l = to == 1 ? window : clock;
    if (front) {
      l.PushFront(e);
    } else {  // back
      prev[e] = l.tail;
      next[e] = -1;
      if (l.tail >= 0) next[l.tail] = e;
      l.tail = e;
      if (l.head < 0) l.head = e;
      ++l.size;
    }
  }
  void Evict() {
    if (window.size > window_rows) {
      int64_t v = clock.tail;
      for (int j = 0; v >= 0 && marked[v]; ++j) v = j < 4 ? prev[v] : -1;
      const int vc = v >= 0 ? sketch.Estimate(v) : 0;
      for (int64_t c = window.tail; c >= 0 && window.size > window_rows;) {
        const int64_t p = prev[c];
        const bool fits = window.size + clock.size <= k;
        marked[c] = 0;
        Move(c, 2, fits || v < 0 || sketch.Estimate(c) > vc);
        c = p;
      }
    }
    int64_t after = window.size + clock.size;
    std::vector<int64_t> leaving;
    for (int64_t e = clock.tail; e >= 0 && after > k;) {
      const int64_t p = prev[e];
      if (marked[e]) {
        marked[e] = 0;
        if (count_mode == 3) sketch.Add(e);
        if (e != clock.head) Move(e, 2, true);
      } else {
        leaving.push_back(e);
        --after;
      }
      e = p;
    }
    for (int64_t e = window.tail; e >= 0 && after > k; e = prev[e]) {
      leaving.push_back(e);
      --after;
    }
    for (int64_t e : leaving) Move(e, 0, true);
  }
};

// The ids of bench/disk_tier_ps_worker.cc (hot_percent >= 0) or Zipf(1.1) draws as policies 0-1
// (hot_percent < 0, every row stored) through TierSim (policies 2-4).
int RunTier(int64_t n, int64_t k, int64_t d, int64_t steps, int policy, double window_percent, int hot_percent) {
  const int64_t hot = 16384 <= n / 2 ? 16384 : n / 16, stride = n / hot;
  const int64_t window_rows = std::max<int64_t>(1, static_cast<int64_t>(k * window_percent / 100));
  TierSim t(n, k, window_rows, policy);
  std::mt19937_64 rng(1);
  std::vector<int64_t> taken(n, -1), ids;
  const bool zipf = hot_percent < 0;  // Zipf(1.1) draws as policies 0-1, every row stored, no fill
  const int64_t fill = zipf ? 0 : (n + d - 1) / d, warm = zipf ? 0 : 16;
  std::vector<double> cdf;
  if (zipf) {
    double z = 0;
    for (int64_t r = 0; r < n; ++r) cdf.push_back(z += std::pow(r + 1.0, -1.1));
    for (double& c : cdf) c /= z;
    std::fill(t.stored.begin(), t.stored.end(), 1);
  }
  std::uniform_real_distribution<double> uniform(0, 1);
  int64_t pulled = 0, pull_misses = 0, lookups = 0, hits = 0;
  for (int64_t step = 0; step < fill + warm + steps; ++step) {
    ids.clear();
    if (step < fill) {
      for (int64_t r = step * d; r < std::min(n, (step + 1) * d); ++r) ids.push_back(r);
    } else if (step < fill + warm) {
      for (int64_t j = 0; j < std::min(d, hot); ++j) ids.push_back((((step - fill) * d + j) % hot) * stride);
    } else if (zipf) {
      for (int64_t j = 0; j < d; ++j) {
        const int64_t r =
            std::min<int64_t>(std::lower_bound(cdf.begin(), cdf.end(), uniform(rng)) - cdf.begin(), n - 1);
        if (taken[r] == step) continue;
        taken[r] = step;
        ids.push_back(r);
      }
    } else {
      while (static_cast<int64_t>(ids.size()) < d) {
        const bool h = static_cast<int64_t>(rng() % 100) < hot_percent;
        const int64_t r = h ? static_cast<int64_t>(rng() % hot) * stride : static_cast<int64_t>(rng() % n);
        if (taken[r] == step) continue;
        taken[r] = step;
        ids.push_back(r);
      }
    }
    const bool counted = step >= fill + warm + steps / 2;
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t id : ids) {
        const bool hit = t.Lookup(id, pass == 1);
        if (counted) {
          ++lookups;
          hits += hit;
          if (pass == 0) {
            ++pulled;
            pull_misses += !hit;
          }
        }
      }
      t.Evict();
    }
  }
  static const char* const kNames[] = {"", "", "tier: reads counted", "tier: reads and second chances counted",
                                       "tier: every missed lookup counted"};
  std::printf(
      "N=%lld K=%lld D=%lld steps=%lld hot=%d%% (-1: Zipf) policy=%s: second half: hit rate per lookup %.4f, per pull "
      "%.4f\n",
      static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(d), static_cast<long long>(steps),
      hot_percent, kNames[policy], static_cast<double>(hits) / lookups, 1 - static_cast<double>(pull_misses) / pulled);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr,
                 "usage: %s N K D STEPS POLICY(0 clock, 1 window+TinyLFU, 2-4 the tier: see the file's head) "
                 "[WINDOW_PERCENT=5] [HOT_PERCENT]\n",
                 argv[0]);
    return 2;
  }
  const int64_t n = std::atoll(argv[1]), k = std::atoll(argv[2]), d = std::atoll(argv[3]), steps = std::atoll(argv[4]);
  const int policy = std::atoi(argv[5]);
  const double window_percent = argc > 6 ? std::atof(argv[6]) : 5.0;
  const int hot_percent = argc > 7 ? std::atoi(argv[7]) : -1;
  if (n < 2 || k < 1 || k >= n || d < 1 || d > n || steps < 2 || policy < 0 || policy > 4 || !(window_percent > 0) ||
      hot_percent > 100 || (hot_percent >= 0 && policy < 2)) {
    std::fprintf(stderr,
                 "need N > K >= 1, N >= D >= 1, STEPS >= 2, WINDOW_PERCENT > 0, and POLICY 0 or 1 without "
                 "HOT_PERCENT, 2-4 with or without it (0..100; -1: Zipf)\n");
    return 2;
  }
  if (policy >= 2) return RunTier(n, k, d, steps, policy, window_percent, hot_percent);
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
