// The synthetic CTR generator (include/psflow/data/ctr.h): Zipf samplers, hashed ids, the
// factorization-machine teacher, the streams of workers and of the test set.
//
// Randomness: every example owns a splitmix64 stream whose start is a hash of (stream key, index),
// and the stream key a hash of (seed, worker, step) or (seed, "test"); so examples can be made in
// any order, by any thread, and a batch's bits depend on nothing else.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "psflow/data/criteo.h"
#include "psflow/data/ctr.h"
#include "psflow/data/ctr_metrics.h"

namespace psflow::data {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kMask63 = (uint64_t{1} << 63) - 1;
constexpr int64_t kMaxVocab = int64_t{1} << 40;
constexpr int kMaxTeacherDim = 256;
constexpr int kMaxFields = 4096;  // FillExample keeps one rank per field on the stack
constexpr int64_t kCalibrationExamples = 1 << 16;
constexpr double kTwoPow32 = 4294967296.0;

// splitmix64's finalizer: a bijection of 64 bits with full avalanche.
inline uint64_t Fmix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// A key for `b` under `a`: distinct b give unrelated keys.
inline uint64_t Combine(uint64_t a, uint64_t b) { return Fmix(a ^ Fmix(b + kGolden)); }
// The splitmix64 generator: the next 64 random bits of the stream whose state is `state`.
inline uint64_t Next(uint64_t& state) {
  state += kGolden;
  return Fmix(state);
}
// A bijection of [0, 2^63) (xorshifts and odd multiplications modulo 2^63).
inline uint64_t Bijection63(uint64_t x) {
  x &= kMask63;
  x ^= x >> 31;
  x = (x * 0x7fb5d329728ea185ULL) & kMask63;
  x ^= x >> 27;
  x = (x * 0x81dadef4bc2dd44dULL) & kMask63;
  return x ^ (x >> 33);
}

// Φ^-1(p): Acklam's rational approximation refined by one Halley step on erfc (|error| < 1e-15).
double InverseNormalCdf(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01, -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  auto tail = [&](double q) {
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  };
  double x;
  if (p < kLow) {
    x = tail(std::sqrt(-2 * std::log(p)));
  } else if (p <= 1 - kLow) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    x = -tail(std::sqrt(-2 * std::log1p(-p)));
  }
  const double e = 0.5 * std::erfc(-x / std::numbers::sqrt2) - p;
  const double u = e * std::sqrt(2 * std::numbers::pi) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

// N(0, 1) at 16-bit resolution: entry i is the midpoint quantile Φ^-1((i + 0.5) / 65536).
const std::array<float, 65536>& NormalTable() {
  static const std::array<float, 65536>* table = [] {
    auto* t = new std::array<float, 65536>;
    for (int i = 0; i < 65536; ++i) (*t)[i] = static_cast<float>(InverseNormalCdf((i + 0.5) / 65536.0));
    return t;
  }();
  return *table;
}

// The dense counts: c = floor(exp(μ + σ·z)) at z = entry i of NormalTable(), i.e. the midpoint
// quantiles of a log-normal, floored (Criteo's integer features are heavy-tailed counts, many 0).
constexpr double kDenseLogMean = 1.0, kDenseLogStd = 1.5;

// Entry i: the dense value log(1 + c) of the count at quantile i (CriteoDenseValue, which the reader
// applies to the integers of a file, so the same float).
const std::array<float, 65536>& DenseValueTable() {
  static const std::array<float, 65536>* table = [] {
    auto* t = new std::array<float, 65536>;
    const auto& normal = NormalTable();
    for (int i = 0; i < 65536; ++i) {
      const auto count = static_cast<int64_t>(std::floor(std::exp(kDenseLogMean + kDenseLogStd * normal[i])));
      (*t)[i] = CriteoDenseValue(count);
    }
    return t;
  }();
  return *table;
}

// Σ_{r=first}^{last} r^-α: summed for narrow cells, by Euler-Maclaurin for wide ones (which start
// at rank >= 4160, where the next term is below 1e-14 of the sum).
double CellMass(int64_t first, int64_t last, double alpha) {
  if (last - first < 64) {
    double sum = 0;
    for (int64_t r = last; r >= first; --r) sum += std::pow(static_cast<double>(r), -alpha);
    return sum;
  }
  const double a = static_cast<double>(first), b = static_cast<double>(last);
  const double log_ratio = std::log1p((b - a) / a);
  const double integral =
      alpha == 1.0 ? log_ratio : std::pow(a, 1 - alpha) * std::expm1((1 - alpha) * log_ratio) / (1 - alpha);
  const double ends = 0.5 * (std::pow(a, -alpha) + std::pow(b, -alpha));
  const double derivative = alpha * (std::pow(a, -alpha - 1) - std::pow(b, -alpha - 1)) / 12;
  return integral + ends + derivative;
}

}  // namespace

