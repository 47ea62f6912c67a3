// CUDA-event pool (compiled only when torch has CUDA). Events are created once with
// timing enabled, recorded on the stream current at record time, and read after one
// synchronize at the end of a sampled step.
#ifdef WITH_CUDA

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "event_pool.h"

namespace relax_straggler::torch_ext {
namespace {

class CudaEventPool final : public EventPool {
 public:
  explicit CudaEventPool(std::size_t capacity) : events_(capacity, nullptr), recorded_(capacity, false) {
    for (auto& e : events_) C10_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~CudaEventPool() override {
    for (auto e : events_) {
      if (e != nullptr) cudaEventDestroy(e);  // no throw from a destructor
    }
  }
  CudaEventPool(const CudaEventPool&) = delete;
  CudaEventPool& operator=(const CudaEventPool&) = delete;

  std::size_t capacity() const override { return events_.size(); }

  void record(std::size_t i) override {
    C10_CUDA_CHECK(cudaEventRecord(events_[i], c10::cuda::getCurrentCUDAStream().stream()));
    recorded_[i] = true;
    last_ = i;
  }

  // One synchronize on the last recorded event; events recorded on other streams that
  // are still pending then are waited for individually (rare: sections on side streams).
  void synchronize() override {
    if (last_ == kNone) return;
    C10_CUDA_CHECK(cudaEventSynchronize(events_[last_]));
    for (std::size_t i = 0; i < events_.size(); ++i) {
      if (!recorded_[i]) continue;
      if (cudaEventQuery(events_[i]) == cudaErrorNotReady) C10_CUDA_CHECK(cudaEventSynchronize(events_[i]));
      recorded_[i] = false;
    }
    last_ = kNone;
  }

  double elapsed_ms(std::size_t a, std::size_t b) override {
    float ms = 0.0f;
    C10_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[a], events_[b]));
    return static_cast<double>(ms);
  }

  const char* device() const override { return "cuda"; }

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<cudaEvent_t> events_;
  std::vector<bool> recorded_;
  std::size_t last_ = kNone;
};

}  // namespace

std::unique_ptr<EventPool> make_cuda_event_pool(std::size_t capacity) {
  return std::make_unique<CudaEventPool>(capacity);
}

}  // namespace relax_straggler::torch_ext

#endif  // WITH_CUDA
