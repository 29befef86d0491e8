"""PyTorch's side of bench/train_vs_torch.sh: `tiny-qwen3 train --data SHARDS --optimizer adamw`
done by PyTorch on the CPU. The spec's model (python/train_tiny_qwen3.py: build_model, loss_fn,
fp32 parameters), torch.optim.AdamW(lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1)
under LambdaLR with TorchTitan's linear_warmup_stable_decay (warmup 2, decay 0.8, linear: our
defaults), clip_grad_norm_(1.0), on the windows our loader takes (sequential, llm.c's: step k
reads train tokens [k*B*T, k*B*T + B*T + 1)). bfloat16 is torch.autocast(device_type="cpu",
dtype=torch.bfloat16) around forward and loss, the parameters, gradients and AdamW moments fp32:
what TorchTitan does on one device (maybe_enable_amp) and what ours does (bf16 compute copy of
fp32 master weights, fp32 moments).

A timed step is everything between two optimizer steps: slice the window, forward, loss,
backward, clip, AdamW step, LambdaLR step, zero_grad(set_to_none), loss.item().

usage:
  train_torch.py probe THREADS
      -> "matmul FP32_GFLOPS BF16_GFLOPS" (x [2048, 256] by [256, 3072]), then "compile ok" or
         "compile unavailable REASON" (TORCH_COMPILE_BACKEND: another backend than inductor,
         e.g. aot_eager, only to test this script where inductor cannot compile)
  train_torch.py run SHARDS eager|compile DTYPE THREADS B T STEPS WARMUP OPTIMIZER LIMIT_MS
      OPTIMIZER: auto (time single-tensor, foreach and fused AdamW steps on a copy of the
      parameters first, train with the fastest) or one of those names. LIMIT_MS: a step that
      runs longer is stopped (0: no limit; a compile run's first step, the compilation, gets
      COMPILE_ALLOWANCE_S more, default 900).
      -> lines "optimizer NAME MS" per variant tried, "step K MS" per step, then one of
         "result ok MEDIAN_MS OPTIMIZER"                      (median of the steps after WARMUP)
         "result timeout BOUND_MS OPTIMIZER STEPS_DONE"       (the unfinished step ran BOUND_MS)
         "result unavailable OPTIMIZER REASON"                (torch.compile failed)
  train_torch.py race SHARDS DTYPE THREADS B T BUDGET_S VAL_TOKENS
      bench/demo_race.sh's side: as many steps as BUDGET_S holds (its schedule sized to them),
      then the val loss -> "race STEPS SECONDS VAL_LOSS"
"""
import math
import os
import statistics
import sys
import threading
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import train_tiny_qwen3 as Q  # noqa: E402


BACKEND = os.environ.get("TORCH_COMPILE_BACKEND", "inductor")  # another only to test this script


def say(line):
    print(line, flush=True)


def first_line(e):
    lines = [l.strip() for l in str(e).splitlines() if l.strip() and "raised:" not in l]
    return (type(e).__name__ + ": " + (lines[0] if lines else "")).strip()[:300]


def probe_compile():
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    try:
        f = torch.compile(lambda x: (x.sin() * 2).sum(), backend=BACKEND)
        f(torch.randn(16))
    except Exception as e:  # noqa: BLE001 -- any failure means "not available here"
        return first_line(e)
    return None


def matmul_rates(threads):
    """GFLOP/s of one of the model's products (x [2048, 256] by w1 [3072, 256]^T) in fp32 and
    bf16, to tell why a bf16 run is slow."""
    torch.set_num_threads(threads)
    rates = []
    for dtype in (torch.float32, torch.bfloat16):
        x, w = torch.randn(2048, 256, dtype=dtype), torch.randn(3072, 256, dtype=dtype)
        torch.nn.functional.linear(x, w)
        k, t0 = 0, time.perf_counter()
        while k < 3 or time.perf_counter() - t0 < 0.5:
            torch.nn.functional.linear(x, w)
            k += 1
        rates.append(2 * 2048 * 256 * 3072 * k / (time.perf_counter() - t0) / 1e9)
    return rates


def read_split(shards, split):
    """The split's shards concatenated in name order (our loader's train stream)."""
    import json

    meta = json.load(open(os.path.join(shards, "meta.json")))
    parts = []
    for name in meta["splits"][split]["shards"]:
        path = os.path.join(shards, name)
        head = np.fromfile(path, dtype=np.int32, count=256)
        assert head[0] == 20240801 and head[1] == 7, f"{path}: not an llm.c shard"
        ids = np.fromfile(path, dtype=np.uint32, offset=1024)
        assert len(ids) == head[2], f"{path}: {len(ids)} ids, header says {head[2]}"
        parts.append(ids.astype(np.int64))
    return torch.from_numpy(np.concatenate(parts))