std::vector<int64_t> DefaultCtrVocabSizes(int num_fields) {
  // Criteo Kaggle (Display Advertising Challenge) C1..C26 cardinalities, capped at 10^6.
  static constexpr int64_t kCriteo[26] = {1460,  583,  1000000, 1000000, 305, 24,     12517,   633,   3,
                                          93145, 5683, 1000000, 3194,    27,  14992,  1000000, 10,    5652,
                                          2173,  4,    1000000, 18,      15,  286181, 105,     142572};
  std::vector<int64_t> sizes(std::max(num_fields, 0));
  for (size_t f = 0; f < sizes.size(); ++f) sizes[f] = kCriteo[f % 26];
  return sizes;
}

absl::Status ApplyCtrPreset(std::string_view preset, CtrConfig* config) {
  const CtrConfig defaults;
  if (preset == "criteo") {
    config->vocab_sizes = DefaultCtrVocabSizes(config->num_fields);
    config->interaction_std = defaults.interaction_std;
    return absl::OkStatus();
  }
  if (preset == "learnable") {
    config->vocab_sizes = DefaultCtrVocabSizes(config->num_fields);
    for (int64_t& v : config->vocab_sizes) v = std::min(v, kLearnableVocabCap);
    config->interaction_std = kLearnableInteractionStd;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("--ctr_preset=", std::string(preset),
                                                 " is not a preset of the CTR generator; use criteo or learnable"));
}

