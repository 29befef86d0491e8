#include "train/trainer.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu/runtime.h"
#include "data/shard.h"
#include "dist/group.h"
#include "infer/generate.h"
#include "io/checkpoint.h"
#include "io/model_file.h"
#include "model/config.h"
#include "model/init.h"
#include "model/qwen3.h"
#include "train/checkpoint.h"
#include "train/metrics.h"

namespace tq::train {

size_t optimizer_bytes(const RunConfig& rc, size_t params) {
  // master, AdamW's m, v (a rank's share where sharded); the accumulated gradient, a
  // micro-batch's gradient (with accumulation)
  const size_t shard =
      rc.shard_optimizer && rc.ranks > 1 ? dist::split_ranges(params, int(rc.ranks))[1] : params;
  return sizeof(float) * (shard * (1 + (rc.optimizer == OptimizerKind::adamw ? 2 : 0)) +
                          params * (1 + (rc.grad_accum > 1)));
}

namespace {

// An fp32 array in the backend's memory (the device's, for CUDA), released with it; n = 0
// holds none.
struct BackendArray {
  const Ops& ops;
  float* p;
  BackendArray(const Ops& o, size_t n)
      : ops(o), p(n ? static_cast<float*>(o.alloc(n * sizeof(float))) : nullptr) {}
  ~BackendArray() {
    if (p) ops.release(p);
  }
  BackendArray(const BackendArray&) = delete;
  BackendArray& operator=(const BackendArray&) = delete;
  // For an array that holds parameters [lo, hi) of the layout (a rank's share; all of them
  // unsharded): the part of each piece [off, off + k) in that range.
  ParamSink sink(size_t lo, size_t hi) const {
    return [this, lo, hi](size_t off, const float* x, size_t k) {
      const size_t b = std::max(off, lo), e = std::min(off + k, hi);
      if (b < e) ops.upload(p + (b - lo), x + (b - off), (e - b) * sizeof(float));
    };
  }
  ParamReader reader() const {
    return [this](size_t off, size_t k, float* out) { ops.download(out, p + off, k * 4); };
  }
};

// SIGINT, SIGTERM and SIGUSR1 (which mpirun passes on to its ranks, where it ends the job on
// the other two), while a run trains: noted, so that the run saves at the end of the step and
// stops (every rank of a job: the step's exchange shares it); the handler then goes back to the
// default, so that a second signal ends the process at once (the checkpoint being written is a
// temporary: the last one stays whole).
volatile std::sig_atomic_t g_signal = 0;
extern "C" void note_signal(int sig) {
  g_signal = sig;
}

class StopSignals {
 public:
  StopSignals() {
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = note_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGUSR1, &sa, &old_usr1_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGUSR1, &old_usr1_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  int caught() const { return g_signal; }

 private:
  struct sigaction old_int_ {
  }, old_term_{}, old_usr1_{};
};

// Tidies a checkpoint folder: removes the temporaries of saves whose process is gone (a run
// killed mid-save: step-NNNNNNNN.pt.tmp.PID) and, with keep > 0, all but the newest `keep`
// step-NNNNNNNN.pt (a FAILED one stays).
void tidy_checkpoints(const std::string& dir, int64_t keep) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::vector<std::string> stale;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (const size_t t = n.find(".pt.tmp."); n.compare(0, 5, "step-") == 0 && t != n.npos) {
        const std::string pid = n.substr(t + 8);
        if (!pid.empty() && pid.size() < 10 &&
            pid.find_first_not_of("0123456789") == std::string::npos &&
            kill(pid_t(std::stol(pid)), 0) != 0 && errno == ESRCH)
          stale.push_back(n);
        continue;
      }
      if (n.size() < 12 || n.compare(0, 5, "step-") != 0 || n.compare(n.size() - 3, 3, ".pt") != 0)
        continue;
      const std::string digits = n.substr(5, n.size() - 8);
      if (digits.size() < 8 || digits.size() > 18 ||
          digits.find_first_not_of("0123456789") != std::string::npos)
        continue;
      found.emplace_back(std::stoll(digits), n);
    }
    closedir(d);
  }
  std::sort(found.begin(), found.end());
  for (size_t i = 0; keep > 0 && i + size_t(keep) < found.size(); ++i)
    stale.push_back(found[i].second);
  const std::string sep = dir.back() == '/' ? "" : "/";
  for (const std::string& n : stale)
    if (std::remove((dir + sep + n).c_str()) != 0)
      std::fprintf(stderr, "warning: could not remove %s%s%s (%s)\n", dir.c_str(), sep.c_str(),
                   n.c_str(), std::strerror(errno));
}

