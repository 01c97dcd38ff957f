#include "train/device.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"

namespace psflow::train {
namespace {

// A CPU device: one executor thread that runs the closures it is given, one at a time.
class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int index) : name_(absl::StrCat("/cpu:", index)), thread_([this] { Loop(); }) {}
  ~CpuDevice() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  const std::string& name() const override { return name_; }
  void Run(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_ = std::move(fn);
      busy_ = true;
    }
    cv_.notify_all();
  }
  void Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || pending_; });
      if (stop_) return;
      auto fn = std::move(pending_);
      pending_ = nullptr;
      lock.unlock();
      fn();
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> pending_;
  bool busy_ = false, stop_ = false;
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
