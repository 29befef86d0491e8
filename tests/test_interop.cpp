// safetensors reader/writer and importing weights under every accepted naming, with the
// hostile files a reader must reject cleanly (run under ASan/UBSan too).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "io/export.h"
#include "io/model_file.h"
#include "io/safetensors.h"

namespace tq {
namespace {

namespace fs = std::filesystem;

std::string tmp(const std::string& name) {
  return "/tmp/tq_interop_" + std::to_string(getpid()) + "_" + name;
}
void write_all(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary).write(data.data(), std::streamsize(data.size()));
}
std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
// A safetensors file from a header string and a data buffer.
std::string st_bytes(const std::string& header, const std::string& buffer) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
  return s + header + buffer;
}
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

Config small(bool tied) {
  //        name     V   C   L  H  KVH D  F   ctx  theta tied eps
  return {"small", 50, 16, 2, 4, 2, 8, 24, 64, 1e6, tied, 1e-6f};
}
std::vector<float> params_of(const Config& c) {
  std::vector<float> w(make_layout(c).total);
  for (size_t i = 0; i < w.size(); ++i) w[i] = round_bf16(std::sin(0.37f * float(i)));
  return w;
}
// The weights of a model file as load_params puts them in the arena; source_reader (export's
// reader, straight from the file) must read every range of them alike, across tensors too.
std::vector<float> load(const std::string& path, const Config& c) {
  const ModelFile mf = open_model_file(path);
  std::vector<float> back(make_layout(c).total, NAN);
  load_params(mf, c, [&](size_t off, const float* x, size_t n) {
    std::copy(x, x + n, back.begin() + ptrdiff_t(off));
  });
  const ParamReader read = source_reader(mf, c);
  std::vector<float> direct(back.size(), NAN);
  for (size_t off = 0, n; off < direct.size(); off += n) {
    n = std::min<size_t>(97, direct.size() - off);
    read(off, n, direct.data() + off);
  }
  EXPECT_EQ(direct, back) << path;
  return back;
}

TEST(Safetensors, WritesAlignedSortedFilesAndReadsThemBack) {
  const std::string path = tmp("a.safetensors");
  std::vector<StOutTensor> t;
  t.push_back({"b16", "BF16", {3}, [](const ByteSink& emit) {
                 const uint8_t o[6] = {0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f};
                 emit(o, 6);
               }});
  t.push_back({"f32", "F32", {2, 2}, [](const ByteSink& emit) {  // by pieces
                 const float v[4] = {1, 2, 3, 4};
                 emit(v, 4), emit(v + 1, 12);
               }});
  t.push_back({"scalar", "F64", {}, [](const ByteSink& emit) {
                 const double v = 0.5;
                 emit(&v, 8);
               }});
  t.push_back({"empty", "F32", {0, 5}, [](const ByteSink&) {}});
  save_safetensors(path, t, {{"format", "pt"}});
  const SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  uint64_t hlen = 0;
  std::memcpy(&hlen, read_all(path).data(), 8);
  EXPECT_EQ(hlen % 8, 0u);               // the buffer starts 8-aligned...
  for (const StTensor& x : f.tensors())  // ...and each tensor is naturally aligned
    EXPECT_EQ(x.begin % st_dtype_size(x.dtype), 0u) << x.name;
  EXPECT_EQ(f.tensors()[0].name, "scalar");  // element size descending, then name
  EXPECT_EQ(f.find("f32")->shape, (std::vector<int64_t>{2, 2}));
  float v[4];
  std::memcpy(v, f.data(*f.find("f32")), 16);
  EXPECT_EQ(v[3], 4.0f);
  EXPECT_EQ(f.find("empty")->begin, f.find("empty")->end);
  EXPECT_EQ(f.find("missing"), nullptr);
  std::remove(path.c_str());
  // a tensor whose fill emits other than its size: an error, and no file
  for (size_t n : {size_t(12), size_t(20)}) {
    const std::string bad = tmp("bad.safetensors");
    std::vector<StOutTensor> b;
    b.push_back({"f32", "F32", {2, 2}, [n](const ByteSink& emit) {
                   const float v[5] = {1, 2, 3, 4, 5};
                   emit(v, n);
                 }});
    EXPECT_THROW(save_safetensors(bad, b, {}), Error) << n;
    EXPECT_FALSE(std::ifstream(bad).good()) << n;
  }
}

