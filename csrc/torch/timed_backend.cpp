#include "timed_backend.h"

#include <optional>

#include "timed_work.h"

namespace relax_straggler::torch_ext {
namespace {

using c10d::ProcessGroup;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

std::int64_t nbytes(const std::vector<at::Tensor>& tensors) {
  std::int64_t n = 0;
  for (const auto& t : tensors) n += static_cast<std::int64_t>(t.nbytes());
  return n;
}

std::int64_t nbytes(const std::vector<std::vector<at::Tensor>>& lists) {
  std::int64_t n = 0;
  for (const auto& l : lists) n += nbytes(l);
  return n;
}

std::optional<ProcessGroup::BackendType> backend_type_of(const std::string& name) {
  if (name == "gloo") return ProcessGroup::BackendType::GLOO;
  if (name == "nccl") return ProcessGroup::BackendType::NCCL;
  if (name == "ucc") return ProcessGroup::BackendType::UCC;
  if (name == "mpi") return ProcessGroup::BackendType::MPI;
#if RS_TORCH_AT_LEAST(2, 6)
  if (name == "xccl") return ProcessGroup::BackendType::XCCL;
#endif
  return std::nullopt;
}

TimedBackend* as_timed(const c10::intrusive_ptr<c10d::Backend>& b) { return dynamic_cast<TimedBackend*>(b.get()); }

// The group's backend for a device type or of a backend type; null when it has none.
template <typename Key>
c10::intrusive_ptr<c10d::Backend> backend_of(const c10::intrusive_ptr<ProcessGroup>& pg, Key key) {
  try {
    return pg->getBackend(key);
  } catch (const c10::Error&) {
    return {};
  }
}

}  // namespace

TimedBackend::TimedBackend(c10::intrusive_ptr<c10d::Backend> inner, ProcessGroup::BackendType original_type)
    : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)), original_type_(original_type) {}

void TimedBackend::attach(std::shared_ptr<StageTimer> timer, bool comparable) {
  if (owner_) retired_.push_back(std::move(owner_));
  owner_ = std::move(timer);
  comparable_ = comparable;
  timer_.store(owner_.get(), std::memory_order_release);
}

void TimedBackend::detach() { timer_.store(nullptr, std::memory_order_release); }

template <typename Call>
WorkPtr TimedBackend::timed(ProgressOp op, std::int64_t bytes, Call&& call) {
  const std::uint64_t seq = progress_->enter(op);
  StageTimer* timer = timer_.load(std::memory_order_acquire);
  if (timer == nullptr || !timer->sampled()) {  // the non-sampled path
    WorkPtr work = call();
    if (!work && !coalescing_) progress_->complete(op, seq);  // it ended with the call
    return work;
  }
  const std::int64_t token = timer->comm_begin(comm_op_of(op), comparable_, bytes);
  return finish(*timer, token, op, seq, call());
}

WorkPtr TimedBackend::finish(StageTimer& timer, std::int64_t token, ProgressOp op, std::uint64_t seq, WorkPtr work) {
  if (!work && !coalescing_) progress_->complete(op, seq);
  if (token < 0) return work;  // the pool was full: counted by the timer
  if (!work) {
    // A synchronous op (e.g. NCCL on the current stream): it ended with the call, and
    // the caller was blocked for all of it. Inside start/endCoalescing it ends with the
    // coalesced Work instead.
    if (coalescing_) {
      coalesced_.push_back(token);
    } else {
      timer.comm_end(token, /*blocking=*/true);
    }
    return work;
  }
  std::shared_ptr<StageTimer> keep = owner_;
  std::shared_ptr<GroupProgress> progress = progress_;
  c10::intrusive_ptr<c10::ivalue::Future> chained;
  try {
    if (auto future = work->getFuture()) {
      // Runs on completion (a communication thread for Gloo; for NCCL under the
      // collective's stream, so a CUDA end event lands after it) and passes the value on.
      chained = future->then(
          [keep, progress, token, op, seq](c10::ivalue::Future& parent) {
            keep->comm_end(token);
            progress->complete(op, seq);
            return parent.value();
          },
          future->elementType());
    }
  } catch (const c10::Error&) {
    // This Work has no future: its end is taken when the caller's wait() returns.
  }
  return c10::make_intrusive<TimedWork>(std::move(work), std::move(keep), chained, chained ? -1 : token);
}

