// psflow_ctr_dump: prints what the C++ CTR generator makes for one configuration, as JSON, so that
// another implementation or binding (python/tests/test_ctr_data.py) can compare bit for bit.
//   psflow_ctr_dump SEED WORKER STEP BATCH TEST_SIZE
// prints {"ids", "dense", "labels", "probabilities"} of worker WORKER's batch at STEP,
// {"test_ids", "test_labels", "test_probabilities"} of the first TEST_SIZE test examples, the
// Bayes metrics of that test set ("bayes_log_loss", "bayes_auc") and the teacher ("bias",
// "dense_weights"), all with the default configuration but the seed.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "psflow/data/ctr.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s SEED WORKER STEP BATCH TEST_SIZE\n", argv[0]);
    return 2;
  }
  const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  const int64_t worker = std::atoll(argv[2]), step = std::atoll(argv[3]), batch = std::atoll(argv[4]),
                test_size = std::atoll(argv[5]);
  psflow::data::CtrConfig config;
  config.seed = seed;
  absl::StatusOr<psflow::data::CtrGenerator> gen = psflow::data::CtrGenerator::Create(config);
  if (!gen.ok()) {
    std::fprintf(stderr, "%s\n", std::string(gen.status().message()).c_str());
    return 1;
  }
  std::vector<int64_t> ids(batch * gen->num_fields());
  std::vector<float> dense(batch * gen->num_dense()), labels(batch);
  std::vector<double> probabilities(batch);
  if (absl::Status s =
          gen->FillBatch(worker, step, batch, ids.data(), dense.data(), labels.data(), probabilities.data());
      !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  absl::StatusOr<psflow::data::CtrExamples> test = gen->TestSet(test_size);
  if (!test.ok()) {
    std::fprintf(stderr, "%s\n", std::string(test.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<psflow::data::CtrBayesMetrics> bayes = psflow::data::BayesMetrics(*test);
  nlohmann::json out;
  out["ids"] = ids;
  out["dense"] = dense;
  out["labels"] = labels;
  out["probabilities"] = probabilities;
  out["test_ids"] = test->ids;
  out["test_labels"] = test->labels;
  out["test_probabilities"] = test->probabilities;
  if (bayes.ok()) {
    out["bayes_log_loss"] = bayes->log_loss;
    out["bayes_auc"] = bayes->auc;
  }
  out["bias"] = gen->bias();
  out["dense_weights"] = std::vector<float>(gen->dense_weights().begin(), gen->dense_weights().end());
  std::cout << out.dump() << "\n";
  return 0;
}
