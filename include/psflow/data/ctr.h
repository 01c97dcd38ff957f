// psflow/data/ctr.h — synthetic click-through-rate data with a known answer: the workload of
// embedding tables (hashed ids, Zipf frequencies), generated on the fly, with the Bayes log-loss and
// AUC that every model trained on it is measured against.
//
// An example has F categorical fields and D dense features. Field f's id is a Zipf(α) draw of a
// rank r in [1, V_f] (P(r) = r^-α / Σ_s s^-α, sampled exactly), mapped to a non-negative int64 by
// a bijection of (seed, field, rank) on [0, 2^63), so ids look hashed and are unique per field.
// Dense features are integer counts c as the model sees them in Criteo's layout, log(1 + c)
// (CriteoDenseValue in psflow/data/criteo.h), with c = floor(exp(1 + 1.5·z)) for z ~ N(0, 1): a
// quarter are 0, the largest 1785. So the generator's files (WriteCtrFiles) read back to the same
// bits. The teacher is a factorization machine:
//   logit = b + w*·x + Σ_{f<g} ⟨E*_f[id_f], E*_g[id_g]⟩,   label ~ Bernoulli(σ(logit)),
// where E*_f[id] ∈ R^k is a function of (seed, field, id) computed when needed (never stored, so a
// vocabulary may hold 10^12 ranks), w* is drawn from the seed, and b is set at construction so that
// the mean click rate is near `base_ctr`. The FM term is scaled so that its standard deviation over
// examples is about `interaction_std`, and w*·x's exactly `dense_std` (over the counts' distribution).
//
// Every value is a deterministic function of the seed and of where the example sits:
//   - worker w's batch at step s: example j is a function of (seed, w, s, j) only, so the same
//     (seed, w, s) gives the same bits whatever the batch size (a smaller batch is a prefix) and
//     whoever asks, and different workers or steps are independent streams;
//   - the test set: example j of one test stream, a function of (seed, j) only.
// Normal draws (the z of dense features, teacher entries) are inverse-CDF lookups at 16-bit resolution
// (65536 equiprobable quantiles of N(0, 1), so |value| <= 4.33), from splitmix64 streams.
//
// A CtrGenerator is immutable once created: any number of threads may call its const methods
// concurrently. Filling a batch allocates nothing; the caller owns every output array.
#ifndef PSFLOW_DATA_CTR_H_
#define PSFLOW_DATA_CTR_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace psflow::data {

struct CtrConfig {
  uint64_t seed = 0;
  int num_fields = 26;  // F, as Criteo's
  int num_dense = 13;   // D, as Criteo's
  // V_f, one per field, each in [1, 2^40]. Empty: DefaultCtrVocabSizes(num_fields).
  std::vector<int64_t> vocab_sizes;
  double zipf_alpha = 1.1;       // > 0
  int teacher_dim = 8;           // k, in [1, 256]
  double interaction_std = 1.0;  // >= 0: scale of the FM term
  double dense_std = 0.5;        // >= 0: scale of w*·x
  double base_ctr = 0.25;        // in (0, 1): the mean of σ(logit) that b is set for
};

// Criteo Kaggle's 26 categorical cardinalities capped at 10^6 (repeated for more fields):
// from 3 to 10^6 ranks, a few huge fields and many small ones.
std::vector<int64_t> DefaultCtrVocabSizes(int num_fields);

// Named configurations of the generator (`psflow train --model=ctr --ctr_preset=NAME`), applied to
// `config` (its seed and field count kept):
//   "criteo"     CtrConfig's defaults: Criteo's cardinalities (DefaultCtrVocabSizes), Zipf(1.1),
//                interaction_std 1. The benchmark of speed and memory; its Bayes AUC cannot be
//                reached at an affordable budget (docs/tables.md#the-ctr-model-against-bayes).
//   "learnable"  fewer rare ids and more signal per example: every field's vocabulary capped at
//                kLearnableVocabCap ranks and the FM term's scale raised to kLearnableInteractionStd,
//                so the ctr model comes within 0.01 of the Bayes AUC in 20000 steps of 1024
//                (docs/tables.md#the-ctr-model-against-bayes: 0.0108 short after 4000 steps).
// InvalidArgument naming the preset and the known ones otherwise.
inline constexpr int64_t kLearnableVocabCap = 100;
inline constexpr double kLearnableInteractionStd = 2.0;
absl::Status ApplyCtrPreset(std::string_view preset, CtrConfig* config);

// n examples in the layout of CtrGenerator::FillBatch, owning their arrays.
struct CtrExamples {
  int64_t num_examples = 0;
  int num_fields = 0, num_dense = 0;
  std::vector<int64_t> ids;           // [n, F] row-major
  std::vector<float> dense;           // [n, D] row-major
  std::vector<float> labels;          // [n], 0 or 1
  std::vector<double> probabilities;  // [n], the teacher's σ(logit) that drew each label
};

// What the true probabilities score on a set of examples: the ceiling of every model on it.
struct CtrBayesMetrics {
  double log_loss = 0;           // mean cross-entropy of the labels under the true probabilities
  double auc = 0;                // AUC of the true probabilities (ties at their average rank)
  double expected_log_loss = 0;  // mean binary entropy of the true probabilities (log_loss's mean)
  double click_rate = 0;         // mean label
};

