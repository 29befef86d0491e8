"""tiny-qwen3 eval against PyTorch: a model trained on shards by the product's own commands,
evaluated by `eval --json` and by an independent PyTorch model of the spec
(python/train_tiny_qwen3.py) on the same windows (window w: ids [w T, w T + T] of the split):
the same mean loss in fp32, causal and block-causal, at two window lengths, with a partial last
batch, on the train split, on a text file, and on the same weights exported to a Hugging Face
folder; bf16 close to fp32; bits per byte from the tokenizer's bytes computed here; and the
trainer's validation loss at the same windows.

usage: test_eval.py TINY_QWEN3"""
import json
import math
import os
import random
import shutil
import struct
import sys
import tempfile

import harness

torch = harness.torch_or_skip()
import train_tiny_qwen3 as tq3  # noqa: E402

binary = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="tq_eval_")
torch.set_num_threads(2)

# Short documents (several in a window) of made-up words with some multi-byte characters, so
# that byte-level tokens hold parts of characters.
rng = random.Random(0)
letters = "etaoinshrdlucmfwypvbgkjqxz"
vocab = ["".join(rng.choice(letters[: 8 + i % 18]) for _ in range(1 + i % 7)) for i in range(400)]
vocab += ["café", "naïve", "€5", "Größe", "日本", "🙂"]


def document(n):
    words = [vocab[min(int(rng.paretovariate(1.1)) - 1, len(vocab) - 1)] for _ in range(n)]
    return " ".join(words).capitalize() + "."


corpus = os.path.join(tmp, "corpus.jsonl")
with open(corpus, "w") as f:
    for d in range(500):
        f.write(json.dumps({"text": document(rng.randint(3, 30))}) + "\n")
tok = os.path.join(tmp, "tok.json")
shards = os.path.join(tmp, "shards")
for args in (["tokenizer-train", "--vocab-size", "600", "--jsonl", corpus, "--val-fraction", "0.2",
              "--out", tok],
             ["prepare", "--tokenizer", tok, "--jsonl", corpus, "--val-fraction", "0.2", "--out",
              shards]):
    p = harness.run(binary, *args)
    harness.check(args[0], p.returncode == 0, p.stderr.strip())
meta = json.load(open(os.path.join(shards, "meta.json")))
eos = meta["tokenizer"]["eos_id"]


def read_split(split):
    ids = []
    for name in meta["splits"][split]["shards"]:
        data = open(os.path.join(shards, name), "rb").read()
        count = struct.unpack_from("<3i", data)[2]
        ids += struct.unpack_from(f"<{count}I", data, 1024)
    return torch.tensor(ids, dtype=torch.int64)


split_ids = {s: read_split(s) for s in ("val", "train")}

# A short text run (fp32, block-causal: train --data's default), validating at its last step
B0, T0, VAL_TOKENS = 2, 64, 640
metrics = os.path.join(tmp, "run.jsonl")
run_pt = os.path.join(tmp, "run.pt")
p = harness.run(binary, "train", "--data", shards, "--dtype", "float32", "--batch-size", str(B0),
                "--seq-len", str(T0), "--steps", "4", "--learning-rate", "2e-3",
                "--val-every", "4", "--val-tokens", str(VAL_TOKENS), "--metrics", metrics,
                "--output", run_pt)
harness.check("train --data", p.returncode == 0, p.stderr.strip())
hf = os.path.join(tmp, "hf")
p = harness.run(binary, "export", run_pt, "--format", "hf", "--out", hf)
harness.check("export --format hf", p.returncode == 0, p.stderr.strip())

ck = torch.load(run_pt, map_location="cpu", weights_only=False)
model = tq3.build_model("debugmodel", seed=1)  # another seed: every weight comes from ck
model.load_titan(ck["model"])
model.eval()


def torch_nats(ids, T, windows, block_causal):
    """Summed cross-entropy of windows 0..windows-1 (fp32 logits, summed in fp64)."""
    x = ids[: windows * T].view(windows, T)
    y = ids[1: windows * T + 1].view(windows, T)
    total = 0.0
    with torch.no_grad():
        for i in range(0, windows, 8):
            logp = model(x[i: i + 8], eos if block_causal else None).float().log_softmax(-1)
            total -= logp.gather(-1, y[i: i + 8, :, None]).double().sum().item()
    return total


# Each token's bytes in text, from tokenizer.json here: byte-level characters map back to
# bytes (GPT-2's table); special tokens (the end-of-text id) are no text.
def byte_table():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b), cs.append(256 + n)
            n += 1
    back = {chr(c): b for b, c in zip(bs, cs)}
    t = json.load(open(tok))
    table = {i: len(bytes(back[ch] for ch in s)) for s, i in t["model"]["vocab"].items()}
    for a in t["added_tokens"]:
        table[a["id"]] = 0 if a["special"] else len(a["content"].encode())
    return table


token_bytes = byte_table()


def ours(*args):
    p = harness.run(binary, "eval", *args, "--json")
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)


results = {}


