"""Training on text against PyTorch: tiny-qwen3 train --data (AdamW or SGD, TorchTitan's
schedule, clip_grad_norm_, gradient accumulation, validation, causal or block-causal attention)
and an independent PyTorch run of the spec's model (python/train_tiny_qwen3.py) with
torch.optim.AdamW, LambdaLR and torch.nn.utils.clip_grad_norm_, fed the same windows of the
same shards: the same losses, learning rates and gradient norms, step by step, in fp32.

usage: test_train_text.py TINY_QWEN3 [--steps N]"""
import json
import os
import random
import struct
import sys
import tempfile

import harness

torch = harness.torch_or_skip()
import train_tiny_qwen3 as tq3  # noqa: E402

binary = sys.argv[1]
steps_arg = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else None
tmp = tempfile.mkdtemp(prefix="tq_train_text_")
torch.set_num_threads(2)

# A corpus of made-up documents (a vocabulary of word-like strings with a skewed frequency, so
# a tokenizer has something to learn), then the product's own path to shards.
rng = random.Random(0)
letters = "etaoinshrdlucmfwypvbgkjqxz"
vocab = ["".join(rng.choice(letters[: 8 + i % 18]) for _ in range(1 + i % 7)) for i in range(600)]
with open(os.path.join(tmp, "corpus.jsonl"), "w") as f:
    for d in range(160):
        words = [vocab[min(int(rng.paretovariate(1.2)) - 1, 599)] for _ in range(250)]
        text = " ".join(words).capitalize() + ".\n" + " ".join(reversed(words[:40])) + "!"
        f.write(json.dumps({"text": text}) + "\n")
tok = os.path.join(tmp, "tok.json")
shards = os.path.join(tmp, "shards")
for args in (["tokenizer-train", "--vocab-size", "2048", "--jsonl", os.path.join(tmp, "corpus.jsonl"),
              "--val-fraction", "0.1", "--out", tok],
             ["prepare", "--tokenizer", tok, "--jsonl", os.path.join(tmp, "corpus.jsonl"),
              "--val-fraction", "0.1", "--out", shards, "--shard-tokens", "40000"]):
    p = harness.run(binary, *args)
    harness.check(args[0], p.returncode == 0, p.stderr.strip())

# Short documents (3 to 40 words) with the same tokenizer, for block-causal attention: several
# documents in every row of 128 tokens.
doc_shards = os.path.join(tmp, "doc_shards")
with open(os.path.join(tmp, "short.jsonl"), "w") as f:
    for d in range(1200):
        n = rng.randint(3, 40)
        words = [vocab[min(int(rng.paretovariate(1.2)) - 1, 599)] for _ in range(n)]
        f.write(json.dumps({"text": " ".join(words).capitalize() + "."}) + "\n")
args = ["prepare", "--tokenizer", tok, "--jsonl", os.path.join(tmp, "short.jsonl"),
        "--val-fraction", "0.1", "--out", doc_shards]
p = harness.run(binary, *args)
harness.check("prepare (short documents)", p.returncode == 0, p.stderr.strip())


def read_split(split, folder):
    meta = json.load(open(os.path.join(folder, "meta.json")))
    ids = []
    for name in meta["splits"][split]["shards"]:
        data = open(os.path.join(folder, name), "rb").read()
        magic, version, count = struct.unpack_from("<3i", data)
        assert (magic, version) == (20240801, 7) and len(data) == 1024 + 4 * count
        ids += struct.unpack_from(f"<{count}I", data, 1024)
    return torch.tensor(ids, dtype=torch.int64)


# each folder's train and val ids and its end-of-text id
splits = {d: (read_split("train", d), read_split("val", d),
              json.load(open(os.path.join(d, "meta.json")))["tokenizer"]["eos_id"])
          for d in (shards, doc_shards)}