class CtrGenerator {
 public:
  // InvalidArgument naming the field of `config` that is out of range and its allowed range.
  static absl::StatusOr<CtrGenerator> Create(CtrConfig config);

  // Worker `worker`'s batch at `step` (both >= 0): batch_size >= 0 examples written to
  // ids [batch_size, F], dense [batch_size, D], labels [batch_size] (0 or 1) and, unless null,
  // the true probabilities [batch_size]. InvalidArgument for a negative argument or a null
  // array with batch_size > 0; nothing is written then.
  absl::Status FillBatch(int64_t worker, int64_t step, int64_t batch_size, int64_t* ids, float* dense, float* labels,
                         double* probabilities = nullptr) const;
  // Examples [first, first + count) of worker `worker`'s batch at `step`: the same bits as those
  // rows of any FillBatch(worker, step, batch_size >= first + count, ...), into arrays of `count` rows.
  absl::Status FillBatchPart(int64_t worker, int64_t step, int64_t first, int64_t count, int64_t* ids, float* dense,
                             float* labels, double* probabilities = nullptr) const;
  // Examples [first, first + count) of the test stream, in the same layout.
  absl::Status FillTest(int64_t first, int64_t count, int64_t* ids, float* dense, float* labels,
                        double* probabilities = nullptr) const;
  // The test set of n >= 1 examples: the first n of the test stream.
  absl::StatusOr<CtrExamples> TestSet(int64_t n) const;

  // The integer count c >= 0 whose dense value (log(1 + c) as float) is `value`, or -1 if `value` is
  // no such value: turns the generator's dense features back into the integers files hold.
  static int64_t DenseCount(float value);

  // The teacher, for checks and for a model's diagnostics.
  // Field f's id of rank r in [1, V_f] (CHECKed); a bijection of r onto a subset of [0, 2^63).
  int64_t IdOfRank(int field, int64_t rank) const;
  // E*_f[id], teacher_dim floats into `out`; any int64 id (ids never drawn still have a value).
  void TeacherEmbedding(int field, int64_t id, float* out) const;
  // The logit of one example: F ids and D dense features.
  double TrueLogit(const int64_t* ids, const float* dense) const;
  absl::Span<const float> dense_weights() const { return dense_weights_; }
  double bias() const { return bias_; }

  const CtrConfig& config() const { return config_; }
  int num_fields() const { return config_.num_fields; }
  int num_dense() const { return config_.num_dense; }

 private:
  // Field f's Zipf sampler is a table of cells of consecutive ranks (single ranks up to 127, then
  // widths of about rank/64), one picked by an alias table on their exact masses, then a rank
  // inside it by rejection against r^-α (which varies by under 1.8 % within a cell, so a
  // precomputed squeeze accepts nearly every draw without a pow).
  struct ZipfCell {
    int64_t first;     // first rank
    uint32_t width;    // ranks in the cell
    uint32_t squeeze;  // floor(2^32 · (last/first)^-α): a uniform below it is accepted outright
    uint64_t keep;     // alias table: keep this cell if 32 random bits < keep (<= 2^32) ...
    uint64_t alias;    // ... else take cell `alias`
  };
  static constexpr int64_t kHeadRanks = 128;  // E*_f of ranks 1..128 are tabulated: most draws

  struct Keys {
    uint64_t train, test, calibration, ids, teacher;
  };

  explicit CtrGenerator(CtrConfig config);
  int64_t SampleRank(const std::vector<ZipfCell>& cells, uint64_t& state) const;
  // E*_f[id], where id is the field's id of `rank` (0: not known): the tabulated row of a head
  // rank, else computed into `scratch`.
  const float* Embedding(int field, int64_t id, int64_t rank, float* scratch) const;
  double Logit(const int64_t* ids, const int64_t* ranks, const float* dense) const;
  // Writes example `index` of the stream `stream_key` (and its logit unless null); returns σ(logit).
  double FillExample(uint64_t stream_key, int64_t index, int64_t* ids, float* dense, float* label,
                     double* logit_out = nullptr) const;
  void FillRange(uint64_t stream_key, int64_t first, int64_t count, int64_t* ids, float* dense, float* labels,
                 double* probabilities) const;
  uint64_t TrainStream(int64_t worker, int64_t step) const;

  CtrConfig config_;
  Keys keys_{};
  std::vector<uint64_t> field_id_keys_, field_teacher_keys_;
  std::vector<std::vector<ZipfCell>> samplers_;  // per field
  std::vector<float> head_embeddings_;           // [F][kHeadRanks][k]
  std::vector<float> dense_weights_;
  float embedding_scale_ = 0;
  double bias_ = 0;
};

// The Bayes metrics of a set of examples from its true probabilities. InvalidArgument if it is
// empty or holds one class only (AUC undefined).
absl::StatusOr<CtrBayesMetrics> BayesMetrics(const CtrExamples& examples);

}  // namespace psflow::data

#endif  // PSFLOW_DATA_CTR_H_
