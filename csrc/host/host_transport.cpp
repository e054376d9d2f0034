#include "host_transport.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>

namespace odc {
namespace {

constexpr size_t kMinBytesPerThread = size_t(2) << 20;
constexpr double kLivenessPeriodS = 0.005;
constexpr size_t kLockChunkElems = size_t(64) << 10;  // 256 KiB of fp32 per lock

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

size_t page_round(size_t nbytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return std::max(page, (nbytes + page - 1) / page * page);
}

std::string errno_text(const std::string& what, const std::string& name) {
  return what + " '" + name + "' failed: " + std::strerror(errno);
}

// Polite spin: pause, then yield, then sleep, so waiting ranks do not starve the ranks
// they wait for on a machine with fewer cores than processes.
class Backoff {
 public:
  void pause() {
    ++spins_;
    if (spins_ < 256) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else if (spins_ < 2048) {
      sched_yield();
    } else {
      timespec ts{0, 20000};
      nanosleep(&ts, nullptr);
    }
  }

 private:
  uint64_t spins_ = 0;
};

int threads_for(size_t nbytes, int num_threads) {
  const size_t by_size = std::max<size_t>(1, nbytes / kMinBytesPerThread);
  return static_cast<int>(std::min<size_t>(std::max(1, num_threads), by_size));
}

// Runs body(worker) on `workers` threads (the caller is worker 0) and rethrows the first
// exception any of them raised.
template <typename Body>
void run_parallel(int workers, Body body) {
  if (workers <= 1) {
    body(0);
    return;
  }
  std::vector<std::exception_ptr> errors(workers);
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (int w = 1; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try { body(w); } catch (...) { errors[w] = std::current_exception(); }
    });
  }
  try { body(0); } catch (...) { errors[0] = std::current_exception(); }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

// ---------------------------------------------------------------- Segment

std::shared_ptr<Segment> Segment::create(const std::string& name, size_t nbytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error(errno_text("shm_open(create)", name));
  const size_t mapped = page_round(nbytes);
  if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    const std::string msg = errno_text("ftruncate", name);
    close(fd);
    shm_unlink(name.c_str());
    throw std::runtime_error(msg);
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    const std::string msg = errno_text("mmap", name);
    shm_unlink(name.c_str());
    throw std::runtime_error(msg);
  }
  return std::shared_ptr<Segment>(new Segment(name, base, nbytes, mapped, true));
}

std::shared_ptr<Segment> Segment::open(const std::string& name, size_t nbytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error(errno_text("shm_open(open)", name));
  const size_t mapped = page_round(nbytes);
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < mapped) {
    close(fd);
    throw std::runtime_error("segment '" + name + "' is smaller than the expected " +
                             std::to_string(mapped) + " bytes");
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) throw std::runtime_error(errno_text("mmap", name));
  return std::shared_ptr<Segment>(new Segment(name, base, nbytes, mapped, false));
}

void Segment::unlink() {
  if (owner_ && !unlinked_) {
    shm_unlink(name_.c_str());  // ENOENT (already removed by a cleaner) is fine
    unlinked_ = true;
  }
}

Segment::~Segment() {
  unlink();
  munmap(base_, mapped_);
}

// ---------------------------------------------------------------- free functions

bool pid_alive(int64_t pid) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  // A killed child that its parent has not reaped yet is a zombie: dead for our purposes.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;  // no procfs: trust kill()
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

void copy_bytes(uintptr_t dst, uintptr_t src, size_t nbytes, int num_threads, bool streaming) {
  const int workers = threads_for(nbytes, num_threads);
  const size_t per = (nbytes + workers - 1) / workers;
  run_parallel(workers, [&](int w) {
    const size_t begin = std::min(nbytes, per * w), end = std::min(nbytes, begin + per);
    if (end > begin)
      fast_copy(reinterpret_cast<void*>(dst + begin), reinterpret_cast<const void*>(src + begin),
                end - begin, streaming);
  });
}

void accumulate_local(uintptr_t dst, uintptr_t src, int dtype, size_t count, int num_threads) {
  const size_t elem = dtype_size(dtype);
  const int workers = threads_for(count * 4, num_threads);
  const size_t per = (count + workers - 1) / workers;
  run_parallel(workers, [&](int w) {
    const size_t begin = std::min(count, per * w), end = std::min(count, begin + per);
    if (end > begin)
      add_into_fp32(reinterpret_cast<float*>(dst) + begin,
                reinterpret_cast<const void*>(src + begin * elem), dtype, end - begin);
  });
}

// ---------------------------------------------------------------- HostGroup

