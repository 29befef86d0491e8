"""Median step time of the plain PyTorch eager implementation (python/train_tiny_qwen3.py):
forward, explicit log-softmax loss, backward, SGD. usage: torch_step.py DTYPE THREADS STEPS [B T]"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import train_tiny_qwen3 as Q  # noqa: E402

dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[sys.argv[1]]
torch.set_num_threads(int(sys.argv[2]))
steps = int(sys.argv[3])
B, T = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (1, 32)
model = Q.build_model("debugmodel", seed=0, dtype=dtype)
tokens, labels = (t.expand(B, T) for t in Q.make_batch(T, model.V))  # B copies, as ours
times = []
for step in range(steps + 2):  # 2 warm-up steps
    t0 = time.perf_counter()
    loss = Q.loss_fn(model(tokens), labels)
    loss.backward()
    Q.sgd_step(model, 0.05)
    times.append(time.perf_counter() - t0)
print(f"{statistics.median(times[2:]) * 1e3:.1f}")