absl::StatusOr<CtrGenerator> CtrGenerator::Create(CtrConfig config) {
  if (config.num_fields < 1 || config.num_fields > kMaxFields) {
    return absl::InvalidArgumentError(
        absl::StrCat("CTR data: num_fields is ", config.num_fields, "; it must be in [1, ", kMaxFields, "]"));
  }
  if (config.num_dense < 0 || config.num_dense > kMaxFields) {
    return absl::InvalidArgumentError(
        absl::StrCat("CTR data: num_dense is ", config.num_dense, "; it must be in [0, ", kMaxFields, "]"));
  }
  if (config.vocab_sizes.empty()) config.vocab_sizes = DefaultCtrVocabSizes(config.num_fields);
  if (config.vocab_sizes.size() != static_cast<size_t>(config.num_fields)) {
    return absl::InvalidArgumentError(absl::StrCat("CTR data: ", config.vocab_sizes.size(), " vocabulary sizes for ",
                                                   config.num_fields,
                                                   " fields; give one per field, or none for the defaults"));
  }
  for (size_t f = 0; f < config.vocab_sizes.size(); ++f) {
    if (config.vocab_sizes[f] < 1 || config.vocab_sizes[f] > kMaxVocab) {
      return absl::InvalidArgumentError(absl::StrCat("CTR data: field ", f, "'s vocabulary size is ",
                                                     config.vocab_sizes[f], "; it must be in [1, 2^40]"));
    }
  }
  if (!(config.zipf_alpha > 0 && config.zipf_alpha <= 16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CTR data: zipf_alpha is ", config.zipf_alpha, "; it must be in (0, 16]"));
  }
  if (config.teacher_dim < 1 || config.teacher_dim > kMaxTeacherDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("CTR data: teacher_dim is ", config.teacher_dim, "; it must be in [1, ", kMaxTeacherDim, "]"));
  }
  if (!(config.interaction_std >= 0 && config.interaction_std <= 100) ||
      !(config.dense_std >= 0 && config.dense_std <= 100)) {
    return absl::InvalidArgumentError(absl::StrCat("CTR data: interaction_std is ", config.interaction_std,
                                                   " and dense_std ", config.dense_std, "; each must be in [0, 100]"));
  }
  if (!(config.base_ctr > 0 && config.base_ctr < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CTR data: base_ctr is ", config.base_ctr, "; it must be in (0, 1)"));
  }
  return CtrGenerator(std::move(config));
}

CtrGenerator::CtrGenerator(CtrConfig config) : config_(std::move(config)) {
  const uint64_t root = Combine(config_.seed, 0x63747264617461ULL);  // "ctrdata"
  keys_ = {Combine(root, 1), Combine(root, 2), Combine(root, 3), Combine(root, 4), Combine(root, 5)};
  const int num_fields = config_.num_fields;
  for (int f = 0; f < num_fields; ++f) {
    field_id_keys_.push_back(Combine(keys_.ids, f));
    field_teacher_keys_.push_back(Combine(keys_.teacher, f));
  }

  // Zipf samplers: cells, their masses, Vose's alias table over them.
  const double alpha = config_.zipf_alpha;
  samplers_.resize(num_fields);
  for (int f = 0; f < num_fields; ++f) {
    std::vector<ZipfCell>& cells = samplers_[f];
    const int64_t vocab = config_.vocab_sizes[f];
    std::vector<double> mass;
    for (int64_t first = 1; first <= vocab;) {
      int64_t width = first < 128 ? 1 : first / 64;
      width = std::min({width, vocab - first + 1, int64_t{1} << 31});
      const int64_t last = first + width - 1;
      const double min_ratio = std::pow(static_cast<double>(last) / static_cast<double>(first), -alpha);
      const auto squeeze = static_cast<uint32_t>(std::min(std::floor(min_ratio * kTwoPow32), kTwoPow32 - 1));
      cells.push_back({first, static_cast<uint32_t>(width), squeeze, uint64_t{1} << 32, cells.size()});
      mass.push_back(CellMass(first, last, alpha));
      first = last + 1;
    }
    const size_t n = mass.size();
    double total = 0;
    for (double m : mass) total += m;
    std::vector<double> scaled(n);
    std::vector<uint32_t> small, large;
    for (size_t i = 0; i < n; ++i) {
      scaled[i] = mass[i] / total * static_cast<double>(n);
      (scaled[i] < 1 ? small : large).push_back(static_cast<uint32_t>(i));
    }
    while (!small.empty() && !large.empty()) {
      const uint32_t s = small.back(), l = large.back();
      small.pop_back();
      large.pop_back();
      cells[s].keep = static_cast<uint64_t>(std::llround(scaled[s] * kTwoPow32));
      cells[s].alias = l;
      scaled[l] = (scaled[l] + scaled[s]) - 1;
      (scaled[l] < 1 ? small : large).push_back(l);
    }
    // What remains has probability 1 up to rounding: kept always (keep = 2^32).
  }

  // Scales: Var(Σ_{f<g} ⟨e_f, e_g⟩) = pairs · k · σ_e^4 for independent N(0, σ_e^2) entries;
  // w* a random direction of length dense_std / sd(x_d), so Var(w*·x) = dense_std^2 for the
  // independent dense features (sd over their 65536 equiprobable values).
  const double pairs = 0.5 * num_fields * (num_fields - 1);
  embedding_scale_ =
      pairs > 0 ? static_cast<float>(std::sqrt(config_.interaction_std / std::sqrt(pairs * config_.teacher_dim)))
                : 0.0f;
  const auto& normal = NormalTable();
  dense_weights_.resize(config_.num_dense);
  double norm2 = 0;
  for (int d = 0; d < config_.num_dense; ++d) {
    dense_weights_[d] = normal[Combine(root, 100 + d) & 0xffff];
    norm2 += static_cast<double>(dense_weights_[d]) * dense_weights_[d];
  }
  double mean = 0, mean2 = 0;
  for (float x : DenseValueTable()) {
    mean += x;
    mean2 += static_cast<double>(x) * x;
  }
  mean /= 65536;
  const double dense_sd = std::sqrt(mean2 / 65536 - mean * mean);
  for (float& w : dense_weights_) {
    w = norm2 > 0 ? static_cast<float>(w * config_.dense_std / (dense_sd * std::sqrt(norm2))) : 0.0f;
  }

  // The head ranks' embeddings, the same values TeacherEmbedding computes.
  const int k = config_.teacher_dim;
  head_embeddings_.assign(static_cast<size_t>(num_fields) * kHeadRanks * k, 0.0f);
  for (int f = 0; f < num_fields; ++f) {
    for (int64_t r = 1; r <= std::min(kHeadRanks, config_.vocab_sizes[f]); ++r) {
      TeacherEmbedding(f, IdOfRank(f, r), &head_embeddings_[(f * kHeadRanks + r - 1) * k]);
    }
  }

  // The bias: mean σ(b + z) = base_ctr over a calibration stream's logits z (bisection).
  bias_ = 0;
  std::vector<double> logits(kCalibrationExamples);
  std::vector<int64_t> ids(num_fields);
  std::vector<float> dense(config_.num_dense);
  for (int64_t i = 0; i < kCalibrationExamples; ++i) {
    float label;
    FillExample(keys_.calibration, i, ids.data(), dense.data(), &label, &logits[i]);
  }
  double lo = -60, hi = 60;
  for (int iteration = 0; iteration < 64; ++iteration) {
    const double mid = 0.5 * (lo + hi);
    double mean = 0;
    for (double z : logits) mean += 1 / (1 + std::exp(-(mid + z)));
    (mean / kCalibrationExamples < config_.base_ctr ? lo : hi) = mid;
  }
  bias_ = 0.5 * (lo + hi);
}

int64_t CtrGenerator::IdOfRank(int field, int64_t rank) const {
  CHECK(field >= 0 && field < config_.num_fields && rank >= 1 && rank <= config_.vocab_sizes[field])
      << "field " << field << " rank " << rank;
  return static_cast<int64_t>(Bijection63(field_id_keys_[field] + static_cast<uint64_t>(rank)));
}

void CtrGenerator::TeacherEmbedding(int field, int64_t id, float* out) const {
  const auto& normal = NormalTable();
  const uint64_t key = Fmix(field_teacher_keys_[field] ^ static_cast<uint64_t>(id));
  const int k = config_.teacher_dim;
  for (int j = 0; j < k; j += 4) {
    const uint64_t bits = Fmix(key + static_cast<uint64_t>(j / 4 + 1) * kGolden);
    for (int m = 0; m < 4 && j + m < k; ++m) out[j + m] = embedding_scale_ * normal[(bits >> (16 * m)) & 0xffff];
  }
}

const float* CtrGenerator::Embedding(int field, int64_t id, int64_t rank, float* scratch) const {
  if (rank >= 1 && rank <= kHeadRanks) return &head_embeddings_[(field * kHeadRanks + rank - 1) * config_.teacher_dim];
  TeacherEmbedding(field, id, scratch);
  return scratch;
}

// b + w*·x + ½(‖Σ_f e_f‖² − Σ_f ‖e_f‖²), in double. `ranks` may be null (ids of unknown rank).
double CtrGenerator::Logit(const int64_t* ids, const int64_t* ranks, const float* dense) const {
  const int k = config_.teacher_dim;
  double sum[kMaxTeacherDim] = {};
  float scratch[kMaxTeacherDim];
  double squares = 0;
  for (int f = 0; f < config_.num_fields; ++f) {
    const float* e = Embedding(f, ids[f], ranks == nullptr ? 0 : ranks[f], scratch);
    for (int j = 0; j < k; ++j) {
      sum[j] += e[j];
      squares += static_cast<double>(e[j]) * e[j];
    }
  }
  double interactions = -squares;
  for (int j = 0; j < k; ++j) interactions += sum[j] * sum[j];
  double linear = 0;
  for (int d = 0; d < config_.num_dense; ++d) linear += static_cast<double>(dense_weights_[d]) * dense[d];
  return bias_ + linear + 0.5 * interactions;
}

double CtrGenerator::TrueLogit(const int64_t* ids, const float* dense) const { return Logit(ids, nullptr, dense); }

int64_t CtrGenerator::SampleRank(const std::vector<ZipfCell>& cells, uint64_t& state) const {
  const uint64_t n = cells.size();
  // A cell: Lemire's unbiased multiply-shift on the high 32 bits, the alias coin on the low 32.
  uint64_t x, m;
  do {
    x = Next(state);
    m = (x >> 32) * n;
  } while (static_cast<uint32_t>(m) < n && static_cast<uint32_t>(m) < (uint32_t{0} - n) % n);
  // Branch-free (the coin is unpredictable): index ^ ((index ^ alias) & (coin >= keep ? ~0 : 0)).
  const uint64_t own = m >> 32;
  const uint64_t take_alias = uint64_t{0} - static_cast<uint64_t>((x & 0xffffffffULL) >= cells[own].keep);
  const ZipfCell* cell = &cells[own ^ ((own ^ cells[own].alias) & take_alias)];
  const uint64_t width = cell->width;
  const int64_t first = cell->first;
  if (width == 1) return first;
  // A rank in the cell: uniform, accepted with probability (r / first)^-α; else another rank of
  // the same cell (not another cell: that would weigh cells by their acceptance rate).
  for (;;) {
    const uint64_t y = Next(state);
    const uint64_t w = (y >> 32) * width;
    if (static_cast<uint32_t>(w) < width && static_cast<uint32_t>(w) < (uint32_t{0} - width) % width) continue;
    const int64_t rank = first + static_cast<int64_t>(w >> 32);
    const uint32_t u = static_cast<uint32_t>(y);
    if (u < cell->squeeze) return rank;
    const double ratio = static_cast<double>(rank) / static_cast<double>(first);
    if ((u + 0.5) / kTwoPow32 < std::pow(ratio, -config_.zipf_alpha)) return rank;
  }
}

double CtrGenerator::FillExample(uint64_t stream_key, int64_t index, int64_t* ids, float* dense, float* label,
                                 double* logit_out) const {
  uint64_t state = Combine(stream_key, static_cast<uint64_t>(index));
  int64_t ranks[kMaxFields];
  for (int f = 0; f < config_.num_fields; ++f) {
    ranks[f] = SampleRank(samplers_[f], state);
    ids[f] = static_cast<int64_t>(Bijection63(field_id_keys_[f] + static_cast<uint64_t>(ranks[f])));
  }
  const auto& values = DenseValueTable();
  for (int d = 0; d < config_.num_dense; d += 4) {
    const uint64_t bits = Next(state);
    for (int m = 0; m < 4 && d + m < config_.num_dense; ++m) dense[d + m] = values[(bits >> (16 * m)) & 0xffff];
  }
  const double logit = Logit(ids, ranks, dense);
  if (logit_out != nullptr) *logit_out = logit;
  const double p = 1 / (1 + std::exp(-logit));
  const double u = static_cast<double>(Next(state) >> 11) * 0x1p-53;
  *label = u < p ? 1.0f : 0.0f;
  return p;
}

void CtrGenerator::FillRange(uint64_t stream_key, int64_t first, int64_t count, int64_t* ids, float* dense,
                             float* labels, double* probabilities) const {
  const int num_fields = config_.num_fields, num_dense = config_.num_dense;
  for (int64_t i = 0; i < count; ++i) {
    const double p = FillExample(stream_key, first + i, ids + i * num_fields, dense + i * num_dense, labels + i);
    if (probabilities != nullptr) probabilities[i] = p;
  }
}

uint64_t CtrGenerator::TrainStream(int64_t worker, int64_t step) const {
  return Combine(Combine(keys_.train, static_cast<uint64_t>(worker)), static_cast<uint64_t>(step));
}

absl::Status CtrGenerator::FillBatch(int64_t worker, int64_t step, int64_t batch_size, int64_t* ids, float* dense,
                                     float* labels, double* probabilities) const {
  if (worker < 0 || step < 0 || batch_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CTR batch: worker ", worker, ", step ", step, ", batch size ",
                                                   batch_size, "; none may be negative"));
  }
  if (batch_size > 0 && (ids == nullptr || labels == nullptr || (dense == nullptr && config_.num_dense > 0))) {
    return absl::InvalidArgumentError("CTR batch: an output array (ids, dense or labels) is null; pass all three");
  }
  FillRange(TrainStream(worker, step), 0, batch_size, ids, dense, labels, probabilities);
  return absl::OkStatus();
}

