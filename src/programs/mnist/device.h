// programs/mnist/device.h — where a model replica computes. The training loop only sees Device:
// today every device is a CPU core set with its own executor thread ("/cpu:0", "/cpu:1", …); a
// GPU backend adds a Device subclass (and tensors that live on it) without touching the loop.
// A Device runs one closure at a time; Run/Wait may be called from one controlling thread.
#ifndef PSFLOW_PROGRAMS_MNIST_DEVICE_H_
#define PSFLOW_PROGRAMS_MNIST_DEVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace psflow::train {

class Device {
 public:
  virtual ~Device() = default;
  virtual const std::string& name() const = 0;
  // Starts fn on this device; returns at once. At most one closure is in flight per device.
  virtual void Run(std::function<void()> fn) = 0;
  // Blocks until the closure started by Run has finished.
  virtual void Wait() = 0;
};

// `count` devices of the given kind ("cpu"), or InvalidArgument naming the unsupported kind.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeDevices(const std::string& kind, int count);

}  // namespace psflow::train

#endif  // PSFLOW_PROGRAMS_MNIST_DEVICE_H_
