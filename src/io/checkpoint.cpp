#include "io/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "io/file.h"
#include "io/zip.h"

namespace tq {

// ------------------------------------------------------------------ writing

TensorRef PtWriter::add_storage(const std::string& storage, int64_t numel, Fill fill) {
  TensorRef t;
  t.key = std::to_string(storages_.size());
  t.storage = storage;
  t.storage_numel = numel;
  storages_.push_back({t.key, storage, numel, std::move(fill)});
  return t;
}

void PtWriter::save(const std::string& path, const Value& root) {
  AtomicFile f(path);
  ZipWriter zip(f);
  const std::string pkl = pickle_dumps(root);
  zip.add("archive/data.pkl", pkl.data(), pkl.size());
  zip.add("archive/byteorder", "little", 6);
  for (const Pending& s : storages_)
    zip.add("archive/data/" + s.key, uint64_t(s.numel) * storage_element_size(s.storage), s.fill);
  zip.add("archive/version", "3\n", 2);
  zip.finish();
  f.commit();
}

TensorRef full_view(TensorRef t, std::vector<int64_t> shape) {
  t.offset = 0;
  t.size = shape;
  t.stride.assign(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) t.stride[i - 1] = t.stride[i] * shape[i];
  return t;
}

static void encode(uint8_t* out, const float* src, int64_t n, DType dtype) {
  if (dtype == DType::f32) {
    std::memcpy(out, src, n * 4);
    return;
  }
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(src[i]);
}

std::vector<StateEntry> state_dict_entries(const Config& c, const ParamLayout& p) {
  std::vector<StateEntry> r;
  auto plain = [&](std::string key, std::vector<int64_t> shape, size_t off) {
    r.push_back({std::move(key), std::move(shape), off, -1, 0, false});
  };
  const int64_t G = c.H / c.KVH;
  plain("tok_embeddings.weight", {c.V, c.C}, p.tok_emb);
  for (int64_t l = 0; l < c.L; ++l) {
    const ParamLayout::Layer& ly = p.layers[l];
    const std::string pre = "layers." + std::to_string(l) + ".";
    const std::string qkv = pre + "attention.qkv_linear.";
    r.push_back({qkv + "wq.weight", {c.H * c.D, c.C}, ly.wqkv, 0, G, false});
    r.push_back({qkv + "wk.weight", {c.KVH * c.D, c.C}, ly.wqkv, G, 1, false});
    r.push_back({qkv + "wv.weight", {c.KVH * c.D, c.C}, ly.wqkv, G + 1, 1, false});
    plain(pre + "attention.wo.weight", {c.C, c.H * c.D}, ly.wo);
    plain(pre + "attention.q_norm.weight", {c.D}, ly.q_norm);
    plain(pre + "attention.k_norm.weight", {c.D}, ly.k_norm);
    plain(pre + "feed_forward.w1.weight", {c.F, c.C}, ly.w1);
    plain(pre + "feed_forward.w2.weight", {c.C, c.F}, ly.w2);
    plain(pre + "feed_forward.w3.weight", {c.F, c.C}, ly.w3);
    plain(pre + "attention_norm.weight", {c.C}, ly.attn_norm);
    plain(pre + "ffn_norm.weight", {c.C}, ly.ffn_norm);
  }
  plain("norm.weight", {c.C}, p.norm);
  r.push_back({"lm_head.weight", {c.V, c.C}, p.lm_head, -1, 0, c.tied});
  return r;
}

std::vector<ArenaRun> entry_runs(const Config& c, const StateEntry& e) {
  size_t n = 1;
  for (int64_t s : e.shape) n *= size_t(s);
  if (e.slot0 < 0) return {{e.offset, 0, n}};
  const size_t G = c.H / c.KVH, DC = c.D * c.C, chunk = e.slots * DC;
  std::vector<ArenaRun> runs;
  for (size_t g = 0; g < size_t(c.KVH); ++g)
    runs.push_back({e.offset + (g * (G + 2) + e.slot0) * DC, g * chunk, chunk});
  return runs;
}

ParamReader arena_reader(const float* params) {
  return [params](size_t off, size_t n, float* out) { std::memcpy(out, params + off, n * 4); };
}

void encode_entry(const ByteSink& emit, const Config& c, const StateEntry& e,
                  const ParamReader& read, DType dtype) {
  size_t n = 0;
  for (const ArenaRun& r : entry_runs(c, e)) n = std::max(n, r.n);
  n = std::min(n, kEncodePiece);
  const size_t es = dtype_size(dtype);
  std::unique_ptr<float[]> tmp(new float[n]);
  std::unique_ptr<uint8_t[]> bytes(new uint8_t[n * es]);
  size_t dense = 0;
  for (const ArenaRun& r : entry_runs(c, e)) {
    if (r.dense != dense) throw Error("internal: " + e.key + "'s runs are out of order");
    for (size_t i = 0, m; i < r.n; i += m) {  // by pieces: no copy of a whole tensor
      m = std::min(r.n - i, kEncodePiece);
      read(r.arena + i, m, tmp.get());
      encode(bytes.get(), tmp.get(), int64_t(m), dtype);
      emit(bytes.get(), m * es);
    }
    dense += r.n;
  }
}

ValuePtr state_dict(PtWriter& w, const Config& c, const ParamLayout& p, const ParamReader& read,
                    DType dtype) {
  const std::string cls = dtype == DType::f32 ? "FloatStorage" : "BFloat16Storage";
  ValuePtr sd = v_dict(true);
  TensorRef emb;
  for (const StateEntry& e : state_dict_entries(c, p)) {
    int64_t n = 1;
    for (int64_t s : e.shape) n *= s;
    if (e.tied_copy) {  // the same storage again: written once, loaded as one tensor
      dict_set(*sd, e.key, v_tensor(full_view(emb, e.shape)));
      continue;
    }
    TensorRef t = w.add_storage(
        cls, n, [=, &c](const ByteSink& emit) { encode_entry(emit, c, e, read, dtype); });
    if (e.key == "tok_embeddings.weight") emb = t;
    dict_set(*sd, e.key, v_tensor(full_view(t, e.shape)));
  }
  return sd;
}

ValuePtr checkpoint_root(PtWriter& w, const Config& cfg, const ParamReader& read, DType dtype,
                         const TrainRecord& rec, DType compute_dtype) {
  ValuePtr root = v_dict();
  dict_set(*root, "model", state_dict(w, cfg, make_layout(cfg), read, dtype));
  ValuePtr conf = v_dict();
  dict_set(*conf, "preset", v_str(cfg.name));
  dict_set(*conf, "seq_len", v_int(rec.seq_len));
  dict_set(*conf, "seed", v_int(rec.seed));
  dict_set(*root, "config", conf);
  dict_set(*root, "steps", v_int(rec.steps));
  dict_set(*root, "learning_rate", v_float(rec.learning_rate));
  dict_set(*root, "initial_loss", v_float(rec.initial_loss));
  dict_set(*root, "final_loss", v_float(rec.final_loss));
  dict_set(*root, "dtype", v_str(dtype_name(compute_dtype)));
  std::vector<ValuePtr> losses;
  for (double l : rec.losses) losses.push_back(v_float(l));
  dict_set(*root, "losses", v_list(losses));
  if (!rec.init_from.empty()) dict_set(*root, "init_from", v_str(rec.init_from));
  dict_set(*root, "format", v_str(kCheckpointFormat));
  return root;
}

void save_checkpoint(const std::string& path, const Config& cfg, const ParamReader& read,
                     DType dtype, const TrainRecord& rec) {
  PtWriter w;
  w.save(path, *checkpoint_root(w, cfg, read, dtype, rec, dtype));
}

// ------------------------------------------------------------------ reading

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

PtReader::PtReader(const std::string& path, bool verify_crcs) : file(path), zip(check_magic(file)) {
  const auto& names = zip.names();
  if (names.empty()) throw Error(path + ": empty zip archive, not a PyTorch checkpoint");
  const size_t slash = names[0].find('/');
  if (slash == std::string::npos)
    throw Error(path + ": zip entries are not in a folder; not a PyTorch checkpoint");
  prefix = names[0].substr(0, slash + 1);
  for (const std::string& n : names)
    if (n.compare(0, prefix.size(), prefix) != 0)
      throw Error(path + ": entry " + n + " is outside " + prefix + "; not a PyTorch checkpoint");
  if (zip.has(prefix + "constants.pkl"))
    throw Error(path + ": a TorchScript archive, not a torch.save checkpoint");
  if (verify_crcs) zip.verify_crcs();
  const std::string ver = zip.has(prefix + ".data/version") ? ".data/version" : "version";
  const ZipEntry& ve = zip.entry(prefix + ver);
  const std::string v(reinterpret_cast<const char*>(zip.data(ve)), ve.size);
  const long vn = std::atol(v.c_str());
  if (vn < 1 || vn > 10) throw Error(path + ": unsupported archive version '" + v + "'");
  if (zip.has(prefix + "byteorder")) {
    const ZipEntry& be = zip.entry(prefix + "byteorder");
    if (std::string(reinterpret_cast<const char*>(zip.data(be)), be.size) != "little")
      throw Error(path + ": big-endian checkpoints are not supported");
  }
  const ZipEntry& pe = zip.entry(prefix + "data.pkl");
  const uint8_t* pk = zip.data(pe);
  if (pe.size < 2 || pk[0] != 0x80 || pk[1] != 2)
    throw Error(path +
                ": data.pkl is not pickle protocol 2 (saved with a custom pickle_protocol?)");
  try {
    root = pickle_loads(pk, pe.size);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}
const MappedFile& PtReader::check_magic(const MappedFile& f) {
  const uint8_t* d = f.data();
  const size_t n = f.size();
  if (n >= 8 && std::memcmp(d, "PYTORCH1", 8) == 0)
    throw Error(f.path() + ": pre-release PyTorch format; re-save with torch >= 1.6");
  if (n >= 3 && d[0] == 0x80 && d[1] == 0x02 && d[2] == 0x8a)
    throw Error(f.path() + ": legacy (pre-1.6) torch.save format; re-save with torch >= 1.6");
  if (n >= 262 && std::memcmp(d + 257, "ustar", 5) == 0)
    throw Error(f.path() + ": legacy tar torch.save format; re-save with torch >= 1.6");
  if (n < 4 || std::memcmp(d, "PK\x03\x04", 4) != 0)
    throw Error(f.path() + ": not a PyTorch checkpoint (no zip signature)");
  return f;
}

std::vector<float> PtReader::tensor(const std::string& name, const Value* v,
                                    const std::vector<int64_t>& shape) const {
  int64_t numel = 1;
  for (int64_t s : shape)
    if (s < 0 || __builtin_mul_overflow(numel, s, &numel))
      throw Error(file.path() + ": " + name + ": shape " + shape_str(shape) + " out of range");
  std::vector<float> out(static_cast<size_t>(numel));
  tensor(name, v, shape, 0, out.size(), out.data());
  return out;
}

void PtReader::tensor(const std::string& name, const Value* v, const std::vector<int64_t>& shape,
                      size_t begin, size_t count, float* out) const {
  const std::string where = file.path() + ": " + name;
  if (!v) throw Error(where + ": missing from the state dict");
  if (v->kind != Value::Tensor)
    throw Error(where + ": is a " + kind_name(v->kind) + ", not a tensor");
  const TensorRef& t = v->tensor;
  if (t.size != shape)
    throw Error(where + ": shape " + shape_str(t.size) + ", expected " + shape_str(shape));
  const size_t es = storage_element_size(t.storage);
  if (t.storage != "FloatStorage" && t.storage != "BFloat16Storage" && t.storage != "HalfStorage" &&
      t.storage != "DoubleStorage")
    throw Error(where + ": unsupported dtype " + t.storage +
                " (need float32/bfloat16/float16/float64)");
  const ZipEntry& e = zip.entry(prefix + "data/" + t.key);
  if (uint64_t(t.storage_numel) > e.size / es || e.size != uint64_t(t.storage_numel) * es)
    throw Error(where + ": storage record has " + std::to_string(e.size) + " bytes, expected " +
                std::to_string(t.storage_numel) + " x " + std::to_string(es));
  // bounds: offset + sum((size-1)*stride) < numel, overflow-safe
  int64_t numel = 1, last = t.offset;
  if (t.offset < 0) throw Error(where + ": negative storage offset");
  for (size_t i = 0; i < shape.size(); ++i) {
    if (t.stride[i] < 0 || shape[i] < 0) throw Error(where + ": negative size or stride");
    int64_t span = 0;
    if (__builtin_mul_overflow(numel, shape[i], &numel) ||
        (shape[i] > 0 && (__builtin_mul_overflow(shape[i] - 1, t.stride[i], &span) ||
                          __builtin_add_overflow(last, span, &last))))
      throw Error(where + ": view out of bounds");
  }
  if (numel > 0 && last >= t.storage_numel) throw Error(where + ": view runs past its storage");
  if (begin > size_t(numel) || count > size_t(numel) - begin)
    throw Error(where + ": elements [" + std::to_string(begin) + ", +" + std::to_string(count) +
                ") of " + std::to_string(numel));  // (a caller's bug)
  if (count == 0) return;
  const uint8_t* base = zip.data(e);
  if (t.stride == full_view(t, shape).stride) {  // contiguous: one pass
    const uint8_t* src = base + (t.offset + int64_t(begin)) * es;
    if (t.storage == "FloatStorage") {
      std::memcpy(out, src, count * 4);
      return;
    }
    if (t.storage == "BFloat16Storage") {
      for (size_t k = 0; k < count; ++k) {
        uint16_t h;
        std::memcpy(&h, src + 2 * k, 2);
        out[k] = bf16_to_f32(h);
      }
      return;
    }
  }
  std::vector<int64_t> idx(shape.size(), 0);  // the multi-index of element `begin`
  for (size_t i = shape.size(), rest = begin; i-- > 0;)
    idx[i] = int64_t(rest % size_t(shape[i])), rest /= size_t(shape[i]);
  for (size_t k = 0; k < count; ++k) {
    int64_t off = t.offset;
    for (size_t i = 0; i < shape.size(); ++i) off += idx[i] * t.stride[i];
    const uint8_t* p = base + off * es;
    float x;
    if (es == 4)
      std::memcpy(&x, p, 4);
    else if (t.storage == "DoubleStorage") {
      double dd;
      std::memcpy(&dd, p, 8);
      x = float(dd);
    } else {
      uint16_t h;
      std::memcpy(&h, p, 2);
      x = t.storage == "BFloat16Storage" ? bf16_to_f32(h) : half_to_f32(h);
    }
    out[k] = x;
    for (size_t i = shape.size(); i-- > 0;) {
      if (++idx[i] < shape[i]) break;
      idx[i] = 0;
    }
  }
}

std::string failed_name(const std::string& path) {
  const size_t slash = path.rfind('/'), dot = path.rfind('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash))
    return path.substr(0, dot) + ".FAILED" + path.substr(dot);
  return path + ".FAILED";
}

}  // namespace tq
