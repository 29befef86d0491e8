// The process group over OpenMPI (builds with libopenmpi-dev). Only non-blocking MPI calls,
// finished by wait_requests, which polls them against the deadline: a blocking MPI call would
// wait forever on a rank that died without mpirun noticing (a hung machine, a lost link).
// the C API only (OpenMPI's and MPICH's mpi.h also pull in the deprecated C++ bindings)
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <malloc.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "core/common.h"
#include "dist/group.h"

namespace tq::dist {

Group& Group::world() {
  // a static (not leaked): its destructor calls MPI_Finalize at exit, which mpirun expects
  static Group w;
  static Group* g = [] {
    const Launch l = launched();
    if (l.size > 1) {
      // MPI's collectives allocate and free temporary buffers as large as their messages on
      // every call; glibc hands such blocks back to the system when freed, so each call
      // faulted its pages in again: a 64 MiB all-reduce took 207 ms, 18 ms with the blocks
      // kept (2 ranks, this project's 2-core VM). Kept: blocks up to 32 MiB (glibc's largest
      // threshold) come from the heap, which is not trimmed.
      mallopt(M_MMAP_THRESHOLD, 32 << 20);
      mallopt(M_TRIM_THRESHOLD, INT_MAX);
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        throw Error("MPI_Init_thread failed: is this process started by OpenMPI's mpirun?");
      // errors come back as codes (the default ends the job without a word of ours)
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      MPI_Comm_rank(MPI_COMM_WORLD, &w.rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &w.size_);
      w.mpi_ = true;
    }
    return &w;
  }();
  return *g;
}

Group::~Group() {
  if (mpi_) MPI_Finalize();
}

void Group::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

bool Group::test_requests(void* requests, int n) {
  int done = 0;
  if (MPI_Testall(n, static_cast<MPI_Request*>(requests), &done, MPI_STATUSES_IGNORE) !=
      MPI_SUCCESS) {
    std::fprintf(stderr, "error: rank %d: an MPI collective failed (a rank has ended?)\n", rank_);
    abort(1);
  }
  return done != 0;
}

void Group::wait_requests(void* requests, int n, const char* what) {
  wait_until([&] { return test_requests(requests, n); }, what);
}

void Group::barrier(const char* what) {
  if (!mpi_) return;
  MPI_Request r;
  MPI_Ibarrier(MPI_COMM_WORLD, &r);
  wait_requests(&r, 1, what);
}

void Group::broadcast(void* p, size_t bytes, int root, const char* what) {
  if (!mpi_) return;
  for (size_t at = 0; at < bytes; at += INT_MAX / 2) {
    MPI_Request r;
    MPI_Ibcast(static_cast<char*>(p) + at, int(std::min<size_t>(bytes - at, INT_MAX / 2)), MPI_BYTE,
               root, MPI_COMM_WORLD, &r);
    wait_requests(&r, 1, what);
  }
}

void Group::allgather(const void* in, void* out, size_t bytes, const char* what) {
  if (!mpi_) {
    std::memcpy(out, in, bytes);
    return;
  }
  if (bytes > size_t(INT_MAX)) throw Error("allgather of more than 2 GiB a rank");
  MPI_Request r;
  MPI_Iallgather(in, int(bytes), MPI_BYTE, out, int(bytes), MPI_BYTE, MPI_COMM_WORLD, &r);
  wait_requests(&r, 1, what);
}

void Group::gather_ranges(const float* mine, float* all, const std::vector<size_t>& off, int root,
                          const char* what) {
  const size_t lo = off[size_t(rank_)], hi = off[size_t(rank_) + 1];
  if (rank_ == root) std::memcpy(all + lo, mine, (hi - lo) * sizeof(float));
  if (!mpi_) return;
  // point to point, in pieces of at most 2^28 floats (MPI's counts are ints), all posted, then
  // waited for (MPI keeps the order of one pair's messages of a tag)
  constexpr size_t kPiece = size_t(1) << 28;
  std::vector<MPI_Request> rq;
  const auto pieces = [&](int r, auto post) {
    const size_t n = off[size_t(r) + 1] - off[size_t(r)];
    for (size_t at = 0; at < n; at += kPiece) post(at, int(std::min(kPiece, n - at)));
  };
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r)
      if (r != root)
        pieces(r, [&](size_t at, int k) {
          rq.emplace_back();
          MPI_Irecv(all + off[size_t(r)] + at, k, MPI_FLOAT, r, 7, MPI_COMM_WORLD, &rq.back());
        });
  } else {
    pieces(rank_, [&](size_t at, int k) {
      rq.emplace_back();
      MPI_Isend(mine + at, k, MPI_FLOAT, root, 7, MPI_COMM_WORLD, &rq.back());
    });
  }
  if (!rq.empty()) wait_requests(rq.data(), int(rq.size()), what);
}

namespace {

// Host arrays (the CPU backend): MPI_Iallreduce in pieces, and a broadcast from each rank for
// the gather.
class MpiArrays final : public ArrayComm {
 public:
  explicit MpiArrays(Group& g) : g_(g) {}
  void start_allreduce(float* p, size_t n) override {
    // in pieces of 4 MiB: 2 ranks reduce 128 MiB at 3.1 GB/s so, 2.7 in 16 MiB pieces
    // (tq_allreduce_bench, this project's 2-core VM)
    constexpr size_t kPiece = size_t(1) << 20;
    for (size_t at = 0; at < n; at += kPiece) {
      rq_.emplace_back();
      MPI_Iallreduce(MPI_IN_PLACE, p + at, int(std::min(kPiece, n - at)), MPI_FLOAT, MPI_SUM,
                     MPI_COMM_WORLD, &rq_.back());
    }
  }
  void start_allgather(void* p, const std::vector<size_t>& off) override {
    // one broadcast from each rank of its range (MPI_Iallgatherv's displacements are ints), in
    // pieces of at most 2^30 bytes
    constexpr size_t kPiece = size_t(1) << 30;
    char* base = static_cast<char*>(p);
    for (int r = 0; r < g_.size(); ++r)
      for (size_t at = off[size_t(r)]; at < off[size_t(r) + 1]; at += kPiece) {
        rq_.emplace_back();
        MPI_Ibcast(base + at, int(std::min(kPiece, off[size_t(r) + 1] - at)), MPI_BYTE, r,
                   MPI_COMM_WORLD, &rq_.back());
      }
  }
  void progress() override {
    if (!rq_.empty() && g_.test_requests(rq_.data(), int(rq_.size()))) rq_.clear();
  }
  void wait(const char* what) override {
    if (!rq_.empty()) g_.wait_requests(rq_.data(), int(rq_.size()), what);
    rq_.clear();
  }

 private:
  Group& g_;
  std::vector<MPI_Request> rq_;
};

}  // namespace

std::unique_ptr<ArrayComm> host_array_comm(Group& g) {
  return std::make_unique<MpiArrays>(g);
}

}  // namespace tq::dist
