#include "train/metrics.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/common.h"
#include "io/file.h"

namespace tq::train {

std::string step_line(const StepMetrics& m) {
  char b[256];
  const int w = int(std::to_string(m.steps).size());
  std::snprintf(b, sizeof b,
                "step %*lld/%lld | loss %.6f | lr %.3e | grad norm %.4f | %s tok/s | %.1f ms", w,
                (long long)m.step, (long long)m.steps, m.loss, m.lr, m.grad_norm,
                with_commas(int64_t(m.tokens_per_s + 0.5)).c_str(), m.ms);
  std::string line = b;
  if (m.comm_ms >= 0) {
    std::snprintf(b, sizeof b, " | comm %.1f ms", m.comm_ms);
    line += b;
  }
  return line;
}

MetricsLog::MetricsLog(const std::string& path, int64_t resume_after) : path_(path) {
  if (path.empty()) return;
  if (resume_after > 0) {  // keep the records up to the resumed step, then append
    std::string kept;
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) {
      const nlohmann::json j = nlohmann::json::parse(l, nullptr, false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<int64_t>() <= resume_after)
        kept += l + "\n";
    }
    AtomicFile out(path);
    out.write(kept.data(), kept.size());
    out.commit();
  }
  f_ = std::fopen(path.c_str(), resume_after > 0 ? "a" : "w");
  if (!f_) throw Error("--metrics " + path + ": cannot write (" + std::strerror(errno) + ")");
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::line(const std::string& json) {
  if (!f_) return;
  if (std::fputs((json + "\n").c_str(), f_) < 0 || std::fflush(f_) != 0)
    throw Error("--metrics " + path_ + ": write failed (" + std::strerror(errno) + ")");
}

void MetricsLog::step(const StepMetrics& m) {
  nlohmann::json j{{"step", m.step},     {"loss", m.loss},
                   {"lr", m.lr},         {"grad_norm", m.grad_norm},
                   {"tokens", m.tokens}, {"tokens_per_s", m.tokens_per_s},
                   {"ms", m.ms}};
  if (m.comm_ms >= 0) j["comm_ms"] = m.comm_ms;
  line(j.dump());
}

void MetricsLog::validation(int64_t step, uint64_t tokens, double val_loss, uint64_t val_tokens) {
  line(nlohmann::json{
      {"step", step}, {"tokens", tokens}, {"val_loss", val_loss}, {"val_tokens", val_tokens}}
           .dump());
}

}  // namespace tq::train
