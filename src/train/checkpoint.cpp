#include "train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "io/model_file.h"
#include "model/config.h"

namespace tq::train {

namespace {

std::string real_text(double x) {  // exact: %.17g reads back as the same double
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}
int64_t int_of(const std::string& s) {
  return std::stoll(s);
}
double real_of(const std::string& s) {
  return std::strtod(s.c_str(), nullptr);
}

// The run's flags, in --help's order. The key in the checkpoint's "run" dict is the flag
// without its dashes, '-' read as '_'.
#define TQ_INT(flag, field, resumable)                                                             \
  ConfigField {                                                                                    \
    flag, ConfigField::Int, resumable, [](const RunConfig& r) { return std::to_string(r.field); }, \
        [](RunConfig& r, const std::string& s) { r.field = int_of(s); }                            \
  }
#define TQ_REAL(flag, field)                                                               \
  ConfigField {                                                                            \
    flag, ConfigField::Real, false, [](const RunConfig& r) { return real_text(r.field); }, \
        [](RunConfig& r, const std::string& s) { r.field = real_of(s); }                   \
  }
#define TQ_TEXT(flag, field, resumable)                                             \
  ConfigField {                                                                     \
    flag, ConfigField::Text, resumable, [](const RunConfig& r) { return r.field; }, \
        [](RunConfig& r, const std::string& s) { r.field = s; }                     \
  }

}  // namespace

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = {
      TQ_TEXT("--preset", preset, false),
      {"--dtype", ConfigField::Text, false,
       [](const RunConfig& r) { return std::string(dtype_name(r.dtype)); },
       [](RunConfig& r, const std::string& s) { r.dtype = parse_dtype(s); }},
      TQ_INT("--batch-size", B, false),
      TQ_INT("--seq-len", T, false),
      TQ_INT("--steps", steps, true),
      TQ_INT("--seed", seed, false),
      TQ_TEXT("--init-from", init_from, false),
      TQ_TEXT("--data", data, true),
      {"--data-order", ConfigField::Text, false,
       [](const RunConfig& r) { return std::string(data_order_name(r.order)); },
       [](RunConfig& r, const std::string& s) { r.order = parse_data_order(s); }},
      {"--attention", ConfigField::Text, false,
       [](const RunConfig& r) { return std::string(attention_name(r.attention)); },
       [](RunConfig& r, const std::string& s) { r.attention = parse_attention(s); }},
      TQ_INT("--grad-accum", grad_accum, false),
      {"--optimizer", ConfigField::Text, false,
       [](const RunConfig& r) { return std::string(optimizer_name(r.optimizer)); },
       [](RunConfig& r, const std::string& s) { r.optimizer = parse_optimizer(s); }},
      TQ_REAL("--learning-rate", lr),
      TQ_REAL("--beta1", adamw.beta1),
      TQ_REAL("--beta2", adamw.beta2),
      TQ_REAL("--eps", adamw.eps),
      TQ_REAL("--weight-decay", adamw.weight_decay),
      TQ_INT("--warmup-steps", warmup, false),
      {"--decay-ratio", ConfigField::Real, false,
       [](const RunConfig& r) { return r.decay_ratio ? real_text(*r.decay_ratio) : ""; },
       [](RunConfig& r, const std::string& s) {
         r.decay_ratio = s.empty() ? std::nullopt : std::optional<double>(real_of(s));
       }},
      {"--decay-type", ConfigField::Text, false,
       [](const RunConfig& r) { return std::string(decay_type_name(r.decay_type)); },
       [](RunConfig& r, const std::string& s) { r.decay_type = parse_decay_type(s); }},
      TQ_REAL("--lr-min", lr_min),
      TQ_REAL("--max-norm", max_norm),
      TQ_INT("--val-every", val_every, false),
      TQ_INT("--val-tokens", val_tokens, false),
      TQ_INT("--log-every", log_every, true),
      TQ_TEXT("--metrics", metrics, true),
      TQ_TEXT("--output", output, true),
      TQ_INT("--save-every", save_every, true),
      TQ_INT("--keep", keep, true),
  };
  return fields;
}

