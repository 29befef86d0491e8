// The CPU runtime under load (src/cpu/runtime.h): OpenMP's short spin, set before libgomp
// starts, and the thread-count policy, driven by made-up measurements.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cpu/layers.h"
#include "cpu/runtime.h"

namespace tq::cpu {
namespace {

LoadSample sample(double wall, std::vector<double> waits, double idle = NAN) {
  LoadSample s;
  s.wall = wall;
  s.waits = std::move(waits);
  s.idle_cpus = idle;
  return s;
}

// What libgomp read at start-up (OMP_DISPLAY_ENV=verbose prints it), for this test binary
// started afresh in the environment `env` (after unsetting the user's wait settings).
std::string spin_count_read(const std::string& env) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "no /proc/self/exe";
  self[n] = '\0';
  const std::string cmd = "env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY " + env +
                          " OMP_DISPLAY_ENV=verbose '" + self + "' --gtest_list_tests 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  pclose(p);
  const size_t at = out.find("GOMP_SPINCOUNT = '");
  if (at == std::string::npos) return "not shown";
  return out.substr(at + 18, out.find('\'', at + 18) - at - 18);
}

TEST(Runtime, OpenMpSpinsBrieflyUnlessTheUserSaidOtherwise) {
  EXPECT_EQ(spin_count_read(""), std::to_string(kSpinCount));
  EXPECT_EQ(spin_count_read("GOMP_SPINCOUNT=77"), "77");
  EXPECT_EQ(spin_count_read("OMP_WAIT_POLICY=passive"), "0");
  // Only the shell's own entries are lent: with none of them, libgomp keeps its default.
  EXPECT_EQ(spin_count_read("-i PATH=/usr/bin:/bin"), "300000");
  EXPECT_EQ(spin_count_read("-i PATH=/usr/bin:/bin SHLVL=3"), std::to_string(kSpinCount));
  // In this process the lent entry is back in place and the setting gone.
  if (spin_count_set()) {
    EXPECT_EQ(std::getenv("GOMP_SPINCOUNT"), nullptr);
  }
}

TEST(Runtime, TheLentEntryIsBackBeforeMain) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  if (std::getenv("TQ_RUNTIME_PRINT_ENV")) {  // the child: print what it sees
    std::printf("SHLVL=[%s] GOMP=[%s]\n", std::getenv("SHLVL") ? std::getenv("SHLVL") : "",
                std::getenv("GOMP_SPINCOUNT") ? std::getenv("GOMP_SPINCOUNT") : "");
    return;
  }
  const std::string cmd =
      std::string("env -i PATH=/usr/bin:/bin SHLVL=7 TQ_RUNTIME_PRINT_ENV=1 '") + self +
      "' --gtest_filter=Runtime.TheLentEntryIsBackBeforeMain 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  pclose(p);
  EXPECT_NE(out.find("SHLVL=[7] GOMP=[]"), std::string::npos) << out;
}

TEST(ThreadPolicy, KeepsEveryThreadWhileTheyRun) {
  ThreadPolicy p(2);
  for (int s = 0; s < 50; ++s)  // waits of a few % and no idle core: nothing to change
    ASSERT_EQ(p.next(2, sample(0.02, {0.0005, 0.001}, s % 10 ? NAN : 0.02), 0.02 * s), 2);
}

TEST(ThreadPolicy, ShedsTheCoresTheTeamLost) {
  ThreadPolicy p2(2);
  EXPECT_EQ(p2.next(2, sample(1.4, {0.65, 0.74}), 1.0), 1);  // both kept off half the time
  ThreadPolicy p4(4);
  EXPECT_EQ(p4.next(4, sample(1.0, {0.5, 0.01, 0.0, 0.02}), 1.0), 3);  // one core taken
  ThreadPolicy p8(8);
  EXPECT_EQ(p8.next(8, sample(1.0, {0.6, 0.5, 0.6, 0.5, 0.6, 0.5, 0.1, 0.0}), 1.0), 5);
  ThreadPolicy p1(2);
  EXPECT_EQ(p1.next(1, sample(1.0, {0.9}), 1.0), 1);        // never below one
  EXPECT_EQ(p1.next(2, sample(1.0, {0.19, 0.0}), 1.0), 2);  // under a fifth: kept
  EXPECT_EQ(p1.next(2, sample(0.0, {0.5, 0.5}), 1.0), 2);   // no time passed: no signal
}

