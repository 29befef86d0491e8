// Data-parallel training's process group (docs/distributed.md): the ranks of an `mpirun` job
// (OpenMPI), or this process alone. Every collective here waits with a deadline, so that a
// rank that died or hangs ends the others with one line instead of a hang.
//
// Two kinds of collectives:
//  - Group: small host-memory ones (the configuration check, each step's losses, validation
//    losses, the checkpoint's gather to rank 0), over MPI;
//  - ArrayComm: the backend's arrays (gradient buckets, ZeRO-1's parameter gather), started
//    without waiting so that they overlap the backward pass: MPI on host memory for the CPU
//    backend, NCCL on device memory for CUDA (src/dist/nccl.cpp).
#pragma once
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tq {
struct Ops;
}

namespace tq::dist {

// What mpirun told this process (its environment), before MPI is started: rank 0 of 1 where
// it was not launched by mpirun.
struct Launch {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks on this machine
};
Launch launched();

class Group {
 public:
  // The job's group: MPI started where launched with more than one rank (one thread calls
  // MPI: MPI_THREAD_FUNNELED), else this process alone. Error where mpirun started several
  // ranks of a build without MPI.
  static Group& world();
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool distributed() const { return size_ > 1; }
  // Seconds a collective may wait for the other ranks before the job is ended (default 300).
  void set_timeout(double seconds) { timeout_ = seconds; }
  double timeout() const { return timeout_; }
  // The flag a stop signal's handler sets (the trainer's): a collective that waits while it
  // holds SIGTERM or SIGINT (mpirun ending the job, a rank having died) ends this rank once
  // the others have not answered for a few seconds more.
  void set_signal_flag(const volatile std::sig_atomic_t* f) { signal_ = f; }

  // Host collectives; each waits (deadline), `what` names it in the timeout's line.
  void barrier(const char* what);
  void broadcast(void* p, size_t bytes, int root, const char* what);
  // out [size][bytes]: every rank's `in`, in rank order
  void allgather(const void* in, void* out, size_t bytes, const char* what);
  // rank r's host floats [off[r], off[r+1]) into root's `all` at the same offsets (all: only
  // root's is written; mine: this rank's part)
  void gather_ranges(const float* mine, float* all, const std::vector<size_t>& off, int root,
                     const char* what);

  // Ends every rank of the job now (MPI_Abort), after this rank printed why.
  [[noreturn]] void abort(int code);

  // Polls done() until it holds, with the deadline: past the timeout, or 5 s after a SIGTERM
  // or SIGINT reached this rank, prints one line naming `what`, calls on_end (if any) and ends
  // the job.
  void wait_until(const std::function<bool()>& done, const char* what,
                  const std::function<void()>& on_end = {});
  // (MPI internals, for dist/*.cpp) wait_until the n requests are done
  void wait_requests(void* requests, int n, const char* what);
  // the started, not yet finished requests are polled (progress without waiting)
  bool test_requests(void* requests, int n);

  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group();

 private:
  Group() = default;
  int rank_ = 0, size_ = 1;
  double timeout_ = 300;
  bool mpi_ = false;
  const volatile std::sig_atomic_t* signal_ = nullptr;
  bool signalled_ = false;  // since signalled_at_
  std::chrono::steady_clock::time_point signalled_at_;
};

// The even split of n elements over `size` ranks: rank r owns [off[r], off[r+1]), multiples
// of `align` elements but the last.
std::vector<size_t> split_ranges(size_t n, int size, size_t align = 64);

// Collectives over the backend's arrays. start_* return at once (the work goes on while the
// caller computes; progress() lets it advance); wait() ends every started one.
class ArrayComm {
 public:
  virtual ~ArrayComm() = default;
  // p[0, n) := the sum over ranks of p[0, n) (fp32, in place)
  virtual void start_allreduce(float* p, size_t n) = 0;
  // rank r's bytes [off[r], off[r+1]) of p to every rank (in place)
  virtual void start_allgather(void* p, const std::vector<size_t>& off) = 0;
  virtual void progress() = 0;
  virtual void wait(const char* what) = 0;
};
// For the CPU backend (host arrays, MPI) and for CUDA (device arrays, NCCL, its id sent by
// MPI): by ops.name.
std::unique_ptr<ArrayComm> array_comm(Group& g, const Ops& ops);

}  // namespace tq::dist