namespace {

std::string key_of(const char* flag) {
  std::string k = flag + 2;
  for (char& ch : k)
    if (ch == '-') ch = '_';
  return k;
}

ValuePtr v_tuple(std::vector<ValuePtr> items) {
  auto t = std::make_shared<Value>(Value::Tuple);
  t->items = std::move(items);
  return t;
}

// A scalar fp32 tensor (torch.optim keeps AdamW's step count as one).
ValuePtr scalar_tensor(PtWriter& w, float x) {
  TensorRef t = w.add_storage("FloatStorage", 1, [x](const ByteSink& emit) { emit(&x, 4); });
  return v_tensor(full_view(t, {}));
}

// The parameters torch.optim sees: a tied table is one (tok_embeddings.weight).
std::vector<StateEntry> optimizer_entries(const Config& c) {
  std::vector<StateEntry> r;
  for (StateEntry& e : state_dict_entries(c, make_layout(c)))
    if (!e.tied_copy) r.push_back(std::move(e));
  return r;
}

struct Reader {
  const std::string& path;
  const Value* get(const Value* d, const std::string& key, Value::Kind kind) const {
    const Value* v = d && d->kind == Value::Dict ? d->get(key) : nullptr;
    if (!v || v->kind != kind)
      throw Error(path + ": " + key + " is missing or not a " + kind_name(kind) +
                  " (not a checkpoint of train --data, or damaged)");
    return v;
  }
  int64_t integer(const Value* d, const std::string& key) const {
    const int64_t x = get(d, key, Value::Int)->i;
    if (x < 0) throw Error(path + ": " + key + " is negative (" + std::to_string(x) + ")");
    return x;
  }
};

}  // namespace

void save_run(const std::string& path, const Config& c, const RunConfig& rc,
              const data::ShardMeta& meta, const OptimizerArenas& a, const TrainState& st,
              const TrainRecord& rec) {
  PtWriter w;
  ValuePtr root = checkpoint_root(w, c, a.master, DType::f32, rec, rc.dtype);
  const Schedule sched =
      Schedule::make(rc.steps, rc.warmup, rc.decay_ratio, rc.decay_type, rc.lr_min);
  // the rate of the next step, as LambdaLR leaves it in the optimizer after step()
  const double next_lr = rc.lr * sched.factor(std::min(st.step, rc.steps - 1));

  ValuePtr opt = v_dict();
  const bool adamw = rc.optimizer == OptimizerKind::adamw;
  for (const StateEntry& e : optimizer_entries(c)) {
    if (!adamw) break;  // torch.optim.SGD without momentum keeps no state
    int64_t n = 1;
    for (int64_t s : e.shape) n *= s;
    const std::string pre = "state." + e.key + ".";
    dict_set(*opt, pre + "step", scalar_tensor(w, float(st.step)));
    for (const auto& moment : {std::pair{"exp_avg", &a.m}, std::pair{"exp_avg_sq", &a.v}}) {
      const ParamReader* read = moment.second;
      TensorRef t = w.add_storage("FloatStorage", n, [=, &c](const ByteSink& emit) {
        encode_entry(emit, c, e, *read, DType::f32);
      });
      dict_set(*opt, pre + moment.first, v_tensor(full_view(t, e.shape)));
    }
  }
  for (const StateEntry& e : optimizer_entries(c)) {
    const std::string pre = "param_groups." + e.key + ".";
    dict_set(*opt, pre + "lr", v_float(next_lr));
    dict_set(*opt, pre + "initial_lr", v_float(rc.lr));
    if (adamw) {
      dict_set(*opt, pre + "betas", v_tuple({v_float(rc.adamw.beta1), v_float(rc.adamw.beta2)}));
      dict_set(*opt, pre + "eps", v_float(rc.adamw.eps));
      dict_set(*opt, pre + "weight_decay", v_float(rc.adamw.weight_decay));
      dict_set(*opt, pre + "amsgrad", v_bool(false));
      dict_set(*opt, pre + "capturable", v_bool(false));
    } else {
      dict_set(*opt, pre + "momentum", v_float(0));
      dict_set(*opt, pre + "dampening", v_float(0));
      dict_set(*opt, pre + "weight_decay", v_float(0));
      dict_set(*opt, pre + "nesterov", v_bool(false));
    }
    dict_set(*opt, pre + "maximize", v_bool(false));
    dict_set(*opt, pre + "foreach", v_none());
    dict_set(*opt, pre + "differentiable", v_bool(false));
    dict_set(*opt, pre + "fused", v_none());
  }
  dict_set(*root, "optimizer", opt);

  ValuePtr sched_state = v_dict();
  dict_set(*sched_state, "base_lrs", v_list({v_float(rc.lr)}));
  dict_set(*sched_state, "last_epoch", v_int(st.step));
  dict_set(*sched_state, "_step_count", v_int(st.step + 1));
  dict_set(*sched_state, "_get_lr_called_within_step", v_bool(false));
  dict_set(*sched_state, "_last_lr", v_list({v_float(next_lr)}));
  dict_set(*sched_state, "lr_lambdas", v_list({v_none()}));
  dict_set(*root, "lr_scheduler", sched_state);

  ValuePtr d = v_dict();
  dict_set(*d, "epoch", v_int(int64_t(st.epoch)));
  dict_set(*d, "position", v_int(int64_t(st.position)));
  dict_set(*d, "tokens_seen", v_int(int64_t(st.tokens)));
  dict_set(*d, "tokenizer_sha256", v_str(meta.tokenizer_sha256));
  dict_set(*d, "vocab_size", v_int(meta.vocab_size));
  dict_set(*d, "eos_id", v_int(meta.eos_id));
  dict_set(*d, "train_tokens", v_int(int64_t(meta.train.tokens)));
  dict_set(*d, "val_tokens", v_int(int64_t(meta.val.tokens)));
  dict_set(*root, "data", d);

  ValuePtr shuffle = v_dict();
  dict_set(*shuffle, "generator", v_str("std::mt19937_64, seed_seq{seed, epoch} per epoch"));
  dict_set(*shuffle, "seed", v_int(rc.seed));
  dict_set(*shuffle, "epoch", v_int(int64_t(st.epoch)));
  ValuePtr rng = v_dict();
  dict_set(*rng, "data_order", shuffle);
  dict_set(*root, "rng", rng);

  ValuePtr run = v_dict();
  for (const ConfigField& f : config_fields()) {
    const std::string s = f.get(rc);
    ValuePtr v = f.kind == ConfigField::Int    ? v_int(int_of(s))
                 : f.kind == ConfigField::Text ? v_str(s)
                 : s.empty()                   ? v_none()
                                               : v_float(real_of(s));
    dict_set(*run, key_of(f.flag), v);
  }
  // the job's ranks (not a flag: mpirun's -np): with grad_accum, the global batch a resume
  // keeps
  dict_set(*run, "ranks", v_int(rc.ranks));
  dict_set(*root, "run", run);
  w.save(path, *root);
}

