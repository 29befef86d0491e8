// Small helpers shared by the C++ tests.
#pragma once
#include <cmath>
#include <random>
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

}  // namespace tq::test
