// GroupProgress: how far one process group got, for the hang watchdog
// (relax_straggler/hang/, docs/DESIGN.md "When the job stops").
//
// TimedBackend updates it on every operation, sampled step or not: the last collective
// and the last point-to-point op entered (each with its own sequence number, counted
// from 1 on this rank) and the last op seen completed, each with its time. The update
// is one relaxed fetch_add, one coarse clock read and two relaxed stores: no allocation,
// no lock. Another thread reads it while training is stuck. Each slot packs the
// sequence number and the op kind in one word, so a reader never pairs one op's number
// with another op's kind; the time next to it may be the previous op's when read in the
// middle of an update (the watchdog reads a group that has not moved for seconds).
//
// Completion is seen where the wrapper observes it without extra work: ops that return
// no Work (they ended with the call) and collectives of sampled steps (their completion
// callback). On other steps an asynchronous op's end is not observed; the hang analysis
// infers it from the peers (a collective every member has passed has completed).
#pragma once

#include <time.h>

#include <array>
#include <atomic>
#include <cstdint>

#include "comm_op.h"

namespace relax_straggler::torch_ext {

// Operation kinds as the progress reports them (finer than CommOp, which groups reduce,
// gather, scatter and barrier as kOther); names follow torch.distributed's functions.
enum class ProgressOp : std::uint8_t {
  kAllreduce,
  kReduceScatter,
  kAllgather,
  kBroadcast,
  kAlltoall,
  kSend,
  kRecv,
  kReduce,
  kGather,
  kScatter,
  kBarrier,
};

constexpr std::array<const char*, 11> kProgressOpNames = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send",
    "recv",       "reduce",         "gather",     "scatter",   "barrier"};

constexpr CommOp comm_op_of(ProgressOp op) {
  switch (op) {
    case ProgressOp::kAllreduce: return CommOp::kAllreduce;
    case ProgressOp::kReduceScatter: return CommOp::kReduceScatter;
    case ProgressOp::kAllgather: return CommOp::kAllgather;
    case ProgressOp::kBroadcast: return CommOp::kBroadcast;
    case ProgressOp::kAlltoall: return CommOp::kAlltoall;
    case ProgressOp::kSend: return CommOp::kSend;
    case ProgressOp::kRecv: return CommOp::kRecv;
    default: return CommOp::kOther;
  }
}

// CLOCK_MONOTONIC_COARSE in ns: a vDSO read of a few ns at the resolution of a scheduler
// tick (1-4 ms), ample for a watchdog that counts seconds.
inline std::int64_t coarse_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

// One slot as read: seq 0 means no op of that kind yet.
struct ProgressEntry {
  std::uint64_t seq = 0;
  ProgressOp op = ProgressOp::kAllreduce;
  std::int64_t ns = 0;  // coarse_now_ns() when entered / completed
};

struct ProgressSnapshot {
  ProgressEntry collective;  // last collective entered (sequence over non-p2p ops)
  ProgressEntry p2p;         // last send / recv entered (its own sequence)
  ProgressEntry completed;   // last op seen completed (either sequence, by its op)
};

class GroupProgress {
 public:
  // Before forwarding an op; returns its sequence number (collective or p2p).
  std::uint64_t enter(ProgressOp op) {
    Slot& s = is_p2p(op) ? p2p_ : collective_;
    const std::uint64_t seq = s.count.fetch_add(1, std::memory_order_relaxed) + 1;
    s.ns.store(coarse_now_ns(), std::memory_order_relaxed);
    s.packed.store(pack(seq, op), std::memory_order_release);
    return seq;
  }

  // When the op numbered `seq` by enter() is seen completed (any thread).
  void complete(ProgressOp op, std::uint64_t seq) {
    completed_.ns.store(coarse_now_ns(), std::memory_order_relaxed);
    completed_.packed.store(pack(seq, op), std::memory_order_release);
  }

  ProgressSnapshot snapshot() const { return {read(collective_), read(p2p_), read(completed_)}; }

  static constexpr bool is_p2p(ProgressOp op) { return op == ProgressOp::kSend || op == ProgressOp::kRecv; }

 private:
  struct alignas(64) Slot {  // its own cache line: completion callbacks write from other threads
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::uint64_t> packed{0};  // seq << 8 | op
    std::atomic<std::int64_t> ns{0};
  };

  static std::uint64_t pack(std::uint64_t seq, ProgressOp op) { return seq << 8 | static_cast<std::uint8_t>(op); }

  static ProgressEntry read(const Slot& s) {
    const std::uint64_t packed = s.packed.load(std::memory_order_acquire);
    return {packed >> 8, static_cast<ProgressOp>(packed & 0xff), s.ns.load(std::memory_order_relaxed)};
  }

  Slot collective_;
  Slot p2p_;
  Slot completed_;
};

}  // namespace relax_straggler::torch_ext