WorkPtr TimedBackend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  return timed(ProgressOp::kBroadcast, nbytes(tensors), [&] { return inner_->broadcast(tensors, opts); });
}

WorkPtr TimedBackend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return timed(ProgressOp::kAllreduce, nbytes(tensors), [&] { return inner_->allreduce(tensors, opts); });
}

WorkPtr TimedBackend::allreduce_sparse(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return timed(ProgressOp::kAllreduce, nbytes(tensors), [&] { return inner_->allreduce_sparse(tensors, opts); });
}

WorkPtr TimedBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                          const c10d::AllreduceCoalescedOptions& opts) {
  return timed(ProgressOp::kAllreduce, nbytes(tensors), [&] { return inner_->allreduce_coalesced(tensors, opts); });
}

WorkPtr TimedBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return timed(ProgressOp::kReduce, nbytes(tensors), [&] { return inner_->reduce(tensors, opts); });
}

WorkPtr TimedBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                const c10d::AllgatherOptions& opts) {
  return timed(ProgressOp::kAllgather, nbytes(inputs), [&] { return inner_->allgather(outputs, inputs, opts); });
}

WorkPtr TimedBackend::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return timed(ProgressOp::kAllgather, static_cast<std::int64_t>(input.nbytes()),
               [&] { return inner_->_allgather_base(output, input, opts); });
}

WorkPtr TimedBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  return timed(ProgressOp::kAllgather, nbytes(inputs), [&] { return inner_->allgather_coalesced(outputs, inputs, opts); });
}

WorkPtr TimedBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  return timed(ProgressOp::kAllgather, nbytes(inputs),
               [&] { return inner_->allgather_into_tensor_coalesced(outputs, inputs, opts); });
}

WorkPtr TimedBackend::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                             const c10d::GatherOptions& opts) {
  return timed(ProgressOp::kGather, nbytes(inputs), [&] { return inner_->gather(outputs, inputs, opts); });
}

WorkPtr TimedBackend::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                              const c10d::ScatterOptions& opts) {
  return timed(ProgressOp::kScatter, nbytes(outputs), [&] { return inner_->scatter(outputs, inputs, opts); });
}

WorkPtr TimedBackend::reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                     const c10d::ReduceScatterOptions& opts) {
  return timed(ProgressOp::kReduceScatter, nbytes(inputs), [&] { return inner_->reduce_scatter(outputs, inputs, opts); });
}

WorkPtr TimedBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                           const c10d::ReduceScatterOptions& opts) {
  return timed(ProgressOp::kReduceScatter, static_cast<std::int64_t>(input.nbytes()),
               [&] { return inner_->_reduce_scatter_base(output, input, opts); });
}

WorkPtr TimedBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::ReduceScatterOptions& opts) {
  return timed(ProgressOp::kReduceScatter, nbytes(inputs),
               [&] { return inner_->reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
}

WorkPtr TimedBackend::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
                                    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return timed(ProgressOp::kAlltoall, static_cast<std::int64_t>(input.nbytes()), [&] {
    return inner_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
  });
}

WorkPtr TimedBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                               const c10d::AllToAllOptions& opts) {
  return timed(ProgressOp::kAlltoall, nbytes(inputs), [&] { return inner_->alltoall(outputs, inputs, opts); });
}

WorkPtr TimedBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return timed(ProgressOp::kSend, nbytes(tensors), [&] { return inner_->send(tensors, dst_rank, tag); });
}