absl::Status CtrGenerator::FillBatchPart(int64_t worker, int64_t step, int64_t first, int64_t count, int64_t* ids,
                                         float* dense, float* labels, double* probabilities) const {
  if (worker < 0 || step < 0 || first < 0 || count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CTR batch part: worker ", worker, ", step ", step, ", first ",
                                                   first, ", count ", count, "; none may be negative"));
  }
  if (count > 0 && (ids == nullptr || labels == nullptr || (dense == nullptr && config_.num_dense > 0))) {
    return absl::InvalidArgumentError("CTR batch part: an output array (ids, dense or labels) is null; pass all three");
  }
  FillRange(TrainStream(worker, step), first, count, ids, dense, labels, probabilities);
  return absl::OkStatus();
}

int64_t CtrGenerator::DenseCount(float value) {
  if (!(value >= 0) || !(value < 43)) return -1;  // far above any count the generator draws
  const auto guess = static_cast<int64_t>(std::llround(std::expm1(static_cast<double>(value))));
  for (int64_t c = std::max<int64_t>(guess - 1, 0); c <= guess + 1; ++c) {
    if (CriteoDenseValue(c) == value) return c;
  }
  return -1;
}

absl::Status CtrGenerator::FillTest(int64_t first, int64_t count, int64_t* ids, float* dense, float* labels,
                                    double* probabilities) const {
  if (first < 0 || count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CTR test set: first ", first, ", count ", count, "; neither may be negative"));
  }
  if (count > 0 && (ids == nullptr || labels == nullptr || (dense == nullptr && config_.num_dense > 0))) {
    return absl::InvalidArgumentError("CTR test set: an output array (ids, dense or labels) is null; pass all three");
  }
  FillRange(keys_.test, first, count, ids, dense, labels, probabilities);
  return absl::OkStatus();
}