TEST(Safetensors, RejectsHostileHeaders) {
  const std::string path = tmp("bad.safetensors");
  const std::string f32x2(8, '\0');
  auto reject = [&](const std::string& bytes, const std::string& what) {
    write_all(path, bytes);
    const std::string e = error_of([&] { SafetensorsFile f(path); });
    EXPECT_NE(e.find(what), std::string::npos) << "expected '" << what << "', got: " << e;
  };
  const std::string ok = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_all(path, st_bytes(ok, f32x2));
  EXPECT_NO_THROW(SafetensorsFile f(path));
  reject("", "too short");
  reject(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10), "exceeds the limit");
  reject(st_bytes(ok, f32x2).substr(0, 40), "runs past the end");
  reject(st_bytes("[" + ok + "]", f32x2), "does not start with '{'");
  reject(st_bytes("{\"x\":", ""), "not valid JSON");
  reject(st_bytes("{\"x\":\"\xff\xfe\"}", ""), "not valid JSON");  // invalid UTF-8
  reject(st_bytes(std::string(200, '{'), ""), "nested too deeply");
  reject(st_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  f32x2),
         "repeats the key 'x'");
  reject(st_bytes(R"({"x":{"dtype":"F4","shape":[2],"data_offsets":[0,8]}})", f32x2),
         "unknown dtype 'F4'");
  reject(st_bytes(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2),
         "non-negative integer");
  reject(st_bytes(R"({"x":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", f32x2),
         "non-negative integer");
  reject(st_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", f32x2),
         "data_offsets must be");
  reject(st_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f32x2),
         "begin after end");
  reject(st_bytes(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2),
         "needs 3 x 4");
  reject(st_bytes(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,16],)"
                  R"("data_offsets":[0,8]}})",
                  f32x2),
         "overflows");
  reject(st_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2),
         "(gap before it)");
  reject(st_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  f32x2),
         "overlaps");
  reject(st_bytes(ok, f32x2 + "junk"), "trailing bytes");
  reject(st_bytes(ok, f32x2.substr(0, 4)), "truncated");
  reject(st_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", f32x2),
         "unknown field 'extra'");
  reject(st_bytes(R"({"__metadata__":{"n":1},"x":{"dtype":"F32","shape":[2],)"
                  R"("data_offsets":[0,8]}})",
                  f32x2),
         "is not a string");
  reject(st_bytes(R"({"x":[1,2]})", f32x2), "not an object");
  std::remove(path.c_str());
}

TEST(Safetensors, RandomCorruptionNeverCrashes) {
  const Config c = small(true);
  const std::vector<float> w = params_of(c);
  const std::string dir = tmp("fuzz_hf");
  export_hf(dir, c, arena_reader(w.data()), DType::bf16, nullptr);
  const std::string good = read_all(dir + "/model.safetensors");
  const std::string bad = tmp("fuzz.safetensors");
  std::mt19937 rng(7);
  int accepted = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    std::string m = good;
    if (trial % 5 == 0) {
      m.resize(rng() % m.size());
    } else {  // corrupt mostly the header, where the structure is
      const size_t hlen = std::min<size_t>(m.size(), 8 + 2000);
      for (int k = 0; k < 1 + trial % 3; ++k) m[rng() % hlen] = char(rng());
    }
    write_all(bad, m);
    try {
      std::vector<float> back = load(bad, c);
      ++accepted;  // a flipped data byte, or one inside a name/number that still parses
    } catch (const Error&) {
    }
  }
  EXPECT_LT(accepted, 1500);
  fs::remove_all(dir);
  std::remove(bad.c_str());
}

