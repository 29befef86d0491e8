#include "infer/model.h"

#include <sys/stat.h>

#include "data/prepare.h"
#include "data/shard.h"
#include "train/checkpoint.h"

namespace tq::infer {

ModelInfo open_model(const std::string& path, const std::string& preset, const std::string& dtype,
                     const std::string& attention) {
  ModelInfo m;
  m.file = open_model_file(path);
  m.cfg = &resolve_preset(m.file, preset);
  if (m.file.kind == "tiny-qwen3 checkpoint" && m.file.tensors.size() > 0) {
    try {
      train::RunShards shards;
      m.run = train::read_run_config(path, &shards);
      m.tokenizer_sha256 = shards.tokenizer_sha256;
      m.eos_id = shards.eos_id;
    } catch (const Error&) {  // a walkthrough's checkpoint: no text run recorded
      m.run.reset();
    }
  }
  m.dtype = !dtype.empty() ? parse_dtype(dtype)
            : m.run        ? m.run->dtype
            : m.file.dtype ? *m.file.dtype
                           : DType::f32;
  m.attention = !attention.empty() ? train::parse_attention(attention)
                : m.run            ? m.run->attention
                                   : train::AttentionMask::causal;
  struct stat st;
  if (m.run && !m.run->data.empty() && ::stat((m.run->data + "/meta.json").c_str(), &st) == 0) {
    // Only while they still name the tokenizer the run recorded: shards prepared there again
    // with another, or a meta.json damaged since, leave it to --tokenizer.
    try {
      const data::ShardMeta meta = data::read_meta(m.run->data);
      if (meta.tokenizer_sha256 == m.tokenizer_sha256) m.tokenizer = meta.tokenizer_path;
    } catch (const Error&) {
    }
  } else if (!m.run && m.file.kind == "safetensors") {  // a Hugging Face model's own
    const bool folder = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    const size_t slash = path.rfind('/');
    const std::string dir = folder ? path : slash == path.npos ? "." : path.substr(0, slash);
    const std::string tok = dir + "/tokenizer.json";
    if (::stat(tok.c_str(), &st) == 0 && S_ISREG(st.st_mode)) m.tokenizer = tok;
  }
  return m;
}

void load_weights(const ModelInfo& m, Qwen3& model) {
  load_params(m.file, *m.cfg,
              [&](size_t off, const float* x, size_t n) { model.set_params(x, off, n); });
}

text::Tokenizer open_tokenizer(const ModelInfo& m, const std::string& path) {
  const std::string file = !path.empty() ? path : m.tokenizer;
  if (file.empty())
    throw Error(
        m.file.path + " names no tokenizer (a text run's checkpoint names its shards' " +
        "while their meta.json is where it was, a Hugging Face folder its tokenizer.json):" +
        " pass --tokenizer FILE");
  text::Tokenizer tok = text::Tokenizer::load(file);
  if (tok.vocab_size() > uint32_t(m.cfg->V))
    throw Error("tokenizer " + file + " has " + std::to_string(tok.vocab_size()) +
                " ids, more than the model's vocabulary of " + std::to_string(m.cfg->V) + " (" +
                m.cfg->name + "): it is not this model's tokenizer");
  if (!m.tokenizer_sha256.empty() && data::sha256_file(file) != m.tokenizer_sha256)
    throw Error("tokenizer " + file + " is not the one " + m.file.path +
                " was trained with (its shards record SHA-256 " + m.tokenizer_sha256.substr(0, 16) +
                "...): pass that tokenizer.json");
  return tok;
}

}  // namespace tq::infer