absl::StatusOr<CtrExamples> CtrGenerator::TestSet(int64_t n) const {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("CTR test set: size ", n, "; it must be at least 1"));
  CtrExamples out;
  out.num_examples = n;
  out.num_fields = config_.num_fields;
  out.num_dense = config_.num_dense;
  out.ids.resize(n * config_.num_fields);
  out.dense.resize(n * config_.num_dense);
  out.labels.resize(n);
  out.probabilities.resize(n);
  FillRange(keys_.test, 0, n, out.ids.data(), out.dense.data(), out.labels.data(), out.probabilities.data());
  return out;
}

absl::StatusOr<CtrBayesMetrics> BayesMetrics(const CtrExamples& examples) {
  if (examples.labels.size() != examples.probabilities.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Bayes metrics: ", examples.labels.size(), " labels but ",
                                                   examples.probabilities.size(), " true probabilities"));
  }
  CtrBayesMetrics out;
  absl::StatusOr<double> log_loss = LogLoss(examples.labels, examples.probabilities);
  if (!log_loss.ok()) return log_loss.status();
  absl::StatusOr<double> auc = Auc(examples.labels, examples.probabilities);
  if (!auc.ok()) return auc.status();
  out.log_loss = *log_loss;
  out.auc = *auc;
  double entropy = 0, clicks = 0;
  for (size_t i = 0; i < examples.labels.size(); ++i) {
    const double p = examples.probabilities[i];
    if (p > 0 && p < 1) entropy -= p * std::log(p) + (1 - p) * std::log1p(-p);
    clicks += examples.labels[i];
  }
  out.expected_log_loss = entropy / static_cast<double>(examples.labels.size());
  out.click_rate = clicks / static_cast<double>(examples.labels.size());
  return out;
}

}  // namespace psflow::data
