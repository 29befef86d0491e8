#include "io/export.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "io/file.h"
#include "io/model_file.h"
#include "io/safetensors.h"

namespace tq {

namespace {

using ojson = nlohmann::ordered_json;

void write_json(AtomicFile& f, const ojson& j) {
  const std::string s = j.dump(2) + "\n";
  f.write(s.data(), s.size());
}

std::string g17(double v) {  // round-trips a double exactly
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

// Qwen3's own special tokens where the vocabulary is Qwen3's; none for smaller vocabularies.
ojson token_id(const Config& c, int64_t id) {
  return c.V == 151936 ? ojson(id) : ojson(nullptr);
}

}  // namespace

void export_hf(const std::string& dir, const Config& c, const ParamReader& read, DType dtype,
               const TrainRecord* rec) {
  // A folder made here goes again if the export fails or is interrupted (empty by then).
  std::optional<TemporaryFolder> fresh;
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw Error(dir + " exists and is not a folder");
  } else if (mkdir(dir.c_str(), 0777) != 0) {
    throw Error("cannot create folder " + dir + ": " + std::strerror(errno));
  } else {
    fresh.emplace(dir);
  }
  const bool bf16 = dtype == DType::bf16;
  const double eps = c.eps == 1e-6f ? 1e-6 : double(c.eps);
  ojson cfg = {
      {"architectures", {"Qwen3ForCausalLM"}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"bos_token_id", token_id(c, 151643)},
      {"eos_token_id", token_id(c, 151645)},
      {"head_dim", c.D},
      {"hidden_act", "silu"},
      {"hidden_size", c.C},
      {"initializer_range", 0.02},
      {"intermediate_size", c.F},
      {"max_position_embeddings", c.max_ctx},
      {"max_window_layers", c.L},
      {"model_type", "qwen3"},
      {"num_attention_heads", c.H},
      {"num_hidden_layers", c.L},
      {"num_key_value_heads", c.KVH},
      {"rms_norm_eps", eps},
      {"rope_scaling", nullptr},
      {"rope_theta", c.theta},
      {"sliding_window", nullptr},
      {"tie_word_embeddings", c.tied},
      {"torch_dtype", bf16 ? "bfloat16" : "float32"},
      {"transformers_version", "4.51.0"},
      {"use_cache", true},
      {"use_sliding_window", false},
      {"vocab_size", c.V},
  };
  std::map<std::string, std::string> md = {{"format", "pt"},
                                           {"tiny_qwen3", kCheckpointFormat},
                                           {"preset", c.name},
                                           {"dtype", dtype_name(dtype)}};
  if (rec) {
    md["seq_len"] = std::to_string(rec->seq_len);
    md["seed"] = std::to_string(rec->seed);
    md["steps"] = std::to_string(rec->steps);
    md["learning_rate"] = g17(rec->learning_rate);
    md["initial_loss"] = g17(rec->initial_loss);
    md["final_loss"] = g17(rec->final_loss);
  }
  std::vector<StOutTensor> tensors;
  for (const StateEntry& e : state_dict_entries(c, make_layout(c))) {
    if (e.tied_copy) continue;  // Hugging Face omits lm_head.weight when tied
    tensors.push_back(
        {hf_name(e.key), bf16 ? "BF16" : "F32", e.shape,
         [=, &c, &read](const ByteSink& emit) { encode_entry(emit, c, e, read, dtype); }});
  }
  // All three written and synced under temporary names before any is renamed, config.json
  // last: an interrupted export leaves no file of its own, and a folder whose config.json
  // is new has the weights that go with it (an earlier export's files are replaced whole).
  AtomicFile weights(dir + "/model.safetensors"), config(dir + "/config.json"),
      generation(dir + "/generation_config.json");
  write_safetensors(weights, std::move(tensors), md);
  write_json(config, cfg);
  write_json(generation, {{"bos_token_id", token_id(c, 151643)},
                          {"eos_token_id", token_id(c, 151645)},
                          {"do_sample", false},
                          {"transformers_version", "4.51.0"}});
  weights.sync(), generation.sync(), config.sync();
  weights.commit(), generation.commit(), config.commit();
  if (fresh) fresh->keep();
}

void export_pt(const std::string& path, const Config& c, const ParamReader& read, DType dtype) {
  PtWriter w;
  ValuePtr sd = state_dict(w, c, make_layout(c), read, dtype);
  w.save(path, *sd);
}

}  // namespace tq
