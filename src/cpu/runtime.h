// How the CPU backend's threads behave when other processes take cores.
//
// Two measures, both measured on a 2-core machine with one busy loop started from another
// terminal (its own autogroup), the walkthrough step (W1):
//  - OpenMP's idle threads spin briefly, then sleep. libgomp spins ~300,000 times by default
//    before it sleeps: a thread waiting at a barrier then burns the share of the core that the
//    thread it waits for needs, and W1 at 2 threads took 1,380 ms a step against 66 ms idle and
//    127 ms at one thread. Spinning 10,000 times took it to ~200 ms with the idle step unchanged
//    (3,000: ~140 ms, but idle fp32 steps measured slower). libgomp reads its settings once,
//    in its constructor, so the executable hands it GOMP_SPINCOUNT=kSpinCount from its
//    .preinit_array (which runs before any library's constructor) unless OMP_WAIT_POLICY or
//    GOMP_SPINCOUNT is set, and gives the environment back as it was before main
//    (runtime.cpp says how).
//  - A training run without a fixed --threads chooses its thread count between steps from
//    what the last step measured (ThreadGovernor): when a thread of the team waited to be
//    scheduled for a fifth of the step or more, it sheds threads; when the CPUs it may run on
//    stood idle for most of a core, it takes one back. The count never changes a result
//    except fp32 dx taken from oneDNN (docs/numerics.md).
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tq::cpu {

constexpr int kSpinCount = 10000;
// Whether this process handed libgomp GOMP_SPINCOUNT (false: the user's OMP_WAIT_POLICY or
// GOMP_SPINCOUNT stands, or the environment had no entry to lend, see runtime.cpp).
bool spin_count_set();

// What the last step saw, for ThreadPolicy.
struct LoadSample {
  double wall = 0;            // seconds since the last sample
  std::vector<double> waits;  // seconds each thread of the team waited on a run queue
  // cores' worth of idle time on this process's CPUs over a window ending now; NaN: no
  // reading this step; < 0: the system does not show it (then grow only by probing)
  double idle_cpus = std::numeric_limits<double>::quiet_NaN();
};

// The decision, kept apart from the measuring so that tests can drive it.
class ThreadPolicy {
 public:
  explicit ThreadPolicy(int max_threads);
  // The thread count for the next step, given the current one, what it saw and the time now.
  int next(int current, const LoadSample& s, double now);
  void changed(double now) { last_change_ = now; }  // the count was set otherwise (at the start)

  static constexpr double kShedWait = 0.2;   // a thread waited this share of the step: shed
  static constexpr double kGrowIdle = 0.75;  // this many cores stood idle: take one back
  static constexpr double kBackoff = 0.5;    // seconds after a change before growing again
  static constexpr double kMaxBackoff = 16;  // doubled by each grow that is shed again

 private:
  int max_;
  double backoff_ = kBackoff, last_change_ = -1e30, last_grow_ = -1e30;
};

// Runs ThreadPolicy on the team's scheduler statistics (/proc/self/task/TID/schedstat) and the
// CPUs' idle time (/proc/stat, over at least 0.25 s), and sets the thread count it decides.
class ThreadGovernor {
 public:
  // max_threads: the most it will use (set now). Without schedstat it keeps that count.
  explicit ThreadGovernor(int max_threads);
  void begin();       // call before the first step: starts it with fewer threads under load
  void after_step();  // call between steps: measures, decides, sets
  int threads() const { return current_; }
  bool active() const { return active_; }
  // "" if every step ran at max_threads, else e.g. "2 threads for 3 steps, 1 for 17 steps"
  std::string summary() const;

 private:
  void collect_team();         // the team's thread ids, after each change of its size
  void restart_idle_window();  // idle time counted from now
  int max_, current_;
  bool active_ = false;
  bool debug_ = false;  // TQ_GOVERNOR_DEBUG set: each step's measures and decision on stderr
  ThreadPolicy policy_;
  std::vector<int> tids_;
  std::vector<double> wait0_;  // each thread's run-queue wait at the last sample
  double t0_ = 0, start_ = 0;
  double idle_t0_ = 0;             // when the idle counters were last read
  double idle0_ = -1;              // the idle seconds of this process's CPUs then
  double busy0_ = 0, cpu0_ = 0;    // at construction: their busy seconds, this process's CPU time
  std::vector<int64_t> steps_at_;  // steps run at each count (index: threads)
};

// Host memory a new allocation can take without swapping (MemAvailable), in bytes; infinity
// where the system does not say.
double available_memory_bytes();

}  // namespace tq::cpu