def case(name, args, ids, T, B, windows, block_causal):
    got = ours(*args)
    harness.check(f"{name}: eval runs", got is not None)
    if got is None:
        return
    nats = torch_nats(ids, T, windows, block_causal)
    want = nats / (windows * T)
    diff = abs(got["loss"] - want)
    results[name] = got
    harness.check(f"{name}: {windows} windows of {T}, {B} a forward",
                  (got["windows"], got["seq_len"], got["batch"], got["tokens"]) ==
                  (windows, T, B, windows * T), json.dumps(got))
    harness.check(f"{name}: loss within 1e-5 of PyTorch's", diff <= 1e-5,
                  f"{got['loss']:.8f} vs {want:.8f}, difference {diff:.2e}")
    nbytes = sum(token_bytes[int(i)] for i in ids[1: windows * T + 1])
    bpb = nats / math.log(2) / nbytes
    harness.check(f"{name}: bits per byte = nats / ln 2 / the targets' bytes",
                  got.get("bytes") == nbytes and abs(got["bits_per_byte"] - bpb) <= 1e-5 * bpb,
                  f"{got.get('bits_per_byte')} vs {bpb:.6f}, bytes {got.get('bytes')} vs {nbytes}")


val, train = split_ids["val"], split_ids["train"]
harness.check("the val split holds documents of a few dozen tokens",
              len(val) > 1500 and (val[:1024] == eos).sum().item() >= 16, f"{len(val)} tokens")
all64 = (len(val) - 1) // 64
assert all64 % 3 != 0, all64  # (a partial last batch)
case("block-causal T=64, whole split", [run_pt, "--data", shards, "--batch", "3"],
     val, 64, 3, all64, True)
case("causal T=64, whole split", [run_pt, "--data", shards, "--batch", "3", "--attention", "causal"],
     val, 64, 3, all64, False)
case("block-causal T=40, --tokens 1000", [run_pt, "--data", shards, "--seq-len", "40", "--batch",
     "4", "--tokens", "1000"], val, 40, 4, 25, True)
case("causal T=40, --tokens 1000", [run_pt, "--data", shards, "--seq-len", "40", "--batch", "4",
     "--tokens", "1000", "--attention", "causal"], val, 40, 4, 25, False)
case("train split, block-causal T=48", [run_pt, "--data", shards, "--split", "train", "--seq-len",
     "48", "--tokens", "1500", "--batch", "7"], train, 48, 7, 31, True)
# the exported folder: no recorded run (causal, T given), the tokenizer given
case("Hugging Face folder, causal T=64", [hf, "--data", shards, "--tokenizer", tok, "--seq-len",
     "64", "--batch", "3"], val, 64, 3, all64, False)
if "Hugging Face folder, causal T=64" in results and "causal T=64, whole split" in results:
    a, b = results["Hugging Face folder, causal T=64"], results["causal T=64, whole split"]
    harness.check("the Hugging Face folder gives the checkpoint's loss, bit for bit",
                  a["loss"] == b["loss"], f"{a['loss']!r} vs {b['loss']!r}")

# --text: one document, as prepare encodes it (its ids, then the end-of-text id)
text = os.path.join(tmp, "held_out.txt")
with open(text, "w") as f:
    f.write(" ".join(document(12) for _ in range(40)) + "\n")
p = harness.run(binary, "encode", "--tokenizer", tok, "--input", text)
text_ids = torch.tensor([int(x) for x in p.stdout.split()] + [eos])
tw = (len(text_ids) - 1) // 32
case("--text, block-causal T=32", [run_pt, "--text", text, "--seq-len", "32", "--batch", "5"],
     text_ids, 32, 5, tw, True)
os.link(tok, os.path.join(hf, "tokenizer.json"))  # a Hugging Face folder's own tokenizer
case("--text on the Hugging Face folder (its tokenizer.json), causal T=32",
     [hf, "--text", text, "--seq-len", "32", "--batch", "5"], text_ids, 32, 5, tw, False)

# bf16: the weights rounded and bf16 arithmetic, close to fp32
got16 = ours(run_pt, "--data", shards, "--batch", "3", "--dtype", "bfloat16")
ref = results.get("block-causal T=64, whole split")
if got16 and ref:
    d = abs(got16["loss"] - ref["loss"])
    harness.check("bfloat16 within 2e-2 of float32", d <= 2e-2 and got16["dtype"] == "bfloat16",
                  f"{got16['loss']:.6f} vs {ref['loss']:.6f}, difference {d:.2e}")
else:
    harness.check("bfloat16 eval runs", False)

# The trainer's validation at its last step: the same windows (B*T each, --val-tokens), the
# same weights, the same loss
val_loss = [json.loads(line) for line in open(metrics) if "val_loss" in line][-1]["val_loss"]
got = ours(run_pt, "--data", shards, "--tokens", str(VAL_TOKENS))
if got:
    d = abs(got["loss"] - val_loss)
    harness.check("eval --tokens M equals train's validation at --val-tokens M", d <= 1e-9,
                  f"{got['loss']!r} vs {val_loss!r} ({got['windows']} windows of {got['seq_len']}, "
                  f"{got['batch']} a forward)")
else:
    harness.check("eval with the run's defaults runs", False)
shutil.rmtree(tmp, ignore_errors=True)  # (two copies of the model: 250 MB)
harness.finish()
