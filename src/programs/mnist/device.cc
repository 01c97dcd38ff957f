// CPU devices for local replicas (programs/mnist/device.h): one executor thread per device.
#include "programs/mnist/device.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace psflow::train {
namespace {

// A CPU device: one executor thread that runs the closures it is given, one at a time.
// Thread-safe; mu_ guards the hand-over between Run/Wait and the executor thread.
class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int index) : name_(absl::StrCat("/cpu:", index)), thread_([this] { Loop(); }) {}
  ~CpuDevice() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  const std::string& name() const override { return name_; }
  void Run(std::function<void()> fn) override {
    absl::MutexLock lock(&mu_);
    pending_ = std::move(fn);
    busy_ = true;
  }
  void Wait() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &CpuDevice::Idle));
  }

 private:
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; }
  bool StopOrWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || pending_ != nullptr; }

  // Waits for the next closure; nullptr once stopped.
  std::function<void()> Next() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &CpuDevice::StopOrWork));
    if (stop_) return nullptr;
    std::function<void()> fn = std::move(pending_);
    pending_ = nullptr;
    return fn;
  }

  void Loop() {
    while (std::function<void()> fn = Next()) {
      fn();  // outside the lock
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
  }

  const std::string name_;
  absl::Mutex mu_;
  std::function<void()> pending_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started after the state above exists
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeDevices(const std::string& kind, int count) {
  if (kind != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("device kind '", kind, "' is not supported; this build has: cpu"));
  }
  if (count < 1) return absl::InvalidArgumentError(absl::StrCat("--local_replicas=", count, " must be at least 1"));
  std::vector<std::unique_ptr<Device>> devices;
  for (int i = 0; i < count; ++i) devices.push_back(std::make_unique<CpuDevice>(i));
  return devices;
}

}  // namespace psflow::train