WorkPtr TimedBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return timed(ProgressOp::kRecv, nbytes(tensors), [&] { return inner_->recv(tensors, src_rank, tag); });
}

WorkPtr TimedBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return timed(ProgressOp::kRecv, nbytes(tensors), [&] { return inner_->recvAnysource(tensors, tag); });
}

WorkPtr TimedBackend::barrier(const c10d::BarrierOptions& opts) {
  return timed(ProgressOp::kBarrier, 0, [&] { return inner_->barrier(opts); });
}

void TimedBackend::startCoalescing() {
  inner_->startCoalescing();
  coalescing_ = true;
}

WorkPtr TimedBackend::endCoalescing() {
  WorkPtr work = inner_->endCoalescing();
  coalescing_ = false;
  std::vector<std::int64_t> tokens;
  tokens.swap(coalesced_);
  StageTimer* timer = timer_.load(std::memory_order_acquire);
  if (timer == nullptr || tokens.empty()) return work;
  if (!work) {
    for (std::int64_t t : tokens) timer->comm_end(t, /*blocking=*/true);
    return work;
  }
  std::shared_ptr<StageTimer> keep = owner_;
  try {
    if (auto future = work->getFuture()) {
      future->addCallback([keep, tokens](c10::ivalue::Future&) {
        for (std::int64_t t : tokens) keep->comm_end(t);
      });
      return work;
    }
  } catch (const c10::Error&) {
  }
  for (std::int64_t t : tokens) timer->comm_end(t);  // no way to observe the end: end now
  return work;
}

bool wrap_process_group(const c10::intrusive_ptr<ProcessGroup>& pg, const std::string& device,
                        std::shared_ptr<StageTimer> timer, bool comparable) {
  const c10::DeviceType type = c10::Device(device).type();
  c10::intrusive_ptr<c10d::Backend> current = backend_of(pg, type);
  if (!current) return false;
  if (TimedBackend* t = as_timed(current)) {
    t->attach(std::move(timer), comparable);
    return true;
  }
  // An earlier install leaves its detached wrapper registered as the group's CUSTOM
  // backend (c10d has no way to remove it): reuse it when it wraps this backend.
  if (c10::intrusive_ptr<c10d::Backend> custom = backend_of(pg, ProcessGroup::BackendType::CUSTOM)) {
    TimedBackend* t = as_timed(custom);
    if (t == nullptr || t->inner() != current) return false;
    t->attach(std::move(timer), comparable);
    pg->setBackend(type, ProcessGroup::BackendType::CUSTOM, custom);
    return true;
  }
  const std::optional<ProcessGroup::BackendType> original = backend_type_of(current->getBackendName());
  if (!original) return false;
  auto wrapper = c10::make_intrusive<TimedBackend>(current, *original);
  wrapper->attach(std::move(timer), comparable);
  pg->setBackend(type, ProcessGroup::BackendType::CUSTOM, wrapper);
  return true;
}

bool unwrap_process_group(const c10::intrusive_ptr<ProcessGroup>& pg, const std::string& device) {
  c10::intrusive_ptr<c10d::Backend> current = backend_of(pg, c10::Device(device).type());
  TimedBackend* t = as_timed(current);
  if (t == nullptr) return false;
  t->detach();
  pg->setBackend(c10::Device(device).type(), t->original_type(), t->inner());
  return true;
}

bool is_wrapped(const c10::intrusive_ptr<ProcessGroup>& pg, const std::string& device) {
  return as_timed(backend_of(pg, c10::Device(device).type())) != nullptr;
}

std::shared_ptr<GroupProgress> progress_of(const c10::intrusive_ptr<ProcessGroup>& pg, const std::string& device) {
  TimedBackend* t = as_timed(backend_of(pg, c10::Device(device).type()));
  return t == nullptr ? nullptr : t->progress();
}

}  // namespace relax_straggler::torch_ext
