"""PyTorch's side of bench/generate_vs_torch.sh: greedy generation with a KV cache, a plain loop
over python/train_tiny_qwen3.py's model (its modules and weights; keys and values of each layer
appended to preallocated caches, torch's scaled_dot_product_attention over them), in torch's
inference mode. Prints one JSON line: prefill and decode tokens and seconds, as `tiny-qwen3
generate --json` reports them.

usage: generate_torch.py PRESET DTYPE BATCH PROMPT_IDS NEW_TOKENS THREADS
  PROMPT_IDS: comma-separated ids, the prompt every sequence of the batch starts from"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import train_tiny_qwen3 as tq3  # noqa: E402

preset, dtype, B, prompt, n_new, threads = sys.argv[1:7]
B, n_new, threads = int(B), int(n_new), int(threads)
dtype = getattr(torch, dtype)
torch.set_num_threads(threads)
prompt = [int(x) for x in prompt.split(",")]
P = len(prompt)
c = tq3.make_config(preset, P + n_new)
torch.manual_seed(0)
model = tq3.Qwen3(c, dtype)  # (the constructors' weights: the speed does not depend on them)
model.eval()
H, K, d = c.n_heads, c.n_kv_heads, c.head_dim
cos, sin = tq3.rope_tables(c, P + n_new)
caches = [(torch.zeros(B, K, P + n_new, d, dtype=dtype), torch.zeros(B, K, P + n_new, d, dtype=dtype))
          for _ in model.layers]


def forward(tokens, pos):
    """tokens [B, S] at positions pos..pos+S-1, after `pos` cached ones: the last logits [B, V]."""
    S = tokens.shape[1]
    cs, sn = cos[pos:pos + S], sin[pos:pos + S]
    h = model.tok_embeddings(tokens)
    for layer, (kc, vc) in zip(model.layers, caches):
        a = layer.attention
        x = layer.attention_norm(h)
        q = a.qkv_linear.wq(x).view(B, S, H, d)
        k = a.qkv_linear.wk(x).view(B, S, K, d)
        v = a.qkv_linear.wv(x).view(B, S, K, d)
        q = tq3.rope(a.q_norm(q), cs, sn).transpose(1, 2)
        kc[:, :, pos:pos + S] = tq3.rope(a.k_norm(k), cs, sn).transpose(1, 2)
        vc[:, :, pos:pos + S] = v.transpose(1, 2)
        keys = kc[:, :, :pos + S].repeat_interleave(H // K, dim=1)
        values = vc[:, :, :pos + S].repeat_interleave(H // K, dim=1)
        o = F.scaled_dot_product_attention(q, keys, values, is_causal=S > 1)
        h = h + a.wo(o.transpose(1, 2).reshape(B, S, H * d))
        h = h + layer.feed_forward(layer.ffn_norm(h))
    return model.lm_head(model.norm(h[:, -1]))


with torch.inference_mode():
    t0 = time.perf_counter()
    tok = forward(torch.tensor([prompt] * B), 0).argmax(-1)
    t1 = time.perf_counter()
    for i in range(n_new - 1):
        tok = forward(tok[:, None], P + i).argmax(-1)
    t2 = time.perf_counter()
print(json.dumps({"prefill": {"tokens": B * P, "seconds": t1 - t0},
                  "decode": {"tokens": B * (n_new - 1), "seconds": t2 - t1}}))