// A .pt state dict of c's weights under arbitrary names, built entry by entry.
struct PtDict {
  PtWriter w;
  ValuePtr sd = v_dict(true);
  void add(const std::string& name, std::vector<int64_t> shape, std::vector<float> v,
           const std::string& storage = "FloatStorage") {
    const int64_t n = int64_t(v.size());
    TensorRef t = w.add_storage(storage, n, [v, storage](const ByteSink& emit) {
      for (size_t i = 0; i < v.size(); ++i) {
        if (storage == "FloatStorage") {
          emit(&v[i], 4);
        } else {  // LongStorage
          const int64_t x = int64_t(v[i]);
          emit(&x, 8);
        }
      }
    });
    dict_set(*sd, name, v_tensor(full_view(t, std::move(shape))));
  }
};
// Titan key -> (shape, dense values) of c's weights w.
std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> dense(
    const Config& c, const std::vector<float>& w) {
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> m;
  for (const StateEntry& e : state_dict_entries(c, make_layout(c))) {
    size_t n = 1;
    for (int64_t s : e.shape) n *= size_t(s);
    std::vector<float> v(n);
    for (const ArenaRun& r : entry_runs(c, e))
      std::copy_n(w.begin() + ptrdiff_t(r.arena), r.n, v.begin() + ptrdiff_t(r.dense));
    m[e.key] = {e.shape, v};
  }
  return m;
}

TEST(Import, FusedOldAndWrappedTorchTitanNamesLoadExactly) {
  const Config c = small(false);
  const std::vector<float> w = params_of(c);
  const auto d = dense(c, w);
  const ParamLayout p = make_layout(c);
  PtDict f;  // fused qkv, older names (attention.wo stays), `output.weight`, DDP prefix
  for (const auto& [k, sv] : d) {
    if (k.find("qkv_linear.wk") != std::string::npos ||
        k.find("qkv_linear.wv") != std::string::npos)
      continue;
    if (k.find("qkv_linear.wq") != std::string::npos) {
      const int64_t l = std::atoll(k.c_str() + 7);
      const size_t off = p.layers[size_t(l)].wqkv, n = size_t(c.qkv_rows() * c.C);
      f.add("module.layers." + std::to_string(l) + ".attention.qkv_linear.wqkv.weight",
            {c.qkv_rows(), c.C},
            std::vector<float>(w.begin() + ptrdiff_t(off), w.begin() + ptrdiff_t(off + n)));
      continue;
    }
    f.add("module." + (k == "lm_head.weight" ? std::string("output.weight") : k), sv.first,
          sv.second);
  }
  const std::string path = tmp("fused.pt");
  f.w.save(path, *f.sd);
  EXPECT_EQ(load(path, c), w);

  PtDict o;  // older TorchTitan's unfused attention names
  for (const auto& [k, sv] : d) {
    std::string name = k;
    if (const size_t q = name.find("qkv_linear."); q != std::string::npos) name.erase(q, 11);
    o.add(name, sv.first, sv.second);
  }
  o.w.save(path, *o.sd);
  EXPECT_EQ(load(path, c), w);
  std::remove(path.c_str());
}

TEST(Import, HuggingFaceFoldersRoundTripTiedAndUntied) {
  for (bool tied : {true, false}) {
    const Config c = small(tied);
    const std::vector<float> w = params_of(c);
    const std::string dir = tmp(tied ? "hf_tied" : "hf_untied");
    TrainRecord rec;
    rec.seq_len = 16, rec.final_loss = 1.25, rec.initial_loss = 3.5;
    export_hf(dir, c, arena_reader(w.data()), DType::bf16, &rec);
    const SafetensorsFile st(dir + "/model.safetensors");
    EXPECT_EQ(st.find("lm_head.weight") != nullptr, !tied);  // the tied weight once
    EXPECT_NE(st.find("model.layers.1.self_attn.q_proj.weight"), nullptr);
    EXPECT_NE(st.find("model.layers.1.mlp.gate_proj.weight"), nullptr);
    EXPECT_EQ(load(dir, c), w) << "tied=" << tied;
    const ModelFile mf = open_model_file(dir);
    ASSERT_TRUE(mf.record);
    EXPECT_EQ(mf.record->final_loss, 1.25);
    EXPECT_EQ(mf.record->seq_len, 16);
    EXPECT_EQ(mf.dtype, DType::bf16);
    // config.json must agree with the weights
    std::string cfg = read_all(dir + "/config.json");
    cfg.replace(cfg.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": 3");
    write_all(dir + "/config.json", cfg);
    EXPECT_NE(error_of([&] { load(dir, c); }).find("config.json: num_hidden_layers is 3"),
              std::string::npos);
    fs::remove_all(dir);
  }
}