RunConfig read_run_config(const std::string& path, RunShards* shards) {
  // its pickle only: the records' CRC-32s (every tensor's bytes) are load_run's to check, once
  const PtReader pt(path, false);
  const Reader r{path};
  const Value* run = pt.root->kind == Value::Dict ? pt.root->get("run") : nullptr;
  if (!run || run->kind != Value::Dict)
    throw Error(path + " has no run configuration: --resume continues a checkpoint of train " +
                "--data (this one is a walkthrough's or another program's)");
  RunConfig rc;
  for (const ConfigField& f : config_fields()) {
    const std::string key = key_of(f.flag);
    const Value* v = run->get(key);
    std::string s;
    if (f.kind == ConfigField::Int)
      s = std::to_string(r.get(run, key, Value::Int)->i);
    else if (f.kind == ConfigField::Text)
      s = r.get(run, key, Value::Str)->s;
    else if (!v || v->kind != Value::None)
      s = real_text(r.get(run, key, Value::Float)->f);
    try {
      f.set(rc, s);
    } catch (const std::exception& e) {
      throw Error(path + ": run." + key + ": " + e.what());
    }
  }
  // (a checkpoint of one process may predate the key)
  if (const Value* ranks = run->get("ranks")) {
    if (ranks->kind != Value::Int || ranks->i < 1 || ranks->i > (1 << 24))
      throw Error(path + ": run.ranks is not a number of ranks");
    rc.ranks = ranks->i;
  }
  rc.resume = path;
  if (shards) {
    const Value* d = r.get(pt.root.get(), "data", Value::Dict);
    shards->tokenizer_sha256 = r.get(d, "tokenizer_sha256", Value::Str)->s;
    const int64_t v = r.integer(d, "vocab_size"), e = r.integer(d, "eos_id");
    if (v > INT32_MAX || e >= v)
      throw Error(path + ": data.vocab_size " + std::to_string(v) + " and data.eos_id " +
                  std::to_string(e) + " are not a tokenizer's");
    shards->vocab_size = uint32_t(v), shards->eos_id = uint32_t(e);
  }
  return rc;
}

