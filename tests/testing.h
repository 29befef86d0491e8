// Small helpers shared by the C++ tests.
#pragma once
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "model/ops.h"

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

// The CPU backend with none of its optional kernels: the model's compositions of the required
// ones (its tests, and plans that must not depend on this CPU's kernels)
inline Ops bare_ops() {
  Ops o = cpu_ops();
  o.name = "bare";
  o.embedding_forward_bf16 = nullptr;
  o.embedding_backward_bf16 = nullptr;
  o.matmul_forward_bf16w = nullptr;
  o.matmul_backward_bf16w = nullptr;
  o.matmul_backward_bf16g = nullptr;
  o.matmul_backward_sgd = nullptr;
  o.matmul_backward_sgd_bf16w = nullptr;
  o.qk_norm_rope_forward = nullptr;
  o.qk_norm_rope_backward = nullptr;
  o.attention_forward_bf16 = nullptr;
  o.attention_backward_bf16 = nullptr;
  o.attention_qkn_forward = nullptr;
  o.attention_qkn_backward = nullptr;
  o.swiglu_forward_bf16 = nullptr;
  o.swiglu_backward_bf16 = nullptr;
  return o;
}

}  // namespace tq::test