// An export that fails part way (here config.json's temporary cannot be made) leaves an earlier
// export in the folder as it was, every file (none is renamed before all three are written),
// and a folder it made itself is removed.
TEST(Export, HuggingFaceFolderIsReplacedWholeOrNotAtAll) {
  const Config c = small(true);
  std::vector<float> w = params_of(c), w2 = w;
  for (float& x : w2) x = -x;
  const std::string dir = tmp("hf_whole"),
                    blocker = dir + "/config.json.tmp." + std::to_string(getpid());
  export_hf(dir, c, arena_reader(w.data()), DType::f32, nullptr);
  const std::string weights = read_all(dir + "/model.safetensors");
  fs::create_directory(blocker);
  EXPECT_NE(error_of([&] {
              export_hf(dir, c, arena_reader(w2.data()), DType::f32, nullptr);
            }).find("cannot create"),
            std::string::npos);
  fs::remove(blocker);
  EXPECT_TRUE(read_all(dir + "/model.safetensors") == weights)
      << "the earlier weights were replaced";
  EXPECT_TRUE(load(dir, c) == w) << "the folder no longer loads as the earlier export";
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) ++files, (void)e;
  EXPECT_EQ(files, 3u) << "a temporary was left behind";
  export_hf(dir, c, arena_reader(w2.data()), DType::f32, nullptr);  // unblocked: replaced whole
  EXPECT_EQ(load(dir, c), w2);
  fs::remove_all(dir);
  // a folder the failed export made (weights that cannot be read, half way) is gone again
  const std::string fresh = tmp("hf_fresh");
  int reads = 0;
  const ParamReader failing = [&](size_t off, size_t n, float* out) {
    if (++reads == 3) throw Error("weights unreadable");
    std::memcpy(out, w.data() + off, n * 4);
  };
  EXPECT_EQ(error_of([&] { export_hf(fresh, c, failing, DType::f32, nullptr); }),
            "weights unreadable");
  EXPECT_GE(reads, 3);
  EXPECT_FALSE(fs::exists(fresh)) << "the failed export left the folder it made";
}

