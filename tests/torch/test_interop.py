"""tiny-qwen3 against PyTorch and Hugging Face conventions: --init-from on state dicts that
PyTorch saved (split and fused qkv, `output.weight`, safetensors), `export --format hf` under
an independent HF-convention forward, `export --format pt`, and bit-exact round trips.

usage: python3 test_interop.py path/to/tiny-qwen3
Runs on Debian 12's torch 1.13 (weights_only=False, a small safetensors writer of its own)
and on torch 2.x (weights_only=True, the `safetensors` package). Exit 77 without torch.
"""
import filecmp
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile

import harness as H  # the script's own folder is on sys.path; harness adds python/

torch = H.torch_or_skip()
import hf_qwen3 as HF  # noqa: E402
import train_tiny_qwen3 as M  # noqa: E402

BIN = os.path.abspath(sys.argv[1])
TMP = tempfile.mkdtemp(prefix="tq_interop_")
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
torch.set_num_threads(2)


def run(*args, expect_rc=0):
    return H.run(BIN, *args, expect_rc=expect_rc)


def load(path):  # torch 1.13 cannot load Python floats with weights_only=True
    return torch.load(path, map_location="cpu", weights_only=TORCH2)


def path(name):
    return os.path.join(TMP, name)


def save_safetensors(tensors, file):
    try:
        from safetensors.torch import save_file
    except ImportError:  # the format by hand: u64 header length, JSON header, raw bytes
        names = {torch.float32: "F32", torch.bfloat16: "BF16"}
        header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
        for k, t in tensors.items():
            b = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.bfloat16 \
                else t.contiguous().view(torch.int16).numpy().tobytes()
            header[k] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(file, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        return
    save_file({k: v.contiguous() for k, v in tensors.items()}, file, metadata={"format": "pt"})


print(f"torch {torch.__version__}, safetensors package: {importlib.util.find_spec('safetensors') is not None}")

# ------------------------------------------- weights PyTorch saved, trained by tiny-qwen3
model = M.build_model("debugmodel", 32, seed=7)
with torch.no_grad():  # norms away from 1 so that every weight matters
    g = torch.Generator().manual_seed(1)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.mul_(1 + 0.1 * torch.randn(p.shape, generator=g))
tokens, labels = M.make_batch(32, model.config.vocab_size)
sd = model.state_dict()  # live views: every file below is written before the SGD step
c = model.config
G = c.n_heads // c.n_kv_heads
variants = {}
torch.save(sd, path("titan_split.pt"))
variants["torch.save'd TorchTitan state dict (split wq/wk/wv)"] = path("titan_split.pt")
fused = {}
for k, v in sd.items():
    if ".qkv_linear.wk." in k or ".qkv_linear.wv." in k:
        continue
    if ".qkv_linear.wq." in k:  # spec §3: per kv group, its G query heads, then k, then v
        pre = k[: k.index("wq.weight")]
        q = v.view(c.n_kv_heads, G * c.head_dim, -1)
        kk = sd[pre + "wk.weight"].view(c.n_kv_heads, c.head_dim, -1)
        vv = sd[pre + "wv.weight"].view(c.n_kv_heads, c.head_dim, -1)
        fused[pre + "wqkv.weight"] = torch.cat([q, kk, vv], 1).reshape(-1, q.shape[-1]).clone()
    else:
        fused["output.weight" if k == "lm_head.weight" else k] = v
if TORCH2 and hasattr(torch.serialization, "set_crc32_options"):
    torch.serialization.set_crc32_options(False)  # every record's CRC-32 left at 0
    torch.save(sd, path("titan_nocrc.pt"))
    torch.serialization.set_crc32_options(True)
    variants["torch.save'd state dict without CRC-32s (set_crc32_options(False))"] = path("titan_nocrc.pt")
torch.save({"model": fused}, path("titan_fused.pt"))
variants["TorchTitan state dict with fused wqkv and output.weight"] = path("titan_fused.pt")
hf_sd = {}
for k, v in sd.items():
    if k == "lm_head.weight":
        continue  # tied: Hugging Face stores it once
    name = (k.replace("tok_embeddings", "model.embed_tokens").replace("attention.qkv_linear.wq", "self_attn.q_proj")
            .replace("attention.qkv_linear.wk", "self_attn.k_proj").replace("attention.qkv_linear.wv", "self_attn.v_proj")
            .replace("attention.wo", "self_attn.o_proj").replace("attention.q_norm", "self_attn.q_norm")
            .replace("attention.k_norm", "self_attn.k_norm").replace("feed_forward.w1", "mlp.gate_proj")
            .replace("feed_forward.w3", "mlp.up_proj").replace("feed_forward.w2", "mlp.down_proj")
            .replace("attention_norm", "input_layernorm").replace("ffn_norm", "post_attention_layernorm"))
    hf_sd[name if name.startswith("model.embed") else "model." + name] = v
save_safetensors(hf_sd, path("hf.safetensors"))
variants["Hugging Face names in a safetensors file"] = path("hf.safetensors")

loss = M.loss_fn(model(tokens), labels)
loss.backward()
torch_losses = [loss.item()]
M.sgd_step(model, 0.05)
with torch.no_grad():
    torch_losses.append(M.loss_fn(model(tokens), labels).item())

for what, file in variants.items():
    out = path("from_" + os.path.basename(file) + ".pt")
    p = run("train", "--init-from", file, "--dtype", "float32", "--steps", "2", "--output", out)
    ok = p.returncode == 0
    ours = load(out)["losses"] if ok else [float("nan")] * 2
    d1, d2 = abs(ours[0] - torch_losses[0]), abs(ours[1] - torch_losses[1])
    H.check(f"--init-from {what}: first-step loss matches PyTorch within 1e-5, second within 1e-4",
          ok and d1 < 1e-5 and d2 < 1e-4,
          f"{ours[0]:.7f} vs {torch_losses[0]:.7f}, {ours[1]:.7f} vs {torch_losses[1]:.7f}")
with open(path("titan_split.pt"), "rb") as f:
    damaged = bytearray(f.read())
damaged[len(damaged) // 2] ^= 0x10  # one bit of one weight
with open(path("damaged.pt"), "wb") as f:
    f.write(damaged)
p = run("train", "--init-from", path("damaged.pt"), "--steps", "1", "--output", path("x.pt"), expect_rc=2)
H.check("--init-from a torch.save'd file with one bit flipped fails its record's CRC-32 check",
      p.returncode == 2 and "fails its CRC-32 check" in p.stderr, p.stderr.strip())
p = run("train", "--init-from", path("titan_split.pt"), "--preset", "0.6B", "--steps", "1", "--output", path("x.pt"),
        expect_rc=2)
H.check("--init-from with the wrong --preset names the key and both shapes",
      p.returncode == 2 and "tok_embeddings.weight: shape [2048, 256] but 0.6B needs [151936, 1024]" in p.stderr,
      p.stderr.strip())

# ------------------------------------------- export --format hf under Hugging Face's forward
for dtype, st_dtype in (("float32", "F32"), ("bfloat16", "BF16")):
    ck = path(f"trained_{dtype}.pt")
    run("train", "--dtype", dtype, "--steps", "5", "--output", ck)
    hf = path(f"hf_{dtype}")
    p = run("export", ck, "--format", "hf", "--out", hf)
    H.check(f"export --format hf ({dtype}) succeeds", p.returncode == 0, p.stdout.strip())
    config, tensors = HF.load_folder(hf)
    with open(os.path.join(hf, "generation_config.json")) as f:
        gen = json.load(f)
    with open(os.path.join(hf, "model.safetensors"), "rb") as f:
        meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]
    H.check(f"{dtype} export: config.json describes debugmodel, tied, {dtype}",
          config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
          and config["hidden_size"] == 256 and config["num_hidden_layers"] == 8 and config["head_dim"] == 128
          and config["num_attention_heads"] == 16 and config["num_key_value_heads"] == 8
          and config["intermediate_size"] == 3072 and config["vocab_size"] == 2048
          and config["tie_word_embeddings"] is True and config["rope_theta"] == 1e6
          and config["torch_dtype"] == dtype and "do_sample" in gen)
    H.check(f"{dtype} export: {len(tensors)} tensors, no lm_head.weight (tied), all {st_dtype}, metadata format=pt",
          len(tensors) == 90 and "lm_head.weight" not in tensors and meta.get("format") == "pt"
          and all(t.dtype == HF.ST_DTYPES[st_dtype] for t in tensors.values()))
    logits_file = path(f"logits_{dtype}.safetensors")
    p = run("check", ck, "--save-logits", logits_file)
    ours = HF.read_safetensors(logits_file)["logits"]
    theirs = HF.forward(config, tensors, M.make_batch(32, 2048)[0])
    diff = (ours - theirs).abs().max().item()
    H.check(f"{dtype} export: Hugging Face-convention forward matches our logits within 1e-4",
          p.returncode == 0 and ours.shape == (32, 2048) and diff < 1e-4, f"max abs diff {diff:.2e}")

    # --format pt: a plain state dict, equal to the checkpoint's
    pt = path(f"plain_{dtype}.pt")
    run("export", ck, "--format", "pt", "--out", pt)
    plain, orig = load(pt), load(ck)["model"]
    H.check(f"{dtype} export --format pt: TorchTitan's 91 keys, values identical, tied storage shared",
          list(plain.keys()) == list(orig.keys())
          and all(torch.equal(plain[k], orig[k]) and plain[k].dtype == orig[k].dtype for k in orig)
          and plain["lm_head.weight"].data_ptr() == plain["tok_embeddings.weight"].data_ptr())
    # export then import: bit-exact, checked on the bytes of the files
    run("export", hf, "--format", "pt", "--out", path("again.pt"))
    run("export", hf, "--format", "hf", "--out", path("hf_again"))
    H.check(f"{dtype} round trip hf -> pt and hf -> hf is bit-exact",
          filecmp.cmp(pt, path("again.pt"), shallow=False)
          and filecmp.cmp(os.path.join(hf, "model.safetensors"), os.path.join(path("hf_again"), "model.safetensors"),
                          shallow=False))
    p = run("check", hf)
    H.check(f"check on the {dtype} Hugging Face folder PASSes against the recorded loss", "PASS" in p.stdout,
          p.stdout.strip().splitlines()[1] if p.stdout else p.stderr)

shutil.rmtree(TMP)
H.finish()