// The mean loss over the val windows: fixed (window j is the B*T + 1 ids from j*B*T), as many
// whole ones as the first val_tokens ids hold, the same at every validation; block-causal as
// training is where eos >= 0.
struct Validator {
  const TokenStream& s;
  int64_t B, T;
  uint64_t windows;
  int32_t eos;
  Validator(const TokenStream& stream, int64_t B_, int64_t T_, int64_t val_tokens, int32_t eos_)
      : s(stream), B(B_), T(T_), eos(eos_) {
    const uint64_t per = uint64_t(B * T);
    const uint64_t have = s.size() > 0 ? s.size() - 1 : 0;
    windows = std::min<uint64_t>(uint64_t(val_tokens), have) / per;
    if (windows == 0)
      throw Error("--val-tokens " + std::to_string(val_tokens) + " with a val split of " +
                  std::to_string(s.size()) +
                  " tokens holds no whole batch (B*T = " + std::to_string(per) + ")");
  }
  // Ranks take windows j = rank, rank + size, ...; their losses are summed in window order on
  // every rank (the bits of one process's sum).
  double loss(Qwen3& model, dist::Group& g) const {
    std::vector<int32_t> buf(size_t(B * T) + 1);
    Batch b;
    b.B = B, b.T = T;
    const size_t N = size_t(g.size());
    std::vector<double> mine(windows, 0.0), all(windows * N);
    for (uint64_t j = uint64_t(g.rank()); j < windows; j += N) {
      s.read(j * uint64_t(B * T), buf.size(), buf.data());
      b.tokens.assign(buf.begin(), buf.end() - 1);
      b.targets.assign(buf.begin() + 1, buf.end());
      if (eos >= 0) mark_documents(b, eos);
      mine[j] = model.forward(b);
    }
    g.allgather(mine.data(), all.data(), windows * sizeof(double), "the validation losses");
    double sum = 0;
    for (uint64_t j = 0; j < windows; ++j) sum += all[(j % N) * windows + j];
    return sum / double(windows);
  }
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A data-parallel step's gradient buckets: PyTorch DDP's default bucket_cap_mb (25 MiB).
constexpr size_t kBucketBytes = size_t(25) << 20;

// Every rank's run configuration against rank 0's (each flag's value as checkpoints record
// it, and what the job adds): Error on a rank whose configuration differs, naming the first
// flag, and on every other rank, naming that rank.
void check_same_config(dist::Group& g, const RunConfig& rc, const Ops& ops) {
  std::vector<std::pair<std::string, std::string>> mine;
  for (const ConfigField& f : config_fields()) mine.emplace_back(f.flag, f.get(rc));
  mine.emplace_back("--resume", rc.resume);
  mine.emplace_back("--shard-optimizer", rc.shard_optimizer ? "on" : "off");
  mine.emplace_back("--backend", ops.name);
  std::string text;
  for (const auto& [flag, value] : mine) text += flag + " " + value + "\n";
  uint64_t len = text.size();
  g.broadcast(&len, sizeof len, 0, "the configuration check");
  std::string root = g.rank() == 0 ? text : std::string(len, '\0');
  g.broadcast(root.data(), len, 0, "the configuration check");
  std::string differs;
  if (root != text) {
    size_t at = 0;
    for (const auto& [flag, value] : mine) {
      const size_t end = root.find('\n', at);
      const std::string line = root.substr(at, end == root.npos ? root.npos : end - at);
      if (line != flag + " " + value) {
        const std::string theirs = line.compare(0, flag.size() + 1, flag + " ") == 0
                                       ? line.substr(flag.size() + 1)
                                       : "(" + line + ")";
        // (a number as %g reads: the texts differ in some digit, not always the first shown)
        const auto shown = [](const std::string& x) {
          char* end = nullptr;
          const double d = std::strtod(x.c_str(), &end);
          char b[32];
          std::snprintf(b, sizeof b, "%.10g", d);
          return x.empty() ? "''" : !*end && x.find('.') != x.npos ? std::string(b) : x;
        };
        differs = flag + " " + shown(value) + " is not rank 0's " + shown(theirs);
        break;
      }
      at = end == root.npos ? root.size() : end + 1;
    }
    if (differs.empty()) differs = "the configuration is not rank 0's";
  }
  const int32_t bad = !differs.empty();
  std::vector<int32_t> all(size_t(g.size()));
  g.allgather(&bad, all.data(), sizeof bad, "the configuration check");
  if (bad) throw Error(differs + ": every rank of a job must be given the same train flags");
  for (int r = 0; r < g.size(); ++r)
    if (all[size_t(r)])
      throw Error("rank " + std::to_string(r) +
                  " was given other train flags than rank 0 (its line says which)");
}

}  // namespace

