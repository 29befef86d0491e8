#include "train/data.h"

#include <unistd.h>

#include <algorithm>
#include <random>

#include "core/common.h"

namespace tq::train {

data::ShardMeta read_shards_for(const std::string& dir, const Config& c) {
  if (access((dir + "/meta.json").c_str(), F_OK) != 0)
    throw Error("--data " + dir + " is not a folder of token shards (no meta.json): make " +
                "one with tiny-qwen3 prepare");
  const data::ShardMeta meta = data::read_meta(dir);
  if (meta.vocab_size > uint64_t(c.V))
    throw Error(dir + ": its tokenizer has " + std::to_string(meta.vocab_size) +
                " ids, more than " + c.name + "'s vocabulary of " + std::to_string(c.V));
  return meta;
}

TokenStream::TokenStream(const std::string& dir, const std::string& split, uint32_t vocab_size) {
  for (const std::string& path : data::list_shards(dir, split)) {
    shards_.emplace_back(path, vocab_size);
    starts_.push_back(total_);
    total_ += shards_.back().size();
  }
}

void TokenStream::read(uint64_t at, size_t n, int32_t* out) const {
  if (at + n > total_) throw Error("token stream read past its end");
  size_t k = size_t(std::upper_bound(starts_.begin(), starts_.end(), at) - starts_.begin()) - 1;
  while (n > 0) {
    const data::Shard& sh = shards_[k];
    const uint64_t off = at - starts_[k];
    const size_t take = size_t(std::min<uint64_t>(n, sh.size() - off));
    for (size_t i = 0; i < take; ++i) out[i] = int32_t(sh.ids()[off + i]);
    out += take, at += take, n -= take, ++k;
  }
}

DataOrder parse_data_order(const std::string& s) {
  if (s == "sequential") return DataOrder::sequential;
  if (s == "shuffled") return DataOrder::shuffled;
  throw Error("--data-order " + s + ": choose sequential or shuffled");
}

const char* data_order_name(DataOrder o) {
  return o == DataOrder::sequential ? "sequential" : "shuffled";
}

AttentionMask parse_attention(const std::string& s) {
  if (s == "causal") return AttentionMask::causal;
  if (s == "block-causal") return AttentionMask::block_causal;
  throw Error("--attention " + s + ": choose causal or block-causal");
}

const char* attention_name(AttentionMask a) {
  return a == AttentionMask::causal ? "causal" : "block-causal";
}

BatchLoader::BatchLoader(const TokenStream& s, int64_t B, int64_t T, DataOrder order, uint64_t seed)
    : s_(s), B_(B), T_(T), order_(order), seed_(seed) {
  const uint64_t per = uint64_t(B * T);
  windows_ = s.size() > 0 ? (s.size() - 1) / per : 0;
  if (windows_ == 0)
    throw Error("the train split has " + std::to_string(s.size()) + " tokens, fewer than one " +
                "batch needs (B*T + 1 = " + std::to_string(per + 1) +
                "): prepare more text or lower --batch-size or --seq-len");
  buf_.resize(per + 1);
}

uint64_t BatchLoader::window_at(uint64_t epoch, uint64_t position) {
  if (order_ == DataOrder::sequential) return position;
  if (perm_epoch_ != epoch) {
    perm_.resize(windows_);
    for (uint64_t i = 0; i < windows_; ++i) perm_[i] = i;
    std::seed_seq seq{uint32_t(seed_), uint32_t(seed_ >> 32), uint32_t(epoch),
                      uint32_t(epoch >> 32)};
    std::mt19937_64 g(seq);
    for (uint64_t i = 0; i + 1 < windows_; ++i) {
      const uint64_t b = windows_ - i, reject = (0 - b) % b;  // 2^64 mod b
      uint64_t x;
      do x = g();
      while (x < reject);
      std::swap(perm_[i], perm_[i + x % b]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[position];
}

void BatchLoader::load(uint64_t window, Batch& b) const {
  const uint64_t per = uint64_t(B_ * T_);
  s_.read(window * per, per + 1, buf_.data());
  b.B = B_, b.T = T_;
  b.tokens.assign(buf_.begin(), buf_.begin() + long(per));
  b.targets.assign(buf_.begin() + 1, buf_.end());
}

void BatchLoader::seek(uint64_t epoch, uint64_t position) {
  if (position >= windows_)
    throw Error("the loader's position " + std::to_string(position) + " is past the " +
                std::to_string(windows_) + " windows of an epoch");
  epoch_ = epoch, pos_ = position;
}

void BatchLoader::next(Batch& b) {
  load(window_at(epoch_, pos_), b);
  skip();
}

void BatchLoader::skip() {
  if (++pos_ == windows_) pos_ = 0, ++epoch_;
}

}  // namespace tq::train