def torch_run(c):
    B, T, accum, steps = c["B"], c["T"], c["accum"], c["steps"]
    train_ids, val_ids, eos_id = splits[c["shards"]]
    eos = eos_id if c["attention"] == "block-causal" else None
    model = tq3.build_model("debugmodel", seq_len=T, seed=0)
    if c["optimizer"] == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=c["lr"], betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=c["wd"])
    else:
        opt = torch.optim.SGD(model.parameters(), lr=c["lr"])
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: tq3.lr_factor(s, steps, c["warmup"], c["decay_ratio"], c["decay_type"],
                                    c["lr_min"]))
    per = B * T
    windows = (len(train_ids) - 1) // per
    out, w = [], 0
    for s in range(steps):
        opt.zero_grad()
        total = 0.0
        lr = opt.param_groups[0]["lr"]
        for _ in range(accum):
            buf = train_ids[(w % windows) * per: (w % windows) * per + per + 1]
            w += 1
            loss = tq3.loss_fn(model(buf[:-1].view(B, T), eos), buf[1:].view(B, T)) / accum
            loss.backward()
            total += loss.item()
        # the exact norm (tiny-qwen3 sums in double); clip_grad_norm_'s own fp32 sums differ
        # from it by up to 5e-5 relative on these 32M gradients, and its coefficient with them
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())).item()
        if c["max_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), c["max_norm"])
        opt.step()
        sched.step()
        out.append({"loss": total, "lr": lr, "grad_norm": norm})
        if c.get("val_every") and ((s + 1) % c["val_every"] == 0 or s + 1 == steps):
            with torch.no_grad():
                n = min(c["val_tokens"], len(val_ids) - 1) // per
                vl = sum(tq3.loss_fn(model(val_ids[j * per: j * per + per].view(B, T), eos),
                                     val_ids[j * per + 1: j * per + per + 1].view(B, T)).item()
                         for j in range(n)) / n
            out[-1]["val_loss"] = vl
    return out


def ours(c, name):
    metrics = os.path.join(tmp, name + ".jsonl")
    args = ["train", "--data", c["shards"], "--attention", c["attention"], "--dtype", "float32",
            "--seed", "0",
            "--batch-size", str(c["B"]), "--seq-len", str(c["T"]), "--steps", str(c["steps"]),
            "--grad-accum", str(c["accum"]), "--optimizer", c["optimizer"],
            "--learning-rate", str(c["lr"]), "--warmup-steps", str(c["warmup"]),
            "--decay-ratio", str(c["decay_ratio"]), "--decay-type", c["decay_type"],
            "--lr-min", str(c["lr_min"]), "--max-norm", str(c["max_norm"]),
            "--weight-decay", str(c["wd"]), "--metrics", metrics,
            "--output", os.path.join(tmp, name + ".pt")]
    if c.get("val_every"):
        args += ["--val-every", str(c["val_every"]), "--val-tokens", str(c["val_tokens"])]
    p = harness.run(binary, *args)
    if p.returncode != 0:
        return None
    steps, vals = [], {}
    for line in open(metrics):
        r = json.loads(line)
        if "val_loss" in r:
            vals[r["step"]] = r["val_loss"]
        else:
            steps.append(r)
    for s, v in vals.items():
        steps[s - 1]["val_loss"] = v
    return steps


base = dict(B=2, T=128, accum=2, steps=50, optimizer="adamw", lr=8e-4, wd=0.1, warmup=2,
            decay_ratio=0.8, decay_type="linear", lr_min=0.0, max_norm=1.0, val_every=25,
            val_tokens=2048, shards=shards, attention="causal")
runs = {
    # the case: B > 1, T >= 128, accumulation, TorchTitan's defaults, validation
    "adamw-accum": base,
    # cosine to a floor, tighter clipping, another weight decay, more rows, no accumulation
    "adamw-cosine": dict(base, B=3, T=48, accum=1, steps=12, decay_type="cosine", lr_min=0.1,
                         max_norm=0.5, wd=0.05, warmup=3, decay_ratio=0.5, val_every=0),
    # SGD with the schedule and no clipping (the walkthrough's SGD is torch_parity's)
    "sgd-sqrt": dict(base, T=40, accum=2, steps=6, optimizer="sgd", lr=0.05, decay_type="sqrt",
                     max_norm=0.0, val_every=3, val_tokens=1000),
    # block-causal attention over packed short documents (PyTorch: document_starts' mask and
    # per-document RoPE positions), B > 1, T = 128, accumulation, validation
    "adamw-documents": dict(base, steps=20, val_every=10, shards=doc_shards,
                            attention="block-causal"),
}

# The documents run's rows hold several documents each: eos ids inside every row it reads.
train_ids, _, eos_id = splits[doc_shards]
c = runs["adamw-documents"]
per = c["B"] * c["T"]
windows = (len(train_ids) - 1) // per
rows = [train_ids[w % windows * per + r * c["T"]: w % windows * per + (r + 1) * c["T"]]
        for w in range(c["steps"] * c["accum"]) for r in range(c["B"])]
ends = [int((row == eos_id).sum()) for row in rows]
harness.check("adamw-documents: several documents in every row", min(ends) >= 2,
              f"eos a row: fewest {min(ends)}, mean {sum(ends) / len(ends):.1f}")
for name, c in runs.items():
    if steps_arg:
        c = dict(c, steps=min(c["steps"], steps_arg))
    got, want = ours(c, name), torch_run(c)
    harness.check(f"{name}: trains", got is not None)
    if got is None:
        continue
    worst = {k: max(abs(g[k] - w[k]) / (1 if k != "grad_norm" else max(1.0, abs(w[k])))
                    for g, w in zip(got, want) if k in w) for k in ("loss", "lr", "grad_norm")}
    worst_val = max([abs(g["val_loss"] - w["val_loss"]) for g, w in zip(got, want)
                     if "val_loss" in w] or [0.0])
    harness.check(f"{name}: {c['steps']} steps' losses within 1e-4 of PyTorch's", worst["loss"] <= 1e-4,
                  f"largest difference {worst['loss']:.2e}; first {got[0]['loss']:.6f} vs "
                  f"{want[0]['loss']:.6f}, last {got[-1]['loss']:.6f} vs {want[-1]['loss']:.6f}")
    harness.check(f"{name}: learning rates equal", worst["lr"] <= 1e-12, f"{worst['lr']:.1e}")
    rel = [abs(g["grad_norm"] - w["grad_norm"]) / w["grad_norm"] for g, w in zip(got, want)]
    # The first step's norm is the same gradients' (1e-6); after AdamW steps, parameters whose
    # gradients are near 0 take steps of about lr in a direction float rounding decides, so
    # later norms differ by more than the losses do.
    harness.check(f"{name}: first gradient norm within 1e-6 (relative)", rel[0] <= 1e-6,
                  f"{rel[0]:.2e}: {got[0]['grad_norm']:.6f} vs {want[0]['grad_norm']:.6f}")
    harness.check(f"{name}: gradient norms within 1e-3 (relative)", max(rel) <= 1e-3,
                  f"largest {max(rel):.2e} at step {rel.index(max(rel)) + 1}")
    if c.get("val_every"):
        harness.check(f"{name}: validation losses within 1e-4", worst_val <= 1e-4, f"{worst_val:.2e}")
harness.finish()