TrainState load_run(const std::string& path, const Config& c, const RunConfig& rc,
                    const data::ShardMeta& meta, const ParamSink& master, const ParamSink& m,
                    const ParamSink& v) {
  const PtReader pt(path);
  const Reader r{path};
  const Value* root = pt.root.get();
  TrainState st;
  st.step = r.integer(root, "steps");
  if (st.step >= rc.steps)
    throw Error(path + " is at step " + std::to_string(st.step) + " of " +
                std::to_string(rc.steps) + ": nothing left to run (give a larger --steps)");
  const Value* d = r.get(root, "data", Value::Dict);
  const auto same = [&](const char* what, const std::string& here, const std::string& there) {
    if (here != there)
      throw Error("--data " + rc.data + " is not the data " + path + " trained on: its " + what +
                  " is " + here + ", the checkpoint's " + there);
  };
  same("tokenizer (SHA-256)", meta.tokenizer_sha256, r.get(d, "tokenizer_sha256", Value::Str)->s);
  same("train split (tokens)", std::to_string(meta.train.tokens),
       std::to_string(r.integer(d, "train_tokens")));
  same("val split (tokens)", std::to_string(meta.val.tokens),
       std::to_string(r.integer(d, "val_tokens")));
  st.epoch = uint64_t(r.integer(d, "epoch"));
  st.position = uint64_t(r.integer(d, "position"));
  st.tokens = uint64_t(r.integer(d, "tokens_seen"));
  const Value* sched = r.get(root, "lr_scheduler", Value::Dict);
  if (r.integer(sched, "last_epoch") != st.step)
    throw Error(path + ": lr_scheduler.last_epoch " +
                std::to_string(r.integer(sched, "last_epoch")) + " is not its step count " +
                std::to_string(st.step));
  for (const ValuePtr& x : r.get(root, "losses", Value::List)->items) {
    if (x->kind != Value::Float) throw Error(path + ": losses holds a " + kind_name(x->kind));
    st.losses.push_back(x->f);
  }
  if (int64_t(st.losses.size()) != st.step)
    throw Error(path + ": " + std::to_string(st.losses.size()) + " losses for " +
                std::to_string(st.step) + " steps");

  // the arenas: each tensor's runs read by pieces (no copy of a tensor is held)
  std::vector<float> piece(kLoadPiece);
  const auto restore = [&](const std::string& name, const Value* t, const StateEntry& e,
                           const ParamSink& arena) {
    if (t && t->kind == Value::Tensor && t->tensor.storage != "FloatStorage")
      throw Error(path + ": " + name + " is " + t->tensor.storage +
                  ", not float32: only a checkpoint of train --data resumes exactly");
    for (const ArenaRun& run : entry_runs(c, e))
      for (size_t i = 0, k; i < run.n; i += k) {
        k = std::min(run.n - i, piece.size());
        pt.tensor(name, t, e.shape, run.dense + i, k, piece.data());
        arena(run.arena + i, piece.data(), k);
      }
  };
  const Value* model = r.get(root, "model", Value::Dict);
  for (const StateEntry& e : state_dict_entries(c, make_layout(c)))
    if (!e.tied_copy) restore(e.key, model->get(e.key), e, master);
  const Value* opt = r.get(root, "optimizer", Value::Dict);
  if (rc.optimizer == OptimizerKind::adamw) {
    for (const StateEntry& e : optimizer_entries(c)) {
      const std::string pre = "state." + e.key + ".";
      const Value* step = r.get(opt, pre + "step", Value::Tensor);
      float count = 0;
      pt.tensor(pre + "step", step, {}, 0, 1, &count);
      if (double(count) != double(st.step))
        throw Error(path + ": " + pre + "step is " + real_text(count) + ", not " +
                    std::to_string(st.step));
      restore(pre + "exp_avg", opt->get(pre + "exp_avg"), e, m);
      restore(pre + "exp_avg_sq", opt->get(pre + "exp_avg_sq"), e, v);
    }
  } else if (opt->get("state.tok_embeddings.weight.exp_avg")) {
    throw Error(path + " holds AdamW's moments but the run is sgd");
  }
  return st;
}

}  // namespace tq::train
