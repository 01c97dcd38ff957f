// The value of a resolved TrainOptions field, whether the field is a plain value or a
// std::optional (filled by ResolveTrainOptions): lets the session and worker read the options
// the same way either representation. Header-only, pure.
#ifndef PSFLOW_TRAIN_OPTION_VALUE_H_
#define PSFLOW_TRAIN_OPTION_VALUE_H_

#include <optional>
#include <type_traits>

namespace psflow::train {

template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <typename T>
auto OptionValue(const T& field) {
  if constexpr (IsOptional<T>::value) {
    return field.value();
  } else {
    return field;
  }
}

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_OPTION_VALUE_H_
