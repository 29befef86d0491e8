// Small helpers shared by the C++ tests.
#pragma once
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace tq::test {

inline std::vector<double> randn(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = d(g);
  return v;
}
inline std::vector<float> to_f(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}
inline std::vector<double> to_d(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// ||a - b|| / max(||b||, 1e-4)
template <typename A, typename B>
double rel_l2(const A& a, const B& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-4);  // floor: exactly-zero gradients
}

// Files the tests write: /tmp/tq_test_PID_NAME, whole reads and writes.
inline std::string tmp_path(const std::string& name) {
  return "/tmp/tq_test_" + std::to_string(getpid()) + "_" + name;
}
inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
inline void write_all(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary).write(data.data(), std::streamsize(data.size()));
}
inline bool exists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

}  // namespace tq::test