TEST(ThreadPolicy, TakesACoreBackOnlyWhenOneStoodIdleAfterTheBackoff) {
  ThreadPolicy p(4);
  double t = 10;
  ASSERT_EQ(p.next(4, sample(1.0, {0.9, 0.9, 0.0, 0.0}), t), 2);
  EXPECT_EQ(p.next(2, sample(0.1, {0.0, 0.0}, 1.9), t + 0.1), 2);  // within the back-off
  EXPECT_EQ(p.next(2, sample(0.1, {0.0, 0.0}, NAN), t + 1), 2);    // no idle reading
  EXPECT_EQ(p.next(2, sample(0.1, {0.0, 0.0}, 0.5), t + 1), 2);    // half a core: not enough
  EXPECT_EQ(p.next(2, sample(0.1, {0.0, 0.0}, 1.9), t + 1), 4);    // two idle cores
  ThreadPolicy q(2);
  EXPECT_EQ(q.next(1, sample(0.1, {0.0}, 5.0), 3), 2);  // never above the most
  ThreadPolicy r(2);
  EXPECT_EQ(r.next(1, sample(0.1, {0.0}, -1), 3), 2);  // idle time not shown: a probe
}

TEST(ThreadPolicy, AGrowShedAgainDoublesTheWaitUpToItsBound) {
  ThreadPolicy p(2);
  double t = 0;
  ASSERT_EQ(p.next(2, sample(1.0, {0.6, 0.1}), t), 1);
  double wait = ThreadPolicy::kBackoff;
  for (int round = 0; round < 8; ++round) {
    // not before the back-off ...
    ASSERT_EQ(p.next(1, sample(0.1, {0.0}, 1.0), t + wait * 0.9), 1) << round;
    // ... then a grow, which the next step sheds again
    t += wait;
    ASSERT_EQ(p.next(1, sample(0.1, {0.0}, 1.0), t), 2) << round;
    t += 0.25;  // (times in binary fractions: the comparisons are exact)
    ASSERT_EQ(p.next(2, sample(0.25, {0.1, 0.0}), t), 1) << round;
    wait = std::min(2 * wait, ThreadPolicy::kMaxBackoff);
  }
  // A grow that holds for more than four back-offs resets it.
  t += wait;
  ASSERT_EQ(p.next(1, sample(0.1, {0.0}, 1.0), t), 2);
  t += 4 * ThreadPolicy::kMaxBackoff + 1;
  ASSERT_EQ(p.next(2, sample(0.2, {0.1, 0.0}), t), 1);
  EXPECT_EQ(p.next(1, sample(0.1, {0.0}, 1.0), t + ThreadPolicy::kBackoff), 2);
}

TEST(ThreadGovernor, SetsTheCountItDecides) {
  const int before = threads();
  {
    ThreadGovernor g(2);
    EXPECT_EQ(threads(), 2);
    g.begin();
    for (int s = 0; s < 5; ++s) {
      g.after_step();
      ASSERT_GE(g.threads(), 1);
      ASSERT_LE(g.threads(), 2);
      ASSERT_EQ(threads(), g.threads());
    }
    ThreadGovernor one(1);
    EXPECT_FALSE(one.active());  // nothing to shed
    one.after_step();
    EXPECT_EQ(one.summary(), "");
    EXPECT_EQ(threads(), 1);
  }
  set_threads(before);
}

}  // namespace
}  // namespace tq::cpu
