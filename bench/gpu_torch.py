"""PyTorch on the GPU, the peer of bench/gpu_check.sh (python/train_tiny_qwen3.py's model, the
same SGD step as ours). usage:
  gpu_torch.py time eager|compile PRESET DTYPE B T STEPS   -> "median_ms peak_GiB"
  gpu_torch.py grads DUMP.pt                               -> worst first-step gradient rel L2
     (DUMP from `tiny-qwen3 train --backend cuda --dtype float32 --dump-first-step`: the same
      initial weights in PyTorch fp32 on the GPU, TF32 off)"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import train_tiny_qwen3 as Q  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")


def build(preset, dtype, T):
    with torch.device("cpu"):
        m = Q.build_model(preset, seq_len=T, seed=0, dtype=dtype)
    return m.to(dev)


if sys.argv[1] == "time":
    mode, preset, dtype, B, T, steps = sys.argv[2], sys.argv[3], getattr(torch, sys.argv[4]), *map(int, sys.argv[5:8])
    model = build(preset, dtype, T)
    tokens, labels = (t.expand(B, T).to(dev) for t in Q.make_batch(T, model.V))

    def step():
        loss = Q.loss_fn(model(tokens), labels)
        loss.backward()
        return loss

    fwd_bwd = torch.compile(step) if mode == "compile" else step
    times = []
    for i in range(steps + 3):  # warm-up (and compilation) first
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fwd_bwd()
        Q.sgd_step(model, 0.05)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(f"{statistics.median(times[3:]) * 1e3:.3f} {torch.cuda.max_memory_allocated() / 2**30:.1f}")
elif sys.argv[1] == "grads":
    d = torch.load(sys.argv[2], map_location="cpu", weights_only=False)
    model = build("debugmodel", torch.float32, 32)
    model.load_titan({k: v.float() for k, v in d["params"].items()})
    tokens, labels = (t.to(dev) for t in Q.make_batch(32, model.V))
    loss = Q.loss_fn(model(tokens), labels)
    loss.backward()
    worst, name = 0.0, ""
    for k, g in model.titan_grads().items():
        ours = d["grads"][k].to(dev)
        e = ((ours - g).norm() / g.norm().clamp_min(1e-30)).item()
        if e > worst:
            worst, name = e, k
    print(f"{worst:.3e} {name} loss {loss.item():.6f} ours {d['loss']:.6f}")
else:
    sys.exit(__doc__)