int run(const RunConfig& rc, const Ops& ops, const std::optional<ModelFile>& init,
        cpu::ThreadGovernor* governor) {
  const Config& c = preset(rc.preset);
  dist::Group& g = dist::Group::world();
  const int R = g.rank(), N = g.size();
  if (rc.ranks != N)
    throw Error("the run is configured for " + std::to_string(rc.ranks) + " ranks, the job has " +
                std::to_string(N));
  g.set_timeout(rc.timeout);
  g.set_signal_flag(&g_signal);
  if (g.distributed()) check_same_config(g, rc, ops);
  if (R == 0 && output_is_folder(rc.output) && mkdir(rc.output.c_str(), 0777) != 0 &&
      errno != EEXIST)
    throw Error("--output " + rc.output + ": cannot create the folder (" + std::strerror(errno) +
                ")");
  const data::ShardMeta meta = read_shards_for(rc.data, c);
  const TokenStream train_stream(rc.data, "train", uint32_t(c.V));
  BatchLoader loader(train_stream, rc.B, rc.T, rc.order, uint64_t(rc.seed));
  std::optional<TokenStream> val_stream;
  std::optional<Validator> validator;
  // the eos that ends each document (block-causal attention), or -1 (causal)
  const int32_t eos = rc.attention == AttentionMask::block_causal ? int32_t(meta.eos_id) : -1;
  if (rc.val_every > 0) {
    val_stream.emplace(rc.data, "val", uint32_t(c.V));
    validator.emplace(*val_stream, rc.B, rc.T, rc.val_tokens, eos);
  }
  const Schedule sched =
      Schedule::make(rc.steps, rc.warmup, rc.decay_ratio, rc.decay_type, rc.lr_min);
  std::printf(
      "data: %s: %llu train tokens, %llu windows of %lld x %lld an epoch (%s, %s attention)",
      rc.data.c_str(), (unsigned long long)train_stream.size(),
      (unsigned long long)loader.windows(), (long long)rc.B, (long long)rc.T,
      data_order_name(rc.order), attention_name(rc.attention));
  if (validator)
    std::printf("; val: %llu windows every %lld steps", (unsigned long long)validator->windows,
                (long long)rc.val_every);
  std::printf("\n");
  if (rc.optimizer == OptimizerKind::adamw)
    std::printf(
        "optimizer: adamw lr %g betas (%g, %g) eps %g weight decay %g, fp32 master weights; "
        "schedule: warmup %lld, stable %lld, decay %lld (%s) to %g; max norm %g; grad accum "
        "%lld\n",
        rc.lr, rc.adamw.beta1, rc.adamw.beta2, rc.adamw.eps, rc.adamw.weight_decay,
        (long long)sched.warmup, (long long)sched.stable, (long long)sched.decay,
        decay_type_name(sched.type), rc.lr_min, rc.max_norm, (long long)rc.grad_accum);
  else
    std::printf(
        "optimizer: sgd lr %g, fp32 master weights; schedule: warmup %lld, stable %lld, decay "
        "%lld (%s) to %g; max norm %g; grad accum %lld\n",
        rc.lr, (long long)sched.warmup, (long long)sched.stable, (long long)sched.decay,
        decay_type_name(sched.type), rc.lr_min, rc.max_norm, (long long)rc.grad_accum);

  Qwen3 model(c, rc.dtype, rc.B, rc.T, ops);
  const ParamLayout& layout = model.layout();
  const size_t n = layout.total;
  // ZeRO-1: this rank keeps and steps the master weights and moments of parameters [lo, hi)
  // (all of them unsharded), then the ranks' parameters are gathered
  const bool shard = rc.shard_optimizer && N > 1;
  const std::vector<size_t> own = shard ? dist::split_ranges(n, N) : std::vector<size_t>{0, n};
  const size_t lo = shard ? own[size_t(R)] : 0, hi = shard ? own[size_t(R) + 1] : n, ns = hi - lo;
  if (g.distributed()) {
    std::printf("data parallel: %d ranks x %lld micro-batch(es) of %lld x %lld a step", N,
                (long long)rc.grad_accum, (long long)rc.B, (long long)rc.T);
    if (shard)
      std::printf(
          ", optimizer sharded (ZeRO-1): %.1f MiB of master weights and moments a rank",
          double(ns) * sizeof(float) * (rc.optimizer == OptimizerKind::adamw ? 3 : 1) / (1 << 20));
    std::printf("\n");
  }
  std::fflush(stdout);
  // the optimizer's arenas, in the backend's memory (optimizer_bytes)
  const bool adamw = rc.optimizer == OptimizerKind::adamw;
  const BackendArray master(ops, ns), gacc(ops, n), grad(ops, rc.grad_accum > 1 ? n : 0),
      m(ops, adamw ? ns : 0), v(ops, adamw ? ns : 0);
  // the weights go to the model (a bf16 run's: rounded) and this rank's master weights
  const ParamSink to_master = [&, own_master = master.sink(lo, hi)](size_t off, const float* x,
                                                                    size_t k) {
    model.set_params(x, off, k);
    own_master(off, x, k);
  };
  TrainState st;
  if (!rc.resume.empty()) {
    st = load_run(rc.resume, c, rc, meta, to_master, m.sink(lo, hi), v.sink(lo, hi));
    loader.seek(st.epoch, st.position);
    std::printf("resume: %s after step %lld of %lld (epoch %llu, window %llu of %llu)\n",
                rc.resume.c_str(), (long long)st.step, (long long)rc.steps,
                (unsigned long long)st.epoch, (unsigned long long)st.position,
                (unsigned long long)loader.windows());
  } else if (init) {
    load_params(*init, c, to_master);
    std::printf("init: %s (%s, %s)\n", rc.init_from.c_str(), init->kind.c_str(), c.name.c_str());
  } else {
    init_params(to_master, c, layout, uint64_t(rc.seed));
  }
  std::unique_ptr<dist::ArrayComm> comm;
  if (g.distributed()) comm = dist::array_comm(g, ops);

  // Samples (--prompt), on rank 0: a generation model beside the training one, given its
  // weights at each sample; built now, so that its memory is known before step 0. It reads
  // nothing the steps use, so a run's results are the same with samples or without.
  std::optional<text::Tokenizer> tok;
  std::vector<std::vector<int32_t>> prompts;
  std::unique_ptr<Qwen3> sampler;
  if (!rc.prompts.empty() && R == 0) {
    tok.emplace(text::Tokenizer::load(meta.tokenizer_path));
    for (const std::string& p : rc.prompts) {
      const std::vector<uint32_t> ids = tok->encode(p);
      if (ids.empty()) throw Error("--prompt '" + p + "' has no tokens to continue");
      prompts.emplace_back(ids.begin(), ids.end());
    }
    const int64_t T = infer::context_needed(prompts, rc.sample_tokens);
    if (T > c.max_ctx)
      throw Error("a --prompt and --sample-tokens " + std::to_string(rc.sample_tokens) + " make " +
                  std::to_string(T) + " tokens, past " + c.name + "'s context");
    const MemoryPlan mp = memory_plan(c, rc.dtype, int64_t(prompts.size()), T, ops, Use::generate);
    sampler = std::make_unique<Qwen3>(c, rc.dtype, int64_t(prompts.size()), T, ops, Use::generate);
    std::printf("samples: %zu prompt(s), %lld tokens each, %s; %.1f MiB\n", prompts.size(),
                (long long)rc.sample_tokens,
                rc.sample_every > 0
                    ? ("every " + std::to_string(rc.sample_every) + " steps").c_str()
                    : "at the end",
                double(mp.total()) / (1 << 20));
  }
  const auto sample = [&](int64_t step) {
    sampler->copy_params(model);
    infer::GenerateConfig gc;
    gc.max_new_tokens = rc.sample_tokens;
    gc.sampling.greedy = true;
    gc.eos = int32_t(meta.eos_id);
    const std::vector<infer::Generation> gens = infer::generate(*sampler, prompts, gc);
    for (size_t i = 0; i < gens.size(); ++i) {
      infer::TextStream ts(*tok);
      std::string text;
      for (int32_t id : gens[i].ids)
        if (id != gc.eos) text += ts.add(id);
      std::printf("sample at step %lld: %s%s\n", (long long)step, rc.prompts[i].c_str(),
                  (text + ts.finish()).c_str());
    }
    std::fflush(stdout);
  };

  MetricsLog log(R == 0 ? rc.metrics : std::string(), st.step);
  TrainRecord rec;
  rec.seq_len = rc.T, rec.seed = rc.seed, rec.learning_rate = rc.lr, rec.init_from = rc.init_from;
  rec.steps = st.step, rec.losses = st.losses;
  // A checkpoint of the state after st.step steps, written by rank 0 (the record's final_loss:
  // the fixed batch's, what `check` recomputes; its forward leaves nothing the next step
  // reads). Sharded, every rank sends its part of the optimizer's arenas to rank 0 first.
  const auto save = [&](const std::string& path) {
    OptimizerArenas arenas{master.reader(), m.reader(), v.reader()};
    std::vector<float> all[3];
    if (shard) {
      const BackendArray* parts[3] = {&master, &m, &v};
      std::vector<float> mine(ns);
      for (int i = 0; i < (adamw ? 3 : 1); ++i) {
        ops.download(mine.data(), parts[i]->p, ns * sizeof(float));
        if (R == 0) all[i].resize(n);
        g.gather_ranges(mine.data(), all[i].data(), own, 0, "the checkpoint's gather to rank 0");
      }
      const auto host = [](const std::vector<float>& a) -> ParamReader {
        return [&a](size_t off, size_t k, float* out) {
          std::copy(a.begin() + ptrdiff_t(off), a.begin() + ptrdiff_t(off + k), out);
        };
      };
      arenas = {host(all[0]), host(all[1]), host(all[2])};
    }
    if (R == 0) {
      rec.initial_loss = rec.losses.empty() ? NAN : rec.losses.front();
      rec.final_loss = model.forward(fixed_batch(rc.B, rc.T, c.V));
      save_run(path, c, rc, meta, arenas, st, rec);
      if (output_is_folder(rc.output)) tidy_checkpoints(rc.output, rc.keep);
    }
    // no rank ends before the file is whole: mpirun ends the job when a rank exits non-zero
    // (a stop, a failed run), which would kill rank 0 mid-write
    g.barrier("the checkpoint's write on rank 0");
  };

  // The last micro-batch's backward hands each final gradient range to the all-reduce: copied
  // (added, with accumulation) into gacc, and sent in buckets of about kBucketBytes while the
  // layers below are still in their backward.
  size_t collected = n, sent = n;  // gacc [collected, n) is final, [sent, n) is being reduced
  int64_t micro = 0;               // the micro-batch in the step
  const auto collect = [&](size_t from) {
    const size_t k = collected - from;
    if (micro == 0) {
      model.grads_into(gacc.p, from, k);
    } else {
      model.grads_into(grad.p, from, k);
      ops.add_inplace(gacc.p + from, grad.p + from, int64_t(k));
    }
    collected = from;
  };
  if (comm)
    model.on_grads_ready([&](size_t from) {
      if (micro + 1 < rc.grad_accum) return;  // not the step's last micro-batch
      collect(from);
      if ((sent - from) * sizeof(float) >= kBucketBytes || from == 0) {
        comm->start_allreduce(gacc.p + from, sent - from);
        sent = from;
      }
      comm->progress();
    });
  // the parameters' byte ranges each rank steps (ZeRO-1's gather)
  std::vector<size_t> own_bytes(own.size());
  for (size_t i = 0; i < own.size(); ++i) own_bytes[i] = own[i] * dtype_size(rc.dtype);

  std::string failure;
  uint64_t tokens = st.tokens;
  const uint64_t per_step = uint64_t(rc.B * rc.T * rc.grad_accum * N);
  Batch batch;
  // On a terminal, a progress line with the time left (stderr, redrawn in place; cleared
  // before each line the run prints).
  const bool tty = R == 0 && isatty(2) == 1;
  const auto clear_progress = [&] {
    if (tty) std::fputs("\r\033[K", stderr);
  };
  double ms_sum = 0;
  const int64_t first = st.step;
  const StopSignals signals;
  if (governor) governor->begin();
  for (int64_t s = first; s < rc.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = rc.lr * sched.factor(s);
    double loss = 0;
    sent = n;
    for (micro = 0; micro < rc.grad_accum; ++micro) {
      // the global batch's micro-batches micro * N + r are rank r's (one process: all)
      for (int r = 0; r < N; ++r)
        if (r == R)
          loader.next(batch);
        else
          loader.skip();
      if (eos >= 0) mark_documents(batch, eos);
      loss += model.forward(batch);
      collected = n;
      model.backward();  // (a data-parallel step's last: collected and sent by on_grads_ready)
      if (!comm || micro + 1 < rc.grad_accum) collect(0);
    }
    // The step's agreement: every rank's loss and caught signal, summed in rank order
    struct Share {
      double loss;
      int32_t signal, pad;
    } mine{loss, int32_t(signals.caught()), 0};
    std::vector<Share> shares(static_cast<size_t>(N));
    const auto w0 = std::chrono::steady_clock::now();
    g.allgather(&mine, shares.data(), sizeof(Share), "the step's losses");
    double comm_ms = -1;
    if (comm) {
      comm->wait("the gradient all-reduce");
      comm_ms = ms_since(w0);
    }
    loss = 0;
    int sig = 0;
    for (const Share& sh : shares) loss += sh.loss, sig = sig ? sig : sh.signal;
    // the mean over all ranks * grad_accum * B * T tokens, as TorchTitan's rescaled loss gives it
    const int64_t parts = rc.grad_accum * N;
    loss /= double(parts);
    const float mean = parts > 1 ? float(1.0 / double(parts)) : 1.f;
    const double norm = std::sqrt(ops.scale_sum_squares(gacc.p, int64_t(n), mean));
    tokens += per_step;
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      failure = std::string(std::isfinite(loss) ? "gradient norm" : "loss") +
                " is not finite at step " + std::to_string(s + 1);
      std::printf("step %lld: loss %g, grad norm %g\n", (long long)(s + 1), loss, norm);
      break;
    }
    // torch.nn.utils.clip_grad_norm_: the coefficient clamped to 1
    const float clip = rc.max_norm > 0 ? float(std::min(1.0, rc.max_norm / (norm + 1e-6))) : 1.f;
    ops.optimizer_step(master.p, m.p, v.p, gacc.p + lo, int64_t(ns),
                       optimizer_scalars(rc.optimizer, lr, rc.adamw, s + 1, clip),
                       static_cast<char*>(model.params_arena()) + lo * dtype_size(rc.dtype),
                       rc.dtype == DType::bf16);
    if (shard) {
      ops.sync();  // (the device's steps are done when the gather starts: not waiting time)
      const auto w0 = std::chrono::steady_clock::now();
      comm->start_allgather(model.params_arena(), own_bytes);
      comm->wait("the parameters' all-gather");
      comm_ms += ms_since(w0);
    }
    ops.sync();
    const double ms = ms_since(t0);
    rec.losses.push_back(loss);
    rec.steps = s + 1;
    StepMetrics sm{s + 1,  rc.steps, loss, lr, norm, tokens, ms, double(per_step) / ms * 1e3,
                   comm_ms};
    log.step(sm);
    if ((s + 1) % rc.log_every == 0 || s + 1 == rc.steps) {
      clear_progress();
      std::printf("%s\n", step_line(sm).c_str());
      std::fflush(stdout);
    }
    ms_sum += ms;
    if (tty && s + 1 < rc.steps) {
      const double left = ms_sum / double(s + 1 - first) * double(rc.steps - s - 1) / 1e3;
      std::fprintf(stderr, "\r\033[Kstep %lld/%lld (%.0f%%), about %.0f min %02.0f s left",
                   (long long)(s + 1), (long long)rc.steps,
                   100.0 * double(s + 1) / double(rc.steps), std::floor(left / 60),
                   std::fmod(left, 60.0));
    }
    if (validator && ((s + 1) % rc.val_every == 0 || s + 1 == rc.steps)) {
      const double vl = validator->loss(model, g);
      clear_progress();
      const uint64_t vt = validator->windows * uint64_t(rc.B * rc.T);
      std::printf("validation at step %lld: loss %.6f over %llu tokens\n", (long long)(s + 1), vl,
                  (unsigned long long)vt);
      std::fflush(stdout);
      log.validation(s + 1, tokens, vl, vt);
    }
    if (sampler && ((rc.sample_every > 0 && (s + 1) % rc.sample_every == 0) || s + 1 == rc.steps)) {
      clear_progress();
      sample(s + 1);
    }
    if (governor) governor->after_step();
    st.step = s + 1, st.epoch = loader.epoch(), st.position = loader.position();
    st.tokens = tokens;
    const bool stop = sig != 0 || s + 1 == rc.stop_after;
    if (s + 1 == rc.steps) break;
    if (stop || (rc.save_every > 0 && (s + 1) % rc.save_every == 0)) {
      clear_progress();
      const std::string path = checkpoint_path(rc.output, s + 1);
      save(path);
      if (!stop) continue;
      std::printf(
          "stopped after step %lld of %lld (%s): checkpoint %s; continue with: "
          "tiny-qwen3 train --resume %s\n",
          (long long)(s + 1), (long long)rc.steps, sig ? strsignal(sig) : "--stop-after",
          path.c_str(), path.c_str());
      std::fflush(stdout);
      return sig ? 128 + sig : kStoppedEarly;
    }
  }
  clear_progress();
  if (failure.empty() && !rec.losses.empty())
    std::printf("final train loss: %.6f\n", rec.losses.back());
  return finish_run(governor, checkpoint_path(rc.output, st.step), failure, save);
}

bool output_is_folder(const std::string& output) {
  struct stat sb;
  return (!output.empty() && output.back() == '/') ||
         (stat(output.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode));
}

std::string checkpoint_path(const std::string& output, int64_t step) {
  if (!output_is_folder(output)) return output;
  char name[48];
  std::snprintf(name, sizeof name, "step-%08lld.pt", (long long)step);
  return output + (output.back() == '/' ? "" : "/") + name;
}

int finish_run(const cpu::ThreadGovernor* governor, const std::string& output,
               const std::string& failure, const std::function<void(const std::string&)>& save) {
  if (governor)
    if (const std::string used = governor->summary(); !used.empty())
      std::printf("threads: %s (other processes took cores)\n", used.c_str());
  const std::string out = failure.empty() ? output : failed_name(output);
  save(out);
  std::printf("checkpoint: %s\n", out.c_str());
  if (!failure.empty()) {
    std::printf("training: FAILED: %s\n", failure.c_str());
    return 1;
  }
  std::printf("training: ok\n");
  return 0;
}

}  // namespace tq::train
