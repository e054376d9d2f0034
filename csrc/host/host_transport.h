// Host (CPU) backend of the ODC one-sided transport.
//
// Symmetric buffers live in POSIX shared memory: every rank creates its own segment and
// the peers on the same host map it, so a "get" is a memcpy from a peer's mapping and an
// "accumulate" is an fp32 add into it. Completion and barriers use counters in a small
// per-rank control segment. Nothing here knows about torch: callers pass addresses,
// element counts and dtype codes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "copy_kernels.h"

namespace odc {

// Raised when a peer does not answer in time or has died; the message names the peer.
class PeerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One mapping of a POSIX shared-memory segment. The creator owns the name (unlinks it);
// every mapping unmaps itself on destruction.
class Segment {
 public:
  static std::shared_ptr<Segment> create(const std::string& name, size_t nbytes);
  static std::shared_ptr<Segment> open(const std::string& name, size_t nbytes);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  uintptr_t address() const { return reinterpret_cast<uintptr_t>(base_); }
  size_t size() const { return nbytes_; }
  const std::string& name() const { return name_; }
  bool is_owner() const { return owner_; }
  // Removes the name from /dev/shm (mappings stay valid). Idempotent.
  void unlink();

 private:
  Segment(std::string name, void* base, size_t nbytes, size_t mapped, bool owner)
      : name_(std::move(name)), base_(base), nbytes_(nbytes), mapped_(mapped), owner_(owner) {}
  std::string name_;
  void* base_;
  size_t nbytes_;
  size_t mapped_;
  bool owner_;
  bool unlinked_ = false;
};

constexpr int kNumLocks = 4096;
constexpr uint64_t kControlMagic = 0x6f64637070637431ULL;  // "odcppct1"

// Layout of a rank's control segment (shared by every process on the host).
struct ControlBlock {
  uint64_t magic;
  int64_t pid;
  std::atomic<uint64_t> sync_epoch;  // last barrier epoch this rank arrived at
  std::atomic<uint64_t> turn;        // deterministic-mode turn counter of this owner
  std::atomic<uint32_t> locks[kNumLocks];  // 0 = free, else holder group rank + 1
};

// Whether process pid exists and is not a zombie (a killed, unreaped child counts as dead).
bool pid_alive(int64_t pid);

// Parallel copy (threads only for large copies). streaming: see copy_kernels.h; callers
// copying one piece of a larger transfer pass prefers_streaming(size of the whole).
void copy_bytes(uintptr_t dst, uintptr_t src, size_t nbytes, int num_threads, bool streaming);
// dst (fp32) += src (dtype), no locking: for private buffers.
void accumulate_local(uintptr_t dst, uintptr_t src, int dtype, size_t count, int num_threads);

// The host-side state of one transport group: control segments of the peers on this host
// and the operations that need them (locked accumulate, barrier, turn-taking).
class HostGroup {
 public:
  // peers_control[r] is the mapped control segment of rank r, or nullptr for a rank on
  // another host. global_ranks/pids are used only to name peers in errors.
  HostGroup(int rank, std::vector<std::shared_ptr<Segment>> peers_control,
            std::vector<int64_t> global_ranks, std::vector<int64_t> pids, double timeout_s,
            int num_threads);

  int rank() const { return rank_; }
  int world_size() const { return static_cast<int>(controls_.size()); }
  double timeout_s() const { return timeout_s_; }
  int num_threads() const { return num_threads_; }

  // owner's accumulator (fp32, at dst, which is byte `dst_offset` of allocation
  // `alloc_id`) += src. Chunks are locked in owner's control block so concurrent
  // accumulations from several ranks into the same owner never lose updates.
  void accumulate_into(int owner, uintptr_t dst, int64_t alloc_id, size_t dst_offset,
                       uintptr_t src, int dtype, size_t count) const;
  // Arrive at barrier `epoch` and wait for every same-host peer to arrive too.
  void barrier(uint64_t epoch) const;
  // Deterministic mode, the staged adds of sync `epoch` (1, 2, ...). Owner o's turn
  // counter walks world + 1 steps per epoch, from (epoch - 1) * (world + 1):
  //   step 0 -> 1: o itself opens it (open_turns), once every write o made before
  //                entering sync `epoch` is complete;
  //   step 1 + r -> 2 + r: source rank r adds its staged contribution into o
  //                (take_turn ... pass_turn).
  // So the adds reach o in source rank order and only after o's own writes (zeroing,
  // clipping, the optimizer step): a source never read-modify-writes o's accumulator
  // while o itself may still write it.
  // open_turns waits until every source finished epoch - 1 at this rank, then opens.
  void open_turns(uint64_t epoch) const;
  // Wait until it is this rank's turn at owner in `epoch` (owner opened, lower ranks done).
  void take_turn(int owner, uint64_t epoch) const;
  // This rank's adds into owner for `epoch` are complete: hand the turn to the next rank.
  void pass_turn(int owner, uint64_t epoch) const;
  // Throws PeerError if a same-host peer's process is gone. The process table is read at
  // most once per kLivenessPeriodS per peer (a look costs ~10 us, more than a small get);
  // between looks a peer counts as alive.
  void check_peer(int peer, const char* what) const;

 private:
  ControlBlock* control(int r) const {
    return reinterpret_cast<ControlBlock*>(controls_[r]->address());
  }
  std::string describe(int peer) const;
  uint64_t turn_base(uint64_t epoch) const;
  // Wait until owner's turn counter equals value; `waiting_for` names the step.
  void wait_turn(int owner, uint64_t value, const char* waiting_for) const;
  void lock_chunk(int owner, uint32_t index, double deadline) const;
  void unlock_chunk(int owner, uint32_t index) const;

  int rank_;
  std::vector<std::shared_ptr<Segment>> controls_;
  std::vector<int64_t> global_ranks_;
  std::vector<int64_t> pids_;
  // per peer: steady-clock nanoseconds before which check_peer need not look again
  std::unique_ptr<std::atomic<int64_t>[]> next_liveness_check_ns_;
  double timeout_s_;
  int num_threads_;
};

}  // namespace odc
