#include "io/model_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>

#include "io/safetensors.h"

namespace tq {

using nlohmann::json;

namespace {

// ------------------------------------------------------------------ names

// TorchTitan key suffixes (after "layers.N.") and older TorchTitan's unfused spellings.
const std::map<std::string, std::string>& layer_names() {
  static const std::map<std::string, std::string> m = {
      {"attention.qkv_linear.wq.weight", "attention.qkv_linear.wq.weight"},
      {"attention.qkv_linear.wk.weight", "attention.qkv_linear.wk.weight"},
      {"attention.qkv_linear.wv.weight", "attention.qkv_linear.wv.weight"},
      {"attention.qkv_linear.wqkv.weight", "attention.qkv_linear.wqkv.weight"},  // fused
      {"attention.wq.weight", "attention.qkv_linear.wq.weight"},
      {"attention.wk.weight", "attention.qkv_linear.wk.weight"},
      {"attention.wv.weight", "attention.qkv_linear.wv.weight"},
      {"attention.wo.weight", "attention.wo.weight"},
      {"attention.q_norm.weight", "attention.q_norm.weight"},
      {"attention.k_norm.weight", "attention.k_norm.weight"},
      {"feed_forward.w1.weight", "feed_forward.w1.weight"},
      {"feed_forward.w2.weight", "feed_forward.w2.weight"},
      {"feed_forward.w3.weight", "feed_forward.w3.weight"},
      {"attention_norm.weight", "attention_norm.weight"},
      {"ffn_norm.weight", "ffn_norm.weight"},
  };
  return m;
}
// TorchTitan layer key suffix -> Hugging Face's (spec §8; no row permutation is needed).
const std::map<std::string, std::string>& hf_layer_names() {
  static const std::map<std::string, std::string> m = {
      {"attention.qkv_linear.wq.weight", "self_attn.q_proj.weight"},
      {"attention.qkv_linear.wk.weight", "self_attn.k_proj.weight"},
      {"attention.qkv_linear.wv.weight", "self_attn.v_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_norm.weight"},
      {"attention.k_norm.weight", "self_attn.k_norm.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
  };
  return m;
}
const std::map<std::string, std::string>& top_names() {
  static const std::map<std::string, std::string> m = {
      {"tok_embeddings.weight", "tok_embeddings.weight"},
      {"model.embed_tokens.weight", "tok_embeddings.weight"},
      {"norm.weight", "norm.weight"},
      {"model.norm.weight", "norm.weight"},
      {"lm_head.weight", "lm_head.weight"},
      {"output.weight", "lm_head.weight"},  // TorchTitan before April 2026
  };
  return m;
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// The TorchTitan key a stored name stands for; "" for buffers that carry no weights
// (RoPE caches); nullopt for anything that is not a dense Qwen3 parameter.
std::optional<std::string> canonical(std::string n) {
  for (;;) {
    if (ends_with(n, "rotary_emb.inv_freq") || n == "freqs_cis" || n == "rope_cache" ||
        n == "rope.cache")
      return "";
    if (auto it = top_names().find(n); it != top_names().end()) return it->second;
    for (const char* pre : {"layers.", "model.layers."}) {
      const size_t pl = std::strlen(pre);
      if (n.compare(0, pl, pre) != 0) continue;
      size_t i = pl, idx = 0;
      while (i < n.size() && i < pl + 5 && std::isdigit(static_cast<unsigned char>(n[i])))
        idx = idx * 10 + size_t(n[i++] - '0');
      if (i == pl || i >= n.size() || n[i] != '.' || (n[pl] == '0' && i > pl + 1)) break;
      const std::string layer = "layers." + std::to_string(idx) + ".", rest = n.substr(i + 1);
      if (auto it = layer_names().find(rest); it != layer_names().end()) return layer + it->second;
      for (const auto& [titan, hf] : hf_layer_names())
        if (hf == rest) return layer + titan;
    }
    bool stripped = false;  // wrappers: DDP, torch.compile, a "model." parent module
    for (const char* pre : {"module.", "_orig_mod.", "model."})
      if (n.compare(0, std::strlen(pre), pre) == 0) {
        n = n.substr(std::strlen(pre));
        stripped = true;
        break;
      }
    if (!stripped) return std::nullopt;
  }
}

const std::string kFused = "attention.qkv_linear.wqkv.weight";

// ------------------------------------------------------------------ reading files

std::string torch_dtype_of_storage(const std::string& s) {
  static const std::map<std::string, std::string> m = {
      {"FloatStorage", "float32"},  {"BFloat16Storage", "bfloat16"}, {"HalfStorage", "float16"},
      {"DoubleStorage", "float64"}, {"LongStorage", "int64"},        {"IntStorage", "int32"},
      {"ShortStorage", "int16"},    {"CharStorage", "int8"},         {"ByteStorage", "uint8"},
      {"BoolStorage", "bool"}};
  auto it = m.find(s);
  return it == m.end() ? s : it->second;
}
std::string torch_dtype_of_st(const std::string& s) {
  static const std::map<std::string, std::string> m = {
      {"F32", "float32"}, {"BF16", "bfloat16"}, {"F16", "float16"}, {"F64", "float64"},
      {"I64", "int64"},   {"I32", "int32"},     {"I16", "int16"},   {"I8", "int8"},
      {"U8", "uint8"},    {"BOOL", "bool"}};
  auto it = m.find(s);
  return it == m.end() ? s : it->second;
}
bool float_dtype(const std::string& d) {
  return d == "float32" || d == "bfloat16" || d == "float16" || d == "float64";
}

double num(const Value& v) {
  return v.kind == Value::Int ? double(v.i) : v.kind == Value::Float ? v.f : NAN;
}

void open_pt(ModelFile& mf) {
  auto pt = std::make_shared<PtReader>(mf.path);
  mf.keep.push_back(pt);
  const Value& root = *pt->root;
  const Value* sd = nullptr;
  if (root.kind == Value::Dict) {
    for (const char* k : {"model", "state_dict"})
      if (const Value* m = root.get(k); m && m->kind == Value::Dict) {
        sd = m;
        break;
      }
    if (!sd && !root.dict.empty()) {
      sd = &root;
      for (const auto& [k, v] : root.dict)
        if (v->kind != Value::Tensor) sd = nullptr;
    }
  }
  if (!sd)
    throw Error(mf.path +
                ": holds no state dict (expected a dict of tensors, or one under "
                "\"model\")");
  for (const auto& [k, v] : sd->dict) {
    if (k->kind != Value::Str)
      throw Error(mf.path + ": state dict has a " + std::string(kind_name(k->kind)) + " key");
    if (v->kind != Value::Tensor)
      throw Error(mf.path + ": state dict entry '" + k->s + "' is a " + kind_name(v->kind) +
                  ", not a tensor");
    const TensorRef& t = v->tensor;
    std::string id = t.key + "@" + std::to_string(t.offset) + ":" + shape_str(t.size) + "/" +
                     shape_str(t.stride);
    ValuePtr vp = v;
    const std::string name = k->s;
    mf.tensors.push_back({name, t.size, torch_dtype_of_storage(t.storage), id,
                          [pt, vp, name](size_t begin, size_t n, float* out) {
                            pt->tensor(name, vp.get(), vp->tensor.size, begin, n, out);
                          }});
  }
  mf.kind = sd == &root ? "PyTorch state dict" : "PyTorch checkpoint";
  if (const Value* conf = root.get("config"); conf && conf->kind == Value::Dict) {
    if (const Value* p = conf->get("preset"); p && p->kind == Value::Str) mf.preset = p->s;
    if (const Value* fl = root.get("final_loss"); fl && std::isfinite(num(*fl))) {
      TrainRecord r;
      r.final_loss = num(*fl);
      if (const Value* v = conf->get("seq_len"); v && v->kind == Value::Int) r.seq_len = v->i;
      if (const Value* v = conf->get("seed"); v && v->kind == Value::Int) r.seed = v->i;
      if (const Value* v = root.get("steps"); v && v->kind == Value::Int) r.steps = v->i;
      if (const Value* v = root.get("learning_rate")) r.learning_rate = num(*v);
      if (const Value* v = root.get("initial_loss")) r.initial_loss = num(*v);
      if (const Value* v = root.get("losses"); v && v->kind == Value::List)
        for (const ValuePtr& x : v->items) r.losses.push_back(num(*x));
      mf.record = r;
    }
  }
  if (const Value* f = root.get("format"); f && f->kind == Value::Str && f->s == kCheckpointFormat)
    mf.kind = "tiny-qwen3 checkpoint";
  if (const Value* d = root.get("dtype");
      d && d->kind == Value::Str && (d->s == "float32" || d->s == "bfloat16"))
    mf.dtype = parse_dtype(d->s);
}

// A value from a file, for a one-line message: JSON-quoted (no raw control characters), at
// most 40 characters of it.
std::string shown(const std::string& v) {
  return json(v.size() > 40 ? v.substr(0, 40) + "..." : v)
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

void add_safetensors(ModelFile& mf, const std::string& path) {
  auto st = std::make_shared<SafetensorsFile>(path);
  mf.keep.push_back(st);
  const SafetensorsFile* f = st.get();
  for (const StTensor& t : st->tensors()) {
    const std::string dt = torch_dtype_of_st(t.dtype);
    mf.tensors.push_back({t.name, t.shape, dt, path + "@" + std::to_string(t.begin),
                          [f, t, dt](size_t begin, size_t n, float* out) {
                            const size_t es = st_dtype_size(t.dtype);
                            if (begin > (t.end - t.begin) / es ||
                                n > (t.end - t.begin) / es - begin)
                              throw Error(f->path() + ": " + t.name + ": elements out of range");
                            const uint8_t* p = f->data(t) + begin * es;
                            // each dtype by its own element size; others are not weights
                            if (dt == "float32" && es == 4) return void(std::memcpy(out, p, 4 * n));
                            if (dt == "float64" && es == 8) {
                              for (size_t i = 0; i < n; ++i) {
                                double x;
                                std::memcpy(&x, p + 8 * i, 8);
                                out[i] = float(x);
                              }
                              return;
                            }
                            if ((dt == "bfloat16" || dt == "float16") && es == 2) {
                              for (size_t i = 0; i < n; ++i) {
                                uint16_t h;
                                std::memcpy(&h, p + 2 * i, 2);
                                out[i] = dt == "bfloat16" ? bf16_to_f32(h) : half_to_f32(h);
                              }
                              return;
                            }
                            throw Error(f->path() + ": " + t.name + " holds " + t.dtype +
                                        " values, not floating-point weights");
                          }});
  }
  // our export records the training run in the metadata (all values are strings)
  const auto& md = st->metadata();
  auto get = [&](const char* k) -> const std::string* {
    auto it = md.find(k);
    return it == md.end() ? nullptr : &it->second;
  };
  if (const std::string* p = get("preset"); p && mf.preset.empty()) mf.preset = *p;
  if (const std::string* fl = get("final_loss"); fl && !mf.record) {
    TrainRecord r;
    auto d = [&](const char* k, double dflt) {
      const std::string* s = get(k);
      return s ? std::strtod(s->c_str(), nullptr) : dflt;
    };
    r.final_loss = d("final_loss", NAN);
    r.initial_loss = d("initial_loss", NAN);
    r.learning_rate = d("learning_rate", 0);
    // whole numbers in decimal, within 64 bits (a float there could not be converted)
    auto whole = [&](const char* k) -> int64_t {
      const std::string* v = get(k);
      if (!v) return 0;
      errno = 0;
      char* end = nullptr;
      const long long x = std::strtoll(v->c_str(), &end, 10);
      if (v->empty() || *end != '\0' || errno == ERANGE)
        throw Error(path + ": __metadata__ \"" + k + "\" is " + shown(*v) +
                    ", not a whole number within 64 bits");
      return x;
    };
    r.seq_len = whole("seq_len");
    r.seed = whole("seed");
    r.steps = whole("steps");
    if (std::isfinite(r.final_loss)) mf.record = r;
  }
  if (const std::string* d = get("dtype"); d && (*d == "float32" || *d == "bfloat16"))
    mf.dtype = parse_dtype(*d);
}

json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path);
  std::string s((std::istreambuf_iterator<char>(f)), {});
  try {
    return json::parse(s);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}
bool is_file(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void open_index(ModelFile& mf, const std::string& index_path) {
  const json idx = read_json(index_path);
  if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
    throw Error(index_path + ": no \"weight_map\" object (not a safetensors index)");
  std::map<std::string, std::string> want;  // tensor -> shard
  std::set<std::string> shards;
  for (auto& [name, shard] : idx["weight_map"].items()) {
    if (!shard.is_string())
      throw Error(index_path + ": weight_map['" + name + "'] is not a string");
    const std::string s = shard.get<std::string>();
    if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..")
      throw Error(index_path + ": shard name '" + s + "' is not a file name in its folder");
    want[name] = s;
    shards.insert(s);
  }
  std::map<std::string, std::string> found;
  for (const std::string& s : shards) {
    const size_t before = mf.tensors.size();
    add_safetensors(mf, dir_of(index_path) + "/" + s);
    for (size_t i = before; i < mf.tensors.size(); ++i)
      if (!found.emplace(mf.tensors[i].name, s).second)
        throw Error(index_path + ": tensor '" + mf.tensors[i].name + "' is in two shards");
  }
  for (const auto& [name, shard] : want)
    if (found.count(name) == 0 || found[name] != shard)
      throw Error(index_path + ": weight_map puts '" + name + "' in " + shard +
                  ", which does not hold it");
}

}  // namespace

ModelFile open_model_file(const std::string& path) {
  ModelFile mf;
  mf.path = path;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) throw Error("cannot open " + path + ": no such file or folder");
  std::string config_dir;
  if (S_ISDIR(st.st_mode)) {
    mf.kind = "safetensors";
    if (is_file(path + "/model.safetensors"))
      add_safetensors(mf, path + "/model.safetensors");
    else if (is_file(path + "/model.safetensors.index.json"))
      open_index(mf, path + "/model.safetensors.index.json");
    else
      throw Error(path + ": folder has no model.safetensors or model.safetensors.index.json");
    config_dir = path;
  } else {
    MappedFile f(path);
    const uint8_t* d = f.data();
    const size_t n = f.size();
    if (n >= 4 && std::memcmp(d, "PK\x03\x04", 4) == 0) {
      open_pt(mf);
    } else if (looks_like_safetensors(d, n) || ends_with(path, ".safetensors")) {
      mf.kind = "safetensors";
      add_safetensors(mf, path);
      config_dir = dir_of(path);
    } else if (ends_with(path, ".index.json")) {
      mf.kind = "safetensors";
      open_index(mf, path);
      config_dir = dir_of(path);
    } else {
      PtReader::check_magic(f);  // names legacy torch formats
      throw Error(path + ": not a PyTorch checkpoint, safetensors file or Hugging Face folder");
    }
  }
  if (!config_dir.empty() && is_file(config_dir + "/config.json")) {
    mf.hf_config_path = config_dir + "/config.json";
    mf.hf_config = read_json(mf.hf_config_path);
    if (!mf.hf_config->is_object()) throw Error(mf.hf_config_path + ": not a JSON object");
  }
  if (!mf.dtype && !mf.tensors.empty()) {
    const std::string& d0 = mf.tensors[0].dtype;
    bool same = true;
    for (const SourceTensor& t : mf.tensors) same &= t.dtype == d0;
    if (same && (d0 == "float32" || d0 == "bfloat16")) mf.dtype = parse_dtype(d0);
  }
  return mf;
}

namespace {

// The file's tensors by TorchTitan key (fused qkv kept under its own key).
std::map<std::string, const SourceTensor*> by_key(const ModelFile& mf) {
  std::map<std::string, const SourceTensor*> m;
  for (const SourceTensor& t : mf.tensors) {
    const std::optional<std::string> k = canonical(t.name);
    if (!k)
      throw Error(mf.path + ": unexpected tensor '" + t.name +
                  "': not a parameter of a dense Qwen3 model" +
                  (ends_with(t.name, ".bias") ? " (Qwen3 has no biases)" : ""));
    if (k->empty()) continue;
    auto [it, fresh] = m.emplace(*k, &t);
    if (!fresh)
      throw Error(mf.path + ": '" + it->second->name + "' and '" + t.name + "' are the same " + *k);
  }
  return m;
}

const SourceTensor* get(const std::map<std::string, const SourceTensor*>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? nullptr : it->second;
}

std::string dims(const Config& c) {
  return "V=" + std::to_string(c.V) + ", C=" + std::to_string(c.C) + ", L=" + std::to_string(c.L) +
         ", H=" + std::to_string(c.H) + ", KVH=" + std::to_string(c.KVH) +
         ", D=" + std::to_string(c.D) + ", F=" + std::to_string(c.F);
}

// Dimensions read off the shapes; Error when a tensor needed for them is missing or malformed.
Config infer_dims(const ModelFile& mf, const std::map<std::string, const SourceTensor*>& m) {
  auto need = [&](const std::string& k, size_t rank) -> const std::vector<int64_t>& {
    const SourceTensor* t = get(m, k);
    if (!t) throw Error(mf.path + ": no " + k + " (cannot tell which preset the file holds)");
    if (t->shape.size() != rank)
      throw Error(mf.path + ": " + t->name + " has shape " + shape_str(t->shape) + ", expected " +
                  std::to_string(rank) + " dimensions");
    return t->shape;
  };
  Config c{};
  c.name = "the file";
  c.V = need("tok_embeddings.weight", 2)[0];
  c.C = need("tok_embeddings.weight", 2)[1];
  int64_t L = 0;
  for (const auto& [k, t] : m)
    if (k.compare(0, 7, "layers.") == 0) L = std::max<int64_t>(L, std::atoll(k.c_str() + 7) + 1);
  c.L = L;
  if (L == 0) throw Error(mf.path + ": no transformer layers (no layers.N.* tensors)");
  c.D = need("layers.0.attention.q_norm.weight", 1)[0];
  if (c.D <= 0) throw Error(mf.path + ": q_norm has no elements");
  c.H = need("layers.0.attention.wo.weight", 2)[1] / c.D;
  if (get(m, "layers.0." + kFused))
    c.KVH = (need("layers.0." + kFused, 2)[0] / c.D - c.H) / 2;
  else
    c.KVH = need("layers.0.attention.qkv_linear.wk.weight", 2)[0] / c.D;
  c.F = need("layers.0.feed_forward.w1.weight", 2)[0];
  return c;
}

// config.json beside the weights must describe the same model.
void check_hf_config(const ModelFile& mf, const Config& c) {
  if (!mf.hf_config) return;
  const json& j = *mf.hf_config;
  const std::string& p = mf.hf_config_path;
  auto num_field = [&](const char* k, double want) {
    if (!j.contains(k) || j[k].is_null()) return;
    if (!j[k].is_number()) throw Error(p + ": " + k + " is not a number");
    const double v = j[k].get<double>();
    if (std::fabs(v - want) > 1e-6 * std::fabs(want))
      throw Error(p + ": " + k + " is " + j[k].dump() + " but the weights are " + c.name + "'s (" +
                  (want == std::floor(want) ? std::to_string(int64_t(want)) : json(want).dump()) +
                  ")");
  };
  num_field("vocab_size", double(c.V));
  num_field("hidden_size", double(c.C));
  num_field("intermediate_size", double(c.F));
  num_field("num_hidden_layers", double(c.L));
  num_field("num_attention_heads", double(c.H));
  num_field("num_key_value_heads", double(c.KVH));
  num_field("head_dim", double(c.D));
  num_field("rms_norm_eps", double(c.eps));
  num_field("rope_theta", c.theta);
  auto str_field = [&](const char* k, const char* want) {
    if (j.contains(k) && !(j[k].is_string() && j[k].get<std::string>() == want))
      throw Error(p + ": " + k + " is " + j[k].dump() + "; tiny-qwen3 supports only \"" + want +
                  "\"");
  };
  str_field("model_type", "qwen3");
  str_field("hidden_act", "silu");
  auto bool_field = [&](const char* k, bool want, const std::string& why) {
    if (j.contains(k) && !j[k].is_null() && !(j[k].is_boolean() && j[k].get<bool>() == want))
      throw Error(p + ": " + k + " is " + j[k].dump() + ", " + why);
  };
  bool_field("tie_word_embeddings", c.tied,
             std::string("but ") + c.name + (c.tied ? " ties" : " does not tie") +
                 " the embedding and lm_head");
  bool_field("attention_bias", false, "tiny-qwen3's Qwen3 has no biases");
  bool_field("use_sliding_window", false, "tiny-qwen3 has no sliding-window attention");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    throw Error(p + ": rope_scaling is " + j["rope_scaling"].dump() +
                "; tiny-qwen3 supports plain RoPE only");
}

}  // namespace

const Config& resolve_preset(const ModelFile& mf, const std::string& want) {
  const Config* cfg = nullptr;
  if (!want.empty()) {
    cfg = &preset(want);
  } else {
    const Config d = infer_dims(mf, by_key(mf));
    for (const Config& p : presets())
      if (p.V == d.V && p.C == d.C && p.L == d.L && p.H == d.H && p.KVH == d.KVH && p.D == d.D &&
          p.F == d.F)
        cfg = &p;
    if (!cfg) throw Error(mf.path + ": no preset has the file's dimensions (" + dims(d) + ")");
    if (!mf.preset.empty() && mf.preset != cfg->name)
      throw Error(mf.path + ": records preset '" + mf.preset + "' but its shapes are " + cfg->name +
                  "'s");
  }
  check_model_file(mf, *cfg);
  return *cfg;
}

namespace {

// The file's tensors by TorchTitan key, after checking every one of them against c.
std::map<std::string, const SourceTensor*> checked_keys(const ModelFile& mf, const Config& c) {
  const auto m = by_key(mf);
  std::set<std::string> used;
  for (const StateEntry& e : state_dict_entries(c, make_layout(c))) {
    const SourceTensor* t = get(m, e.key);
    std::vector<int64_t> shape = e.shape;
    std::string key = e.key;
    if (!t && e.slot0 >= 0) {  // wq/wk/wv may come fused
      key = e.key.substr(0, e.key.find("attention.")) + kFused;
      t = get(m, key);
      shape = {c.qkv_rows(), c.C};
    }
    if (!t && e.key == "lm_head.weight") {
      if (c.tied) continue;  // tied files may omit it (Hugging Face does)
      throw Error(mf.path + ": no lm_head.weight, but " + c.name +
                  " has an output layer of its own (the file's model ties it?)");
    }
    if (!t) throw Error(mf.path + ": " + e.key + ": missing (" + c.name + " needs it)");
    used.insert(key);
    if (t->shape != shape)
      throw Error(mf.path + ": " + t->name + ": shape " + shape_str(t->shape) + " but " + c.name +
                  " needs " + shape_str(shape));
    if (!float_dtype(t->dtype))
      throw Error(mf.path + ": " + t->name + ": dtype " + t->dtype +
                  " is not a floating-point weight (need float32, bfloat16, float16 or float64)");
  }
  for (const auto& [k, t] : m)
    if (!used.count(k))
      throw Error(mf.path + ": unexpected tensor '" + t->name + "' for " + c.name +
                  (k.compare(0, 7, "layers.") == 0
                       ? " (it has " + std::to_string(c.L) + " layers)"
                       : std::string(" (a fused and a split qkv for one layer?)")));
  if (!c.tied && get(m, "lm_head.weight")->storage == get(m, "tok_embeddings.weight")->storage)
    throw Error(mf.path + ": lm_head.weight is tok_embeddings.weight (tied), but " + c.name +
                " has an output layer of its own");
  check_hf_config(mf, c);
  return m;
}

}  // namespace

void check_model_file(const ModelFile& mf, const Config& c) {
  checked_keys(mf, c);
}

size_t SourceTensor::numel() const {
  size_t n = 1;
  for (int64_t s : shape) n *= size_t(s);
  return n;
}
std::vector<float> SourceTensor::read_all() const {
  std::vector<float> x(numel());
  read(0, x.size(), x.data());
  return x;
}

namespace {
// Arena elements [arena, arena + n) are t's dense elements [dense, dense + n).
struct SourceRun {
  size_t arena;
  const SourceTensor* t;
  size_t dense, n;
};
// Where every parameter comes from in mf, in state-dict order; a separate lm_head of a tied
// preset is checked against the embedding (read by pieces) and left out.
std::vector<SourceRun> source_runs(const ModelFile& mf, const Config& c) {
  const auto m = checked_keys(mf, c);
  const ParamLayout layout = make_layout(c);
  std::set<std::string> fused_done;
  std::vector<float> x, y;  // a piece of a tensor: never a whole one (an 8B embedding is 2.5 GB)
  std::vector<SourceRun> runs;
  for (const StateEntry& e : state_dict_entries(c, layout)) {
    const SourceTensor* t = get(m, e.key);
    if (e.tied_copy) {  // stored apart from the embedding: it must equal it
      const SourceTensor* emb = get(m, "tok_embeddings.weight");
      if (!t || t->storage == emb->storage) continue;
      for (size_t i = 0, k, n = t->numel(); i < n; i += k) {
        k = std::min(n - i, kLoadPiece);
        x.resize(k), y.resize(k);
        t->read(i, k, x.data());
        emb->read(i, k, y.data());
        if (x != y)
          throw Error(mf.path + ": lm_head.weight differs from tok_embeddings.weight, but " +
                      c.name + " ties them");
      }
      continue;
    }
    if (!t) {  // the fused qkv, whose rows are the arena's own layout
      const std::string key = e.key.substr(0, e.key.find("attention.")) + kFused;
      if (!fused_done.insert(key).second) continue;
      const SourceTensor* f = get(m, key);
      runs.push_back({e.offset, f, 0, f->numel()});
      continue;
    }
    for (const ArenaRun& r : entry_runs(c, e)) runs.push_back({r.arena, t, r.dense, r.n});
  }
  return runs;
}
}  // namespace

void load_params(const ModelFile& mf, const Config& c, const ParamSink& sink) {
  std::vector<float> x;
  for (const SourceRun& r : source_runs(mf, c))
    for (size_t i = 0, k; i < r.n; i += k) {  // by pieces
      k = std::min(r.n - i, kLoadPiece);
      x.resize(k);
      r.t->read(r.dense + i, k, x.data());
      sink(r.arena + i, x.data(), k);
    }
}

ParamReader source_reader(const ModelFile& mf, const Config& c) {
  std::vector<SourceRun> sorted = source_runs(mf, c);
  std::sort(sorted.begin(), sorted.end(),
            [](const SourceRun& a, const SourceRun& b) { return a.arena < b.arena; });
  auto runs = std::make_shared<const std::vector<SourceRun>>(std::move(sorted));
  return [runs, path = mf.path](size_t off, size_t n, float* out) {
    auto it = std::upper_bound(runs->begin(), runs->end(), off,
                               [](size_t o, const SourceRun& r) { return o < r.arena; });
    while (n > 0) {
      if (it == runs->begin() || off >= std::prev(it)->arena + std::prev(it)->n)
        throw Error("internal: arena element " + std::to_string(off) + " has no source in " + path);
      const SourceRun& r = *std::prev(it);
      const size_t k = std::min(n, r.arena + r.n - off);
      r.t->read(r.dense + (off - r.arena), k, out);
      off += k, out += k, n -= k;
      ++it;
    }
  };
}

std::string hf_name(const std::string& k) {
  if (k == "tok_embeddings.weight") return "model.embed_tokens.weight";
  if (k == "norm.weight") return "model.norm.weight";
  if (k == "lm_head.weight") return k;
  const size_t dot = k.find('.', 7);  // "layers.N." then the suffix
  auto it = hf_layer_names().find(k.substr(dot + 1));
  if (k.compare(0, 7, "layers.") != 0 || it == hf_layer_names().end())
    throw Error("no Hugging Face name for " + k);
  return "model." + k.substr(0, dot + 1) + it->second;
}

Checkpoint load_checkpoint(const std::string& path,
                           const std::function<void(const Checkpoint&)>& before_params) {
  const ModelFile mf = open_model_file(path);
  const Config& c = resolve_preset(mf, mf.preset);
  Checkpoint ck;
  ck.preset = c.name;
  ck.dtype = mf.dtype.value_or(DType::f32);
  if (mf.record) {
    ck.recorded = true;
    ck.rec = *mf.record;
    if (ck.rec.seq_len < 1 || ck.rec.seq_len > c.max_ctx)
      throw Error(path + ": seq_len " + std::to_string(ck.rec.seq_len) + " out of range for " +
                  c.name);
  }
  if (before_params) before_params(ck);
  const ParamLayout layout = make_layout(c);
  ck.params.assign(layout.total, 0.f);
  load_params(mf, c, [&](size_t off, const float* x, size_t n) {
    std::memcpy(ck.params.data() + off, x, n * sizeof(float));
  });
  return ck;
}

}  // namespace tq
