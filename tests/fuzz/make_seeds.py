"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/TARGET/), small files of the shapes
the readers meet: torch.save'd state dicts (PyTorch's own writer), the pickle of a tiny-qwen3
checkpoint (ours), safetensors files and Hugging Face folders' JSON as our export writes them.
usage: /usr/bin/python3 tests/fuzz/make_seeds.py [TINY_QWEN3_CHECKPOINT.pt]
(the checkpoint, when given, adds its data.pkl to the pickle corpus)"""
import collections
import io
import json
import os
import struct
import sys
import zipfile

import torch

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def out(target, name, data):
    d = os.path.join(here, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def saved(obj):
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def pickle_of(pt):
    with zipfile.ZipFile(io.BytesIO(pt)) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))


torch.manual_seed(0)
e = torch.randn(6, 4)
states = {
    "bare_f32": collections.OrderedDict(
        [("tok_embeddings.weight", e), ("norm.weight", torch.ones(4)), ("lm_head.weight", e)]),
    "nested_bf16": {"model": collections.OrderedDict(
        [("layers.0.attention.qkv_linear.wq.weight", torch.randn(4, 4).bfloat16()),
         ("layers.0.attention_norm.weight", torch.ones(4).bfloat16())]),
        "config": {"preset": "debugmodel", "seq_len": 32, "seed": 0}, "steps": 2,
        "learning_rate": 0.05, "initial_loss": 7.7, "final_loss": 6.4,
        "losses": [7.7, 7.0], "dtype": "bfloat16", "format": "tiny-qwen3/1"},
    "views_f16": {"state_dict": {"a.weight": torch.randn(4, 6).half()[:, 1:5],
                                 "b.weight": torch.randn(8).double()[::2]}},
    "wrapped": {"model": {"module._orig_mod.output.weight": torch.zeros(3, 2),
                          "module._orig_mod.norm.weight": torch.ones(2)}},
}
for name, obj in states.items():
    pt = saved(obj)
    out("pt", name + ".pt", pt)
    out("zip", name + ".pt", pt)
    out("pickle", name + ".pkl", pickle_of(pt))
if len(sys.argv) > 1:
    with zipfile.ZipFile(sys.argv[1]) as z:
        out("pickle", "tiny_qwen3_checkpoint.pkl",
            z.read(next(n for n in z.namelist() if n.endswith("data.pkl"))))


def safetensors(tensors, metadata=None):
    hdr, data = {}, b""
    if metadata:
        hdr["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


f32 = lambda n: struct.pack("<%df" % n, *[0.5 * i for i in range(n)])
meta = {"format": "pt", "tiny_qwen3": "tiny-qwen3/1", "preset": "debugmodel", "seq_len": "32",
        "seed": "0", "steps": "2", "learning_rate": "0.05", "initial_loss": "7.7",
        "final_loss": "6.4", "dtype": "float32"}
out("safetensors", "hf_names.safetensors", safetensors(
    {"model.embed_tokens.weight": ("F32", [3, 2], f32(6)), "model.norm.weight": ("F32", [2], f32(2))},
    meta))
out("safetensors", "bf16_f16.safetensors", safetensors(
    {"model.layers.0.self_attn.q_proj.weight": ("BF16", [2, 2], b"\x80\x3f" * 4),
     "model.layers.0.mlp.up_proj.weight": ("F16", [2], b"\x00\x3c" * 2)}))
out("safetensors", "empty.safetensors", safetensors({}))

config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 2048,
          "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 8,
          "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
          "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
          "rope_theta": 1000000.0, "rope_scaling": None, "attention_bias": False,
          "attention_dropout": 0.0, "tie_word_embeddings": True, "torch_dtype": "float32",
          "use_sliding_window": False, "sliding_window": None, "use_cache": True}
out("hf_folder", "config.json", b"\x00" + json.dumps(config, indent=2).encode())
index = {"metadata": {"total_size": 48}, "weight_map": {
    "model.norm.weight": "model-00001-of-00002.safetensors",
    "model.embed_tokens.weight": "model-00002-of-00002.safetensors"}}
out("hf_folder", "index.json", b"\x01" + json.dumps(index, indent=2).encode())

# train --resume: a text run's checkpoint as src/train/checkpoint.cpp writes it (the shards of
# tests/fuzz/resume.cpp's meta), with tensors far smaller than debugmodel's
run = {"preset": "debugmodel", "dtype": "bfloat16", "batch_size": 2, "seq_len": 32, "steps": 4,
       "seed": 0, "init_from": "", "data": "shards", "data_order": "shuffled",
       "attention": "block-causal", "grad_accum": 1,
       "optimizer": "adamw", "learning_rate": 8e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
       "weight_decay": 0.1, "warmup_steps": 2, "decay_ratio": 0.8, "decay_type": "linear",
       "lr_min": 0.0, "max_norm": 1.0, "val_every": 0, "val_tokens": 0, "log_every": 1,
       "metrics": "", "output": "run.pt", "save_every": 0, "keep": 0}
optim = {"state.norm.weight.step": torch.tensor(2.0), "state.norm.weight.exp_avg": torch.zeros(4),
         "state.norm.weight.exp_avg_sq": torch.zeros(4), "param_groups.norm.weight.lr": 4e-4,
         "param_groups.norm.weight.betas": (0.9, 0.95)}
resume = {"model": collections.OrderedDict([("tok_embeddings.weight", torch.zeros(2, 4)),
                                            ("norm.weight", torch.ones(4))]),
          "config": {"preset": "debugmodel", "seq_len": 32, "seed": 0}, "steps": 2,
          "learning_rate": 8e-4, "initial_loss": 7.7, "final_loss": 7.0, "losses": [7.7, 7.2],
          "dtype": "bfloat16", "format": "tiny-qwen3/1", "optimizer": optim,
          "lr_scheduler": {"base_lrs": [8e-4], "last_epoch": 2, "_step_count": 3},
          "data": {"epoch": 0, "position": 2, "tokens_seen": 128, "tokenizer_sha256": "ab",
                   "vocab_size": 300, "eos_id": 299, "train_tokens": 1000, "val_tokens": 100},
          "rng": {"data_order": {"generator": "std::mt19937_64", "seed": 0, "epoch": 0}},
          "run": run}
out("resume", "adamw_run.pt", saved(resume))