HostGroup::HostGroup(int rank, std::vector<std::shared_ptr<Segment>> peers_control,
                     std::vector<int64_t> global_ranks, std::vector<int64_t> pids,
                     double timeout_s, int num_threads)
    : rank_(rank), controls_(std::move(peers_control)), global_ranks_(std::move(global_ranks)),
      pids_(std::move(pids)), timeout_s_(timeout_s), num_threads_(std::max(1, num_threads)) {
  const size_t world = controls_.size();
  if (rank < 0 || static_cast<size_t>(rank) >= world || global_ranks_.size() != world ||
      pids_.size() != world)
    throw std::invalid_argument("HostGroup: rank/world/global_ranks/pids do not agree");
  if (!controls_[rank]) throw std::invalid_argument("HostGroup: own control segment missing");
  next_liveness_check_ns_.reset(new std::atomic<int64_t>[world]);
  for (size_t r = 0; r < world; ++r) next_liveness_check_ns_[r].store(0);
  for (size_t r = 0; r < world; ++r) {
    if (!controls_[r]) continue;
    if (controls_[r]->size() < sizeof(ControlBlock))
      throw std::invalid_argument("HostGroup: control segment too small");
    if (control(static_cast<int>(r))->magic != kControlMagic)
      throw std::runtime_error("HostGroup: control segment of rank " + std::to_string(r) +
                               " is not initialised");
  }
}

std::string HostGroup::describe(int peer) const {
  std::ostringstream out;
  out << "peer group rank " << peer << " (global rank " << global_ranks_[peer] << ", pid "
      << pids_[peer] << ")";
  return out.str();
}

void HostGroup::check_peer(int peer, const char* what) const {
  if (peer == rank_) return;
  const int64_t now_ns = static_cast<int64_t>(now_s() * 1e9);
  std::atomic<int64_t>& next = next_liveness_check_ns_[peer];
  if (now_ns < next.load(std::memory_order_relaxed)) return;
  next.store(now_ns + static_cast<int64_t>(kLivenessPeriodS * 1e9), std::memory_order_relaxed);
  if (!pid_alive(pids_[peer]))
    throw PeerError("odc transport: " + describe(peer) + " died while rank " +
                    std::to_string(rank_) + " was waiting for it (" + what + ")");
}

void HostGroup::lock_chunk(int owner, uint32_t index, double deadline) const {
  std::atomic<uint32_t>& word = control(owner)->locks[index];
  const uint32_t mine = static_cast<uint32_t>(rank_) + 1;
  Backoff backoff;
  double next_check = now_s() + 0.01;
  for (;;) {
    uint32_t expected = 0;
    if (word.load(std::memory_order_relaxed) == 0 &&
        word.compare_exchange_weak(expected, mine, std::memory_order_acquire))
      return;
    backoff.pause();
    const double now = now_s();
    if (now < next_check) continue;
    next_check = now + 0.01;
    const uint32_t holder = word.load(std::memory_order_relaxed);
    if (holder == 0) continue;
    check_peer(static_cast<int>(holder) - 1, "accumulate lock");
    if (now > deadline)
      throw PeerError("odc transport: rank " + std::to_string(rank_) +
                      " timed out after " + std::to_string(timeout_s_) +
                      " s waiting for an accumulate lock held by " +
                      describe(static_cast<int>(holder) - 1));
  }
}

void HostGroup::unlock_chunk(int owner, uint32_t index) const {
  control(owner)->locks[index].store(0, std::memory_order_release);
}

void HostGroup::accumulate_into(int owner, uintptr_t dst, int64_t alloc_id, size_t dst_offset,
                                uintptr_t src, int dtype, size_t count) const {
  if (owner < 0 || owner >= world_size() || !controls_[owner])
    throw std::invalid_argument("accumulate_into: owner " + std::to_string(owner) +
                                " is not on this host");
  if (dst_offset % 4 != 0) throw std::invalid_argument("accumulate_into: misaligned fp32 offset");
  if (count == 0) return;
  const size_t elem = dtype_size(dtype);
  // Lock chunks are aligned to absolute element indices of the allocation, so two ranks
  // touching the same element always take the same lock whatever views they pass.
  const size_t first = dst_offset / 4;
  const size_t first_chunk = first / kLockChunkElems;
  const size_t last_chunk = (first + count - 1) / kLockChunkElems;
  const size_t num_chunks = last_chunk - first_chunk + 1;
  const int workers =
      static_cast<int>(std::min<size_t>(threads_for(count * 4, num_threads_), num_chunks));
  const double deadline = now_s() + timeout_s_;
  run_parallel(workers, [&](int w) {
    for (size_t c = w; c < num_chunks; c += workers) {
      const size_t chunk = first_chunk + c;
      const size_t begin = std::max(first, chunk * kLockChunkElems) - first;
      const size_t end = std::min(first + count, (chunk + 1) * kLockChunkElems) - first;
      const uint64_t key = static_cast<uint64_t>(alloc_id) * 0x9E3779B97F4A7C15ULL + chunk;
      const uint32_t index = static_cast<uint32_t>((key ^ (key >> 29)) % kNumLocks);
      lock_chunk(owner, index, deadline);
      add_into_fp32(reinterpret_cast<float*>(dst) + begin,
                reinterpret_cast<const void*>(src + begin * elem), dtype, end - begin);
      unlock_chunk(owner, index);
    }
  });
}

