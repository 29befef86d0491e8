// PyTorch-compatible initialization: torch.manual_seed semantics on the CPU generator
// (MT19937, torch's fp32 uniform and normal_ algorithms), then TorchTitan's init order (spec §9).
#pragma once
#include <cstdint>
#include <functional>

#include "model/config.h"

namespace tq {

// MT19937, the numbers of std::mt19937, made 624 words at a time by loops the compiler
// vectorizes (std::mt19937 twists a word per call, and discard() draws each word it skips):
// the draws were two fifths of initializing a model, all on one thread.
class Mt19937 {
 public:
  explicit Mt19937(uint32_t seed);
  uint32_t next() {
    if (i_ == kN) twist();
    return temper(mt_[i_++]);
  }
  void fill(uint32_t* out, size_t n);  // next() n times
  void discard(uint64_t n);

 private:
  static constexpr size_t kN = 624;
  static uint32_t temper(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
  }
  void twist();
  uint32_t mt_[kN];
  size_t i_ = kN;
};

// torch's CPU default generator after torch.manual_seed(seed).
class TorchRng {
 public:
  explicit TorchRng(uint64_t seed) : mt_(static_cast<uint32_t>(seed)) {}
  uint32_t next_u32() { return mt_.next(); }
  float uniform() { return uniform_of(next_u32()); }
  void skip(uint64_t n_u32) { mt_.discard(n_u32); }
  // tensor.normal_(0, std) on a contiguous fp32 tensor of n >= 16 elements.
  void normal(float* out, size_t n, float std);

 private:
  static float uniform_of(uint32_t u) { return static_cast<float>(u & 0xFFFFFFu) * 0x1p-24f; }
  Mt19937 mt_;
};

// Initializes the parameters as TorchTitan does for a model built on the CPU: constructor
// draws (consumed, then overwritten), then init_states. Each tensor is handed to sink(offset,
// values, n) as soon as it is drawn (the large ones by pieces of kInitPiece), so no full
// fp32 copy of the model, nor of its embedding, is needed.
using ParamSink = std::function<void(size_t offset, const float* values, size_t n)>;
// The longest piece of a tensor handed to a sink at once (an 8B embedding is 622M values).
constexpr size_t kInitPiece = size_t(1) << 22;
void init_params(const ParamSink& sink, const Config& cfg, const ParamLayout& layout,
                 uint64_t seed);
// The same into params[layout.total].
void init_params(float* params, const Config& cfg, const ParamLayout& layout, uint64_t seed);

}  // namespace tq
