// The Work handed back for a collective issued on a sampled step: forwards everything
// to the inner Work and times how long the caller is blocked in wait() (a wait the
// StageTimer takes out of the compute stage it happened in, docs/ARCHITECTURE.md invariant 8).
//
// Its future is the inner future chained with a callback that records the collective's
// end: whoever waits on it (DDP's reducer does) resumes only after the end is recorded,
// so a step never closes with a finished collective still unrecorded.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>

#include "stage_timer.h"
#include "torch_version.h"

namespace relax_straggler::torch_ext {

class TimedWork final : public c10d::Work {
 public:
  // future: the chained future, or null when the inner Work has none; the collective
  // (token end_token) then ends when wait() returns.
  TimedWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<StageTimer> timer,
            c10::intrusive_ptr<c10::ivalue::Future> future, std::int64_t end_token);

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override;
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_ ? future_ : inner_->getFuture(); }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }
#if RS_TORCH_AT_LEAST(2, 6)
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return inner_->getFutureResult(); }
#endif
#if RS_TORCH_AT_LEAST(2, 9)
  void blockCurrentStream() override { inner_->blockCurrentStream(); }
#endif

  const c10::intrusive_ptr<c10d::Work>& inner() const { return inner_; }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<StageTimer> timer_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::int64_t end_token_;
};

}  // namespace relax_straggler::torch_ext
