// Bounded, reused pools of timing events: one slot per start or end of a section.
//
// A pool is sized once at construction and never grows: a step that records more
// events than slots loses the extra sections, and the stage timer counts every loss.
// HostEventPool reads the host steady clock; CudaEventPool (built WITH_CUDA) records
// CUDA events on the current stream and is read after one synchronize at step end.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace relax_straggler::torch_ext {

class EventPool {
 public:
  virtual ~EventPool() = default;
  // Number of slots.
  virtual std::size_t capacity() const = 0;
  // Records the event in slot i (i < capacity()). Never blocks.
  virtual void record(std::size_t i) = 0;
  // Waits until every event recorded so far can be read (the one read point of a step).
  virtual void synchronize() = 0;
  // Milliseconds between the events in slots a and b; requires synchronize() first.
  virtual double elapsed_ms(std::size_t a, std::size_t b) = 0;
  // "cpu" or "cuda".
  virtual const char* device() const = 0;
};

// Host steady-clock timestamps (the CPU path: device time == host time).
class HostEventPool final : public EventPool {
 public:
  explicit HostEventPool(std::size_t capacity) : ts_ns_(capacity, 0) {}
  std::size_t capacity() const override { return ts_ns_.size(); }
  void record(std::size_t i) override { ts_ns_[i] = now_ns(); }
  void synchronize() override {}
  double elapsed_ms(std::size_t a, std::size_t b) override {
    return static_cast<double>(ts_ns_[b] - ts_ns_[a]) * 1e-6;
  }
  const char* device() const override { return "cpu"; }

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  std::vector<std::int64_t> ts_ns_;
};

#ifdef WITH_CUDA
// CUDA events created once (timing enabled) and recorded on the current stream.
std::unique_ptr<EventPool> make_cuda_event_pool(std::size_t capacity);
#endif

}  // namespace relax_straggler::torch_ext
