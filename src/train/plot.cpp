#include "train/plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/common.h"
#include "io/file.h"

namespace tq::train {
namespace {

struct Point {
  double tokens, loss;
};

// gnuplot reads a quoted string with \ and " escaped.
std::string quoted(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '\\' || c == '"') r += '\\';
    r += c;
  }
  return r + "\"";
}

}  // namespace

int plot_command(const std::string& metrics, const std::string& out) {
  std::ifstream in(metrics);
  if (!in) throw Error(metrics + ": cannot open (a --metrics file of tiny-qwen3 train)");
  std::vector<Point> train, val;
  std::string line;
  int64_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const auto number = [&](const char* k) {
      return j.is_object() && j.contains(k) && j[k].is_number() ? j[k].get<double>() : NAN;
    };
    const double tokens = number("tokens"), loss = number("loss"), vloss = number("val_loss");
    if (!std::isfinite(tokens) || (!std::isfinite(loss) && !std::isfinite(vloss)))
      throw Error(metrics + " line " + std::to_string(no) +
                  ": not a step or validation of tiny-qwen3 train --metrics");
    (std::isfinite(loss) ? train : val).push_back({tokens, std::isfinite(loss) ? loss : vloss});
  }
  if (train.empty()) throw Error(metrics + ": no training steps to plot");

  char dir_tmpl[] = "/tmp/tq_plot_XXXXXX";
  if (!mkdtemp(dir_tmpl)) throw Error("cannot make a temporary folder for gnuplot's data");
  const std::string dir = dir_tmpl;
  const auto write = [&](const std::string& name, const std::vector<Point>& pts) {
    std::ofstream f(dir + "/" + name);
    for (const Point& p : pts) f << p.tokens << ' ' << p.loss << '\n';
  };
  write("train.dat", train);
  write("val.dat", val);
  const std::string tmp = out + ".tmp." + std::to_string(getpid()) + ".png";
  {
    std::ofstream g(dir + "/plot.gp");
    g << "set terminal pngcairo size 1000,600\n"
      << "set output " << quoted(tmp) << "\n"
      << "set title " << quoted("loss: " + metrics) << " noenhanced\n"
      << "set xlabel 'tokens trained on'\nset ylabel 'loss (nats per token)'\n"
      << "set grid\nset key top right\n"
      << "plot " << quoted(dir + "/train.dat") << " using 1:2 with lines lw 1 title 'train'";
    if (!val.empty())
      g << ", " << quoted(dir + "/val.dat") << " using 1:2 with linespoints lw 2 pt 7 title 'val'";
    g << "\n";
  }
  const pid_t pid = fork();
  if (pid == 0) {
    execlp("gnuplot", "gnuplot", (dir + "/plot.gp").c_str(), (char*)nullptr);
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) < 0) status = -1;
  for (const char* f : {"/train.dat", "/val.dat", "/plot.gp"}) std::remove((dir + f).c_str());
  rmdir(dir.c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::remove(tmp.c_str());
    throw Error(WIFEXITED(status) && WEXITSTATUS(status) == 127
                    ? "gnuplot not found: apt-get install gnuplot-nox (tools/deps.sh installs it)"
                    : "gnuplot failed to draw " + out);
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("cannot write " + out);
  }
  std::printf("plot: %zu steps, %zu validations: %s\n", train.size(), val.size(), out.c_str());
  return 0;
}

}  // namespace tq::train
