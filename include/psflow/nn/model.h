// psflow/nn/model.h — a classifier: a network of layers plus its input shape and class count, and
// the registry of models by name (a user's own, RegisterModel, beside the built-in ones of
// docs/design.md#seed-models, which live in src/nn/model.cc) with their default training
// hyper-parameters. A Model owns its layers and parameters; it is used by one thread at a time
// (replicas build one Model each, from the same seed, so they start identical).
#ifndef PSFLOW_NN_MODEL_H_
#define PSFLOW_NN_MODEL_H_

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "psflow/nn/layers.h"

namespace psflow::nn {

class Model {
 public:
  Model(std::string name, Shape example_shape, int num_classes, std::unique_ptr<Layer> network);

  const std::string& name() const { return name_; }
  // Shape of one example, e.g. {784} or {28, 28, 1}.
  const Shape& example_shape() const { return example_shape_; }
  int num_classes() const { return num_classes_; }
  // Trainable parameters in creation order (the order variables are placed on the ps tasks).
  const std::vector<Var>& parameters() const { return parameters_; }
  int64_t NumParameters() const;

  // Logits [batch, classes] for `batch` images laid out as [batch, example_shape...].
  Var Logits(const float* images, int64_t batch, ForwardContext& ctx);
  // Mean softmax cross-entropy of the logits against labels.
  static Var Loss(const Var& logits, std::span<const int32_t> labels);

 private:
  std::string name_;
  Shape example_shape_;
  int num_classes_;
  std::unique_ptr<Layer> network_;
  std::vector<Var> parameters_;
};

struct ModelConfig {
  std::string name = "mlp";  // softmax | mlp | cnn | vgg19 (ctr: nn::CtrModel, not built here)
  int hidden_units = 100;    // mlp
  uint64_t seed = 0;         // parameter initialization
  // The model's own settings (ModelDefaults::settings) by name: the value given as --NAME=VALUE,
  // else the setting's default. Every setting the model declared is here.
  std::map<std::string, std::string> settings = {};
};

// A setting of a registered model's own: every program that registered the model takes it as
// --NAME=VALUE (psflow train, local and eval, psflow::cli::ParseFlags; `--help` lists it with its
// default), only with --model set to that model; the factory reads it from ModelConfig::settings.
struct ModelSetting {
  std::string name;           // "filters": given as --filters=16; not the name of a psflow flag
  std::string default_value;  // text, as it would be given
  std::string help;
  // Optional: OK, or why the text is refused; the error reads "--NAME=VALUE must be <message>".
  std::function<absl::Status(const std::string& value)> check = nullptr;
};

// A model's own training hyper-parameters (docs/design.md#seed-models): the values of the flags
// left out. A field a registered model leaves alone keeps the value here.
struct ModelDefaults {
  std::string optimizer = "sgd";
  float learning_rate = 0.01f;
  int batch_size = 100;
  int64_t train_steps = 1000;
  int64_t lr_decay_steps = 0;
  float lr_decay_rate = 1.0f;
  bool synthetic_data = false;              // vgg19 trains on synthetic 32x32x3 images
  std::vector<ModelSetting> settings = {};  // the model's own settings, shown by --help
  // Embedding tables (models with tables: ctr). Empty: the optimizer's; 0: the learning rate.
  std::string sparse_optimizer = "";
  float sparse_learning_rate = 0.0f;
};

// A user's own model: psflow builds it by name wherever it builds a seed model (every replica,
// every task), so a program that registers it before calling psflow::cli::Main trains it with
// `--model=NAME` in one process or on a cluster. The factory must build the same parameters
// (names, shapes, values) from the same config. Register before training starts; not
// thread-safe against concurrent registration.
using ModelFactory = std::function<std::unique_ptr<Model>(const ModelConfig& config, Rng& rng)>;
void RegisterModel(const std::string& name, ModelFactory factory, ModelDefaults defaults);

// Builds a registered or seed model, or InvalidArgument "unknown model 'x'; choose one of softmax, mlp, cnn, vgg19".
absl::StatusOr<std::unique_ptr<Model>> BuildModel(const ModelConfig& config);
absl::StatusOr<ModelDefaults> DefaultsFor(const std::string& model_name);
// Every model BuildModel knows: the seed models, then the registered ones by name.
std::vector<std::string> ModelNames();

}  // namespace psflow::nn

#endif  // PSFLOW_NN_MODEL_H_