TEST(Import, ShardedIndexLoadsAndIsChecked) {
  const Config c = small(true);
  const std::vector<float> w = params_of(c);
  const std::string dir = tmp("sharded");
  export_hf(dir, c, arena_reader(w.data()), DType::f32, nullptr);
  // split model.safetensors into two shards by tensor name
  const SafetensorsFile whole(dir + "/model.safetensors");
  std::vector<StOutTensor> a, b;
  std::string map;
  for (const StTensor& t : whole.tensors()) {
    const bool first = t.name.find("layers.1.") == std::string::npos;
    const SafetensorsFile* f = &whole;
    (first ? a : b).push_back({t.name, t.dtype, t.shape, [f, t](const ByteSink& emit) {
                                 emit(f->data(t), t.end - t.begin);
                               }});
    map += (map.empty() ? "" : ",") + ("\"" + t.name + "\":\"") +
           (first ? "model-00001-of-00002.safetensors\"" : "model-00002-of-00002.safetensors\"");
  }
  save_safetensors(dir + "/model-00001-of-00002.safetensors", a, {{"format", "pt"}});
  save_safetensors(dir + "/model-00002-of-00002.safetensors", b, {{"format", "pt"}});
  fs::remove(dir + "/model.safetensors");
  write_all(dir + "/model.safetensors.index.json",
            "{\"metadata\":{\"total_size\":1},\"weight_map\":{" + map + "}}");
  EXPECT_EQ(load(dir, c), w);
  write_all(dir + "/model.safetensors.index.json",
            "{\"weight_map\":{\"model.norm.weight\":\"../etc/passwd\"}}");
  EXPECT_NE(error_of([&] { load(dir, c); }).find("is not a file name in its folder"),
            std::string::npos);
  write_all(dir + "/model.safetensors.index.json",
            "{\"weight_map\":{\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}");
  EXPECT_NE(error_of([&] { load(dir, c); }).find("which does not hold it"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Import, MismatchesNameTheKeyAndBothShapes) {
  const Config c = small(true);
  const std::vector<float> w = params_of(c);
  const auto d = dense(c, w);
  const std::string path = tmp("mm.pt");
  auto error_with = [&](const std::function<void(PtDict&)>& edit, const Config& as) {
    PtDict f;
    for (const auto& [k, sv] : d) f.add(k, sv.first, sv.second);
    edit(f);
    f.w.save(path, *f.sd);
    return error_of([&] { load(path, as); });
  };
  auto drop = [](PtDict& f, const std::string& key) {
    auto& v = f.sd->dict;
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i].first->s == key) v.erase(v.begin() + ptrdiff_t(i));
  };
  EXPECT_NE(error_with([&](PtDict& f) { drop(f, "norm.weight"); }, c).find("norm.weight: missing"),
            std::string::npos);
  EXPECT_NE(
      error_with(
          [](PtDict& f) { f.add("layers.0.attention.wo.bias", {16}, std::vector<float>(16)); }, c)
          .find("(Qwen3 has no biases)"),
      std::string::npos);
  EXPECT_NE(error_with(
                [](PtDict& f) {
                  f.add("layers.0.attention.wq.weight", {32, 16}, std::vector<float>(512));
                },
                c)
                .find("are the same layers.0.attention.qkv_linear.wq.weight"),
            std::string::npos);
  EXPECT_NE(
      error_with([](PtDict& f) { f.add("layers.2.ffn_norm.weight", {16}, std::vector<float>(16)); },
                 c)
          .find("(it has 2 layers)"),
      std::string::npos);
  EXPECT_NE(error_with(
                [&](PtDict& f) {
                  drop(f, "norm.weight");
                  f.add("norm.weight", {16}, std::vector<float>(16), "LongStorage");
                },
                c)
                .find("norm.weight: dtype int64 is not a floating-point weight"),
            std::string::npos);
  EXPECT_NE(error_with(
                [&](PtDict& f) {
                  drop(f, "norm.weight");
                  f.add("norm.weight", {17}, std::vector<float>(17));
                },
                c)
                .find("norm.weight: shape [17] but small needs [16]"),
            std::string::npos);
  // tied preset, separate lm_head with other values; untied preset, no lm_head at all
  EXPECT_NE(error_with(
                [&](PtDict& f) {
                  drop(f, "lm_head.weight");
                  f.add("lm_head.weight", {50, 16}, std::vector<float>(800, 0.5f));
                },
                c)
                .find("lm_head.weight differs from tok_embeddings.weight"),
            std::string::npos);
  EXPECT_NE(error_with([&](PtDict& f) { drop(f, "lm_head.weight"); }, small(false))
                .find("no lm_head.weight, but small has an output layer of its own"),
            std::string::npos);
  std::remove(path.c_str());
}

TEST(Import, PresetIsInferredFromShapes) {
  const Config& c = preset("debugmodel");
  std::vector<float> w(make_layout(c).total, 0.125f);
  const std::string dir = tmp("debug_hf");
  export_hf(dir, c, arena_reader(w.data()), DType::bf16, nullptr);
  const ModelFile mf = open_model_file(dir + "/model.safetensors");  // the file, config beside it
  EXPECT_EQ(resolve_preset(mf).name, "debugmodel");
  EXPECT_NE(error_of([&] {
              resolve_preset(mf, "0.6B");
            }).find("model.embed_tokens.weight: shape [2048, 256] but 0.6B needs [151936, 1024]"),
            std::string::npos);
  fs::remove_all(dir);
  EXPECT_NE(error_of([] { open_model_file("/nonexistent/model.safetensors"); }).find("cannot open"),
            std::string::npos);
}

}  // namespace
}  // namespace tq
