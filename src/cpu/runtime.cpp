#include "cpu/runtime.h"

#include <fcntl.h>
#include <omp.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>

#include "cpu/layers.h"

namespace tq::cpu {
namespace {

bool g_spin_set = false;
char g_spin_entry[] = "GOMP_SPINCOUNT=10000";
static_assert(kSpinCount == 10000, "g_spin_entry spells kSpinCount");
char* g_lent = nullptr;  // the entry of the environment that g_spin_entry stands in for

// Whether an environment entry is one that no library reads while it starts: the shell's
// bookkeeping, which tiny-qwen3 and its libraries never look at.
bool lendable(const char* e) {
  for (const char* name : {"_=", "OLDPWD=", "SHLVL=", "PWD=", "HOSTNAME=", "MAIL="})
    if (std::strncmp(e, name, std::strlen(name)) == 0) return true;
  return false;
}

// Runs from .preinit_array, before any library's constructor. glibc's own start-up sets the
// environment back to the array the process started with (a putenv here is lost), and libgomp
// reads its settings in its constructor, after that. So GOMP_SPINCOUNT goes into that array in
// place of a lendable entry, and restore_lent_entry puts that entry back before main.
// (getenv is not ready yet here: the array is read directly.)
void set_spin_count(int, char**, char** envp) {
  if (!envp) return;
  for (char** e = envp; *e; ++e)
    if (std::strncmp(*e, "OMP_WAIT_POLICY=", 16) == 0 ||
        std::strncmp(*e, "GOMP_SPINCOUNT=", 15) == 0)
      return;  // the user's setting stands
  for (char** e = envp; *e; ++e)
    if (lendable(*e)) {
      g_lent = *e;
      *e = g_spin_entry;
      g_spin_set = true;
      return;
    }
}

// Runs as the executable's constructor: after every shared library's, before main.
__attribute__((constructor)) void restore_lent_entry() {
  if (!g_lent) return;
  for (char** e = environ; e && *e; ++e)
    if (*e == g_spin_entry) {
      *e = g_lent;
      break;
    }
  g_lent = nullptr;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A small /proc file into buf (NUL-terminated); false if it cannot be read.
bool read_small(const char* path, char* buf, size_t size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t got = 0;
  while (got + 1 < size) {
    const ssize_t r = ::read(fd, buf + got, size - 1 - got);
    if (r <= 0) break;
    got += size_t(r);
  }
  ::close(fd);
  buf[got] = '\0';
  return got > 0;
}

// Seconds thread tid has waited on a run queue since it started (schedstat's second field).
bool run_queue_wait(int tid, double& seconds) {
  char path[64], buf[128];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
  unsigned long long run = 0, wait = 0;
  if (!read_small(path, buf, sizeof buf) || std::sscanf(buf, "%llu %llu", &run, &wait) != 2)
    return false;
  seconds = double(wait) * 1e-9;
  return true;
}

// Idle seconds (idle + iowait) and busy seconds (the other states, steal excluded) summed over
// the CPUs this process may run on, from /proc/stat.
bool cpu_seconds(double& idle, double& busy) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return false;
  std::FILE* f = std::fopen("/proc/stat", "re");
  if (!f) return false;
  const double tick = 1.0 / double(sysconf(_SC_CLK_TCK));
  char line[512];
  bool any = false;
  idle = busy = 0;
  while (std::fgets(line, sizeof line, f)) {
    int cpu = -1;
    unsigned long long user, nice, sys, idl, iow, irq, sirq;
    if (std::sscanf(line, "cpu%d %llu %llu %llu %llu %llu %llu %llu", &cpu, &user, &nice, &sys,
                    &idl, &iow, &irq, &sirq) != 8)
      continue;
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &mask)) continue;
    idle += double(idl + iow) * tick;
    busy += double(user + nice + sys + irq + sirq) * tick;
    any = true;
  }
  std::fclose(f);
  return any;
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

// Placed in the executable's .preinit_array, which the dynamic loader runs before the
// constructors of the shared libraries (libgomp reads GOMP_SPINCOUNT in its constructor).
__attribute__((section(".preinit_array"),
               used)) static void (*preinit_spin)(int, char**, char**) = set_spin_count;

bool spin_count_set() {
  return g_spin_set;
}

ThreadPolicy::ThreadPolicy(int max_threads) : max_(std::max(1, max_threads)) {}

int ThreadPolicy::next(int n, const LoadSample& s, double now) {
  if (!(s.wall > 0)) return n;
  double worst = 0, lost = 0;
  for (double w : s.waits) {
    worst = std::max(worst, w / s.wall);
    lost += w / s.wall;
  }
  if (n > 1 && worst >= kShedWait) {
    // A thread of the team was kept off its core: every barrier of the step waited for it.
    // Shed the cores' worth the team lost (at least one thread). A grow shed again soon after
    // doubles the wait before the next grow.
    backoff_ = now - last_grow_ < 4 * backoff_ ? std::min(2 * backoff_, kMaxBackoff) : kBackoff;
    last_change_ = now;
    return std::max(1, n - std::max(1, int(std::lround(lost))));
  }
  if (n < max_ && now - last_change_ >= backoff_ && !std::isnan(s.idle_cpus) &&
      (s.idle_cpus < 0 || s.idle_cpus >= kGrowIdle)) {
    // Cores stood idle (or, where idle time cannot be read, a probe after the back-off).
    last_change_ = last_grow_ = now;
    const int more = s.idle_cpus < 0 ? 1 : std::max(1, int(s.idle_cpus + 0.25));
    return std::min(max_, n + more);
  }
  return n;
}

ThreadGovernor::ThreadGovernor(int max_threads)
    : max_(std::max(1, max_threads)), current_(max_), policy_(max_), steps_at_(size_t(max_) + 1) {
  set_threads(current_);
  debug_ = std::getenv("TQ_GOVERNOR_DEBUG") != nullptr;
  double w;
  active_ = max_ > 1 && run_queue_wait(int(syscall(SYS_gettid)), w);
  if (!active_) return;
  start_ = now_s();
  double busy;
  if (cpu_seconds(idle0_, busy)) busy0_ = busy, cpu0_ = process_cpu_seconds();
  idle_t0_ = start_;
}

void ThreadGovernor::begin() {
  if (!active_) return;
  // Other processes' load over the set-up (init or loading ran on every thread meanwhile): the
  // CPUs' busy time less this process's. Enough of it that one core is not ours to take starts
  // the first step with fewer threads, rather than stall it.
  const double t = now_s();
  double idle, busy;
  if (idle0_ >= 0 && t - idle_t0_ >= 0.05 && cpu_seconds(idle, busy)) {
    const double others = ((busy - busy0_) - (process_cpu_seconds() - cpu0_)) / (t - idle_t0_);
    const int n = std::clamp(int(std::floor(double(max_) - others + 0.3)), 1, max_);
    if (n < current_) {
      current_ = n;
      set_threads(n);
      policy_.changed(t - start_);
    }
  }
  collect_team();
  restart_idle_window();  // with the first step
}

void ThreadGovernor::restart_idle_window() {
  double busy;
  if (!cpu_seconds(idle0_, busy)) idle0_ = -1;
  idle_t0_ = now_s();
}

void ThreadGovernor::collect_team() {
  tids_.assign(size_t(current_), 0);
  if (current_ > 1) {
#pragma omp parallel num_threads(current_)
    tids_[size_t(omp_get_thread_num())] = int(syscall(SYS_gettid));
  } else {
    tids_[0] = int(syscall(SYS_gettid));
  }
  wait0_.assign(tids_.size(), 0);
  for (size_t i = 0; i < tids_.size(); ++i) run_queue_wait(tids_[i], wait0_[i]);
  t0_ = now_s();
}

void ThreadGovernor::after_step() {
  ++steps_at_[size_t(current_)];
  if (!active_) return;
  const double t = now_s();
  LoadSample s;
  s.wall = t - t0_;
  std::vector<double> wait(tids_.size(), 0);
  for (size_t i = 0; i < tids_.size(); ++i) {
    if (!run_queue_wait(tids_[i], wait[i])) wait[i] = wait0_[i];  // a thread gone: no signal
    s.waits.push_back(std::max(0.0, wait[i] - wait0_[i]));
  }
  if (t - idle_t0_ >= 0.25) {  // /proc/stat counts in ticks (10 ms): read over a longer window
    double idle, busy;
    if (cpu_seconds(idle, busy) && idle0_ >= 0) {
      s.idle_cpus = (idle - idle0_) / (t - idle_t0_);
      idle0_ = idle;
    } else {
      s.idle_cpus = -1;  // not shown: probe after the back-off
    }
    idle_t0_ = t;
  }
  const int n = policy_.next(current_, s, t - start_);
  if (debug_) {
    std::fprintf(stderr, "governor: n=%d wall=%.1fms waits=", current_, s.wall * 1e3);
    for (double w : s.waits) std::fprintf(stderr, "%.1f ", w * 1e3);
    std::fprintf(stderr, "idle=%.2f -> %d\n", s.idle_cpus, n);  // (nan: not read this step)
  }
  if (n != current_) {
    current_ = n;
    set_threads(n);
    collect_team();
    restart_idle_window();  // at the new count
  } else {
    wait0_ = wait;
    t0_ = now_s();
  }
}

std::string ThreadGovernor::summary() const {
  if (steps_at_[size_t(max_)] == std::accumulate(steps_at_.begin(), steps_at_.end(), int64_t(0)))
    return "";  // every step at the most it may use
  std::string r;
  for (int n = max_; n >= 1; --n) {
    const int64_t k = steps_at_[size_t(n)];
    if (!k) continue;
    if (!r.empty()) r += ", ";
    r += std::to_string(n) + (r.empty() ? (n == 1 ? " thread" : " threads") : "") + " for " +
         std::to_string(k) + (k == 1 ? " step" : " steps");
  }
  return r;
}

// MemAvailable from /proc/meminfo; infinity where it cannot be read
double available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  double kb;
  while (std::getline(f, line))
    if (std::sscanf(line.c_str(), "MemAvailable: %lf kB", &kb) == 1) return kb * 1024;
  return std::numeric_limits<double>::infinity();
}

}  // namespace tq::cpu
