"""Hugging Face's Qwen3ForCausalLM forward, written from transformers' conventions
(q_proj/k_proj/v_proj, per-head q_norm/k_norm, rotate_half RoPE from config.json, repeat_kv,
fp32 softmax) and independent of train_tiny_qwen3.py: the oracle for `tiny-qwen3 export
--format hf`. Needs only torch; uses the `safetensors` package when it is installed and a
small reader of the format otherwise (Debian 12 has no python3-safetensors)."""
import json
import os
import struct

import torch
import torch.nn.functional as F

ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def read_safetensors(path):
    try:
        from safetensors.torch import load_file
    except ImportError:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            buf = bytearray(f.read())
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            t = torch.frombuffer(buf[b:e], dtype=ST_DTYPES[info["dtype"]]) if e > b else \
                torch.empty(0, dtype=ST_DTYPES[info["dtype"]])
            out[name] = t.reshape(info["shape"]).clone()
        return out
    return load_file(path)


def load_folder(folder):
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    return config, read_safetensors(os.path.join(folder, "model.safetensors"))


def rms_norm(x, w, eps):
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def forward(config, sd, input_ids):
    """input_ids [T] -> logits [T, vocab] in float32."""
    w = {k: v.float() for k, v in sd.items()}
    H, K, D = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    eps, T = config["rms_norm_eps"], input_ids.shape[0]
    inv_freq = 1.0 / (config["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = torch.outer(torch.arange(T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # [T, D]
    causal = torch.full((T, T), float("-inf")).triu(1)
    h = w["model.embed_tokens.weight"][input_ids]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(T, H, D)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(T, K, D)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(T, K, D)
        q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps).transpose(0, 1)  # [H, T, D]
        k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps).transpose(0, 1)
        v = v.transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k[:, None].expand(K, H // K, T, D).reshape(H, T, D)  # repeat_kv
        v = v[:, None].expand(K, H // K, T, D).reshape(H, T, D)
        att = (q @ k.transpose(1, 2)) * D ** -0.5 + causal
        o = (F.softmax(att, dim=-1, dtype=torch.float32) @ v).transpose(0, 1).reshape(T, H * D)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if config["tie_word_embeddings"] else w["lm_head.weight"]
    return h @ head.T