ADAMW = dict(lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
VARIANTS = {"single-tensor": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}


def adamw(params, variant):
    return torch.optim.AdamW(params, **ADAMW, **VARIANTS[variant])


def pick_optimizer(model):
    """Times each AdamW variant's step on a copy of the parameters with made-up gradients
    (a warm-up step, then the median of 3); prints each, returns the fastest name."""
    best = None
    for name in VARIANTS:
        params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        try:
            opt = adamw(params, name)
            times = []
            for _ in range(4):
                t0 = time.perf_counter()
                opt.step()
                times.append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 -- e.g. fused on torch 1.13
            say(f"optimizer {name} unavailable {first_line(e)}")
            continue
        ms = statistics.median(times[1:]) * 1e3
        say(f"optimizer {name} {ms:.1f}")
        if best is None or ms < best[1]:
            best = (name, ms)
        del opt, params
    return best[0]


def run(shards, mode, dtype, threads, B, T, steps, warmup, optimizer, limit_ms):
    torch.set_num_threads(threads)
    train = read_split(shards, "train")
    per = B * T
    windows = (len(train) - 1) // per
    model = Q.build_model("debugmodel", seq_len=T, seed=0, dtype=torch.float32)
    if optimizer == "auto":
        optimizer = pick_optimizer(model)
    opt = adamw(model.parameters(), optimizer)
    total = warmup + steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: Q.lr_factor(s, total))
    bf16 = dtype == "bfloat16"

    def fwd_loss(x, y):
        if bf16:
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                return Q.loss_fn(model(x), y)
        return Q.loss_fn(model(x), y)

    f = torch.compile(fwd_loss, backend=BACKEND) if mode == "compile" else fwd_loss

    # The watchdog: a step past the limit ends the run with a bound (the C++ kernels release
    # the GIL, so this thread runs while the main one is inside a matmul).
    state = {"step": 0, "t0": time.perf_counter()}
    allowance = float(os.environ.get("COMPILE_ALLOWANCE_S", "900")) * 1e3

    def watchdog():
        while True:
            time.sleep(0.25)
            k, t0 = state["step"], state["t0"]
            ran = (time.perf_counter() - t0) * 1e3
            allowed = limit_ms + (allowance if mode == "compile" and k == 0 else 0)
            if limit_ms > 0 and ran > allowed:
                say(f"result timeout {ran:.0f} {optimizer} {k}")
                os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    times = []
    for s in range(total):
        state["step"], state["t0"] = s, time.perf_counter()
        t0 = state["t0"]
        w = s % windows
        buf = train[w * per: w * per + per + 1]
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        try:
            loss = f(x, y)
            loss.backward()
        except Exception as e:  # noqa: BLE001 -- compilation failed: not available here
            if mode != "compile":
                raise
            say(f"result unavailable {optimizer} {first_line(e)}")
            return
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        times.append((time.perf_counter() - t0) * 1e3)
        if not math.isfinite(value):
            raise SystemExit(f"step {s + 1}: loss {value}")
        say(f"step {s + 1} {times[-1]:.1f} loss {value:.6f}")
    state["step"] = -1  # done: the watchdog waits
    state["t0"] = float("inf")
    say(f"result ok {statistics.median(times[warmup:]):.1f} {optimizer}")


def race(shards, dtype, threads, B, T, budget_s, val_tokens):
    """The demo's budget: times 3 steps (after one), sizes the schedule to the steps that fit in
    budget_s, trains them on sequential windows, then the mean loss over the first val_tokens
    of the val split in B x T windows (as `train --val-tokens`). Prints `race STEPS SECONDS
    VAL_LOSS` (SECONDS: the training, probe included)."""
    torch.set_num_threads(threads)
    train, val = read_split(shards, "train"), read_split(shards, "val")
    per = B * T
    bf16 = dtype == "bfloat16"
    started = time.perf_counter()

    def fwd_loss(model, x, y):
        if bf16:
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                return Q.loss_fn(model(x), y)
        return Q.loss_fn(model(x), y)

    def train_steps(steps, timed):
        model = Q.build_model("debugmodel", seq_len=T, seed=0, dtype=torch.float32)
        opt = adamw(model.parameters(), "fused" if torch.__version__ >= "2" else "foreach")
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: Q.lr_factor(s, steps))
        times = []
        for s in range(steps):
            t0 = time.perf_counter()
            buf = train[s * per: s * per + per + 1]
            loss = fwd_loss(model, buf[:-1].view(B, T), buf[1:].view(B, T))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
            if timed and time.perf_counter() - started > budget_s:
                break
        return model, times

    _, probe = train_steps(4, False)
    steps = max(1, int((budget_s - (time.perf_counter() - started)) / statistics.median(probe[1:])))
    model, times = train_steps(steps, True)
    seconds = time.perf_counter() - started
    with torch.no_grad():
        n = min(val_tokens, len(val) - 1) // per
        losses = [fwd_loss(model, val[j * per: j * per + per].view(B, T),
                           val[j * per + 1: j * per + per + 1].view(B, T)).item() for j in range(n)]
    say(f"race {len(times)} {seconds:.1f} {sum(losses) / len(losses):.6f}")


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        fp32, bf16 = matmul_rates(int(sys.argv[2]))
        say(f"matmul {fp32:.1f} {bf16:.1f}")
        reason = probe_compile()
        say("compile ok" if reason is None else f"compile unavailable {reason}")
    elif sys.argv[1] == "run":
        a = sys.argv[2:]
        run(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), int(a[6]), int(a[7]), a[8], float(a[9]))
    elif sys.argv[1] == "race":
        a = sys.argv[2:]
        race(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), float(a[5]), int(a[6]))
    else:
        sys.exit(__doc__)
