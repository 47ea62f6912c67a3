#include "timed_work.h"

namespace relax_straggler::torch_ext {

TimedWork::TimedWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<StageTimer> timer,
                     c10::intrusive_ptr<c10::ivalue::Future> future, std::int64_t end_token)
    : c10d::Work(-1, inner->retrieveOpType()),
      inner_(std::move(inner)),
      timer_(std::move(timer)),
      future_(std::move(future)),
      end_token_(end_token) {}

bool TimedWork::wait(std::chrono::milliseconds timeout) {
  const std::int64_t token = timer_->wait_begin();
  bool ok = false;
  try {
    ok = inner_->wait(timeout);
    if (ok && future_) future_->wait();  // returns once the end callback has run
  } catch (...) {
    timer_->wait_end(token);
    throw;
  }
  timer_->wait_end(token);
  if (end_token_ >= 0) timer_->comm_end(end_token_);
  return ok;
}

}  // namespace relax_straggler::torch_ext