void HostGroup::barrier(uint64_t epoch) const {
  control(rank_)->sync_epoch.store(epoch, std::memory_order_release);
  const double deadline = now_s() + timeout_s_;
  for (int peer = 0; peer < world_size(); ++peer) {
    if (peer == rank_ || !controls_[peer]) continue;
    Backoff backoff;
    double next_check = now_s() + 0.01;
    while (control(peer)->sync_epoch.load(std::memory_order_acquire) < epoch) {
      backoff.pause();
      const double now = now_s();
      if (now < next_check) continue;
      next_check = now + 0.01;
      check_peer(peer, "sync");
      if (now > deadline) {
        std::string missing;
        for (int p = 0; p < world_size(); ++p)
          if (p != rank_ && controls_[p] &&
              control(p)->sync_epoch.load(std::memory_order_acquire) < epoch)
            missing += (missing.empty() ? "" : "; ") + describe(p);
        throw PeerError("odc transport: rank " + std::to_string(rank_) + " timed out after " +
                        std::to_string(timeout_s_) + " s in sync " + std::to_string(epoch) +
                        "; not arrived: " + missing);
      }
    }
  }
}

uint64_t HostGroup::turn_base(uint64_t epoch) const {
  if (epoch == 0) throw std::invalid_argument("deterministic turns: epochs start at 1");
  return (epoch - 1) * (static_cast<uint64_t>(world_size()) + 1);
}

void HostGroup::wait_turn(int owner, uint64_t value, const char* waiting_for) const {
  if (owner < 0 || owner >= world_size() || !controls_[owner])
    throw std::invalid_argument("deterministic turns: owner " + std::to_string(owner) +
                                " is not on this host");
  std::atomic<uint64_t>& turn = control(owner)->turn;
  const uint64_t steps = static_cast<uint64_t>(world_size()) + 1;
  const double deadline = now_s() + timeout_s_;
  Backoff backoff;
  double next_check = now_s() + 0.01;
  uint64_t seen;
  while ((seen = turn.load(std::memory_order_acquire)) != value) {
    if (seen > value)
      throw std::runtime_error("odc transport: deterministic turn counter of owner " +
                               std::to_string(owner) + " ran past " + std::to_string(value) +
                               " (ranks called sync a different number of times?)");
    backoff.pause();
    const double now = now_s();
    if (now < next_check) continue;
    next_check = now + 0.01;
    // step 0 of an epoch waits for the owner to open it, step 1 + r for source r
    const uint64_t step = seen % steps;
    const int holder = step == 0 ? owner : static_cast<int>(step - 1);
    check_peer(holder, waiting_for);
    if (now > deadline)
      throw PeerError("odc transport: rank " + std::to_string(rank_) + " timed out after " +
                      std::to_string(timeout_s_) + " s waiting for " + waiting_for +
                      " at owner " + std::to_string(owner) + "; the turn is held by " +
                      describe(holder) +
                      (step == 0 ? " (it has not entered this sync)" : ""));
  }
}

void HostGroup::open_turns(uint64_t epoch) const {
  const uint64_t base = turn_base(epoch);
  wait_turn(rank_, base, "the previous sync's accumulate turns");
  // release: the owner's writes before this point happen-before every source's adds
  control(rank_)->turn.store(base + 1, std::memory_order_release);
}

void HostGroup::take_turn(int owner, uint64_t epoch) const {
  wait_turn(owner, turn_base(epoch) + 1 + static_cast<uint64_t>(rank_),
            "its deterministic accumulate turn");
}

void HostGroup::pass_turn(int owner, uint64_t epoch) const {
  control(owner)->turn.store(turn_base(epoch) + 2 + static_cast<uint64_t>(rank_),
                             std::memory_order_release);
}

}  // namespace odc
