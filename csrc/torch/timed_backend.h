// TimedBackend: the thin c10d::Backend wrapper of the collective layer.
//
// It holds the real backend of a ProcessGroup (Gloo, NCCL, ...) and forwards every
// virtual method to it, one method per operation. On a sampled step the collectives
// also go through timed(): the start is recorded before forwarding, the end when the
// returned Work completes (its future's callback, which never waits), or right after
// the call for a synchronous op that returns no Work; the caller gets a TimedWork that
// times how long it blocks in wait(). On other steps the cost is one atomic load and
// one branch, plus the group's progress counters (group_progress.h), kept on every step.
// Nothing here calls wait() or synchronizes.
//
// Overrides of virtuals that older torch versions lack are guarded by
// RS_TORCH_AT_LEAST (checked against the headers of torch 2.4 to 2.13).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm_op.h"
#include "group_progress.h"
#include "stage_timer.h"
#include "torch_version.h"

namespace relax_straggler::torch_ext {

class TimedBackend final : public c10d::Backend {
 public:
  // original_type: how the ProcessGroup knew `inner`, restored by unwrap_process_group.
  TimedBackend(c10::intrusive_ptr<c10d::Backend> inner, c10d::ProcessGroup::BackendType original_type);

  // Starts timing into `timer` (comparable: the group spans every analyzed rank).
  // Attach and detach at quiescent points (install/uninstall); a retired timer is kept
  // alive as long as this backend, since a completion callback may still hold it.
  void attach(std::shared_ptr<StageTimer> timer, bool comparable);
  void detach();
  bool attached() const { return timer_.load(std::memory_order_acquire) != nullptr; }
  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }
  // The group's progress counters; they outlive the wrapper for whoever holds them.
  const std::shared_ptr<GroupProgress>& progress() const { return progress_; }
  c10d::ProcessGroup::BackendType original_type() const { return original_type_; }

  // --- forwarded, timed on sampled steps ---------------------------------------------
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // --- forwarded only -----------------------------------------------------------------
  const std::string getBackendName() const override { return inner_->getBackendName(); }
  bool supportsSplitting() const override { return inner_->supportsSplitting(); }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    inner_->monitoredBarrier(opts, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override {
    inner_->registerOnCompletionHook(std::move(hook));
  }
  void waitForPendingWorks() override { inner_->waitForPendingWorks(); }
  void enableCollectivesTiming() override { inner_->enableCollectivesTiming(); }
  void eagerConnectSingleDevice(at::Device device) override { inner_->eagerConnectSingleDevice(device); }
#if RS_TORCH_AT_LEAST(2, 7)
  bool supportsCoalescing() const override { return inner_->supportsCoalescing(); }
  bool supportsTensorAlloc(c10::DeviceIndex device_index) override { return inner_->supportsTensorAlloc(device_index); }
  c10d::ErrorType getError() override { return inner_->getError(); }
  std::shared_ptr<c10::Allocator> getMemAllocator() override { return inner_->getMemAllocator(); }
  at::Tensor allocateTensor(long size, at::TensorOptions options) override {
    return inner_->allocateTensor(size, options);
  }
  // Not forwarded: the inner backend stays registered in the group under its own type,
  // and ProcessGroup::shutdown/abort reach every registered backend; forwarding would
  // stop the inner one twice.
  void abort() override {}
  void shutdown() override {}
#endif
#if RS_TORCH_AT_LEAST(2, 8)
  bool supportsTimeEstimation() const override { return inner_->supportsTimeEstimation(); }
#endif
#if RS_TORCH_AT_LEAST(2, 9)
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  c10::intrusive_ptr<Options> getBackendOptions() override { return inner_->getBackendOptions(); }
  c10::intrusive_ptr<Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                    const c10::intrusive_ptr<Options>& opts) override {
    return inner_->split(store, ranks, opts);
  }
  c10::intrusive_ptr<Backend> merge(const c10::intrusive_ptr<c10d::Store>& store,
                                    const c10::intrusive_ptr<Options>& opts, const int& rank,
                                    const int& size) override {
    return inner_->merge(store, opts, rank, size);
  }
#endif
#if RS_TORCH_AT_LEAST(2, 10)
  bool supportsShrinking() const override { return inner_->supportsShrinking(); }
  c10::intrusive_ptr<Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                     const c10::intrusive_ptr<Options>& opts_override) override {
    return inner_->shrink(ranks_to_exclude, shrink_flags, opts_override);
  }
  void setGroupUid(const std::string& pg_uid) override {
    Backend::setGroupUid(pg_uid);
    inner_->setGroupUid(pg_uid);
  }
#endif
#if RS_TORCH_AT_LEAST(2, 12)
  void suspend() override { inner_->suspend(); }
  void resume() override { inner_->resume(); }
  std::unordered_map<std::string, uint64_t> getMemoryStats() override { return inner_->getMemoryStats(); }
#endif

 private:
  // The one timing helper every collective calls. `call` forwards to inner_.
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> timed(ProgressOp op, std::int64_t bytes, Call&& call);
  c10::intrusive_ptr<c10d::Work> finish(StageTimer& timer, std::int64_t token, ProgressOp op, std::uint64_t seq,
                                        c10::intrusive_ptr<c10d::Work> work);

  const c10::intrusive_ptr<c10d::Backend> inner_;
  const c10d::ProcessGroup::BackendType original_type_;
  const std::shared_ptr<GroupProgress> progress_ = std::make_shared<GroupProgress>();
  std::atomic<StageTimer*> timer_{nullptr};
  std::shared_ptr<StageTimer> owner_;
  std::vector<std::shared_ptr<StageTimer>> retired_;
  bool comparable_ = false;
  bool coalescing_ = false;               // between startCoalescing and endCoalescing
  std::vector<std::int64_t> coalesced_;   // tokens that end with the coalesced Work
};

// Swaps the backend of `pg` for `device` ("cpu", "cuda") for a TimedBackend (or
// re-attaches the one already there). Returns false, changing nothing, when that
// backend is not one c10d knows by type (a custom backend is never wrapped).
bool wrap_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string& device,
                        std::shared_ptr<StageTimer> timer, bool comparable);

// Puts the original backend back for `device` and detaches the wrapper. Returns
// whether `pg` was wrapped.
bool unwrap_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string& device);

// Whether the backend `pg` uses for `device` is a TimedBackend.
bool is_wrapped(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string& device);

// The progress counters of the TimedBackend `pg` uses for `device`; null when not wrapped.
std::shared_ptr<GroupProgress> progress_of(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                           const std::string& device);

}  // namespace relax_straggler::torch_ext
