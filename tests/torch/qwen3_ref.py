"""An independent plain-PyTorch implementation of the spec (../../../shared/spec/qwen3-model.md),
used as the oracle for tiny-qwen3's parity tests and benchmarks. Needs only torch (1.13 or 2.x)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (V, D, layers, H, KVH, head_dim, ffn, tied)
PRESETS = {
    "debugmodel": (2048, 256, 8, 16, 8, 128, 3072, True),
    "0.6B": (151936, 1024, 28, 16, 8, 128, 3072, True),
}
EPS = 1e-6
THETA = 1e6


def rms_norm(x, w):
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return n.to(x.dtype) * w


class Qwen3(nn.Module):
    """state_dict() keys are TorchTitan's (split wq/wk/wv, tied lm_head shares storage)."""

    def __init__(self, preset="debugmodel", seed=0, dtype=torch.float32):
        super().__init__()
        V, D, L, H, K, d, Fh, tied = PRESETS[preset]
        self.V, self.D, self.L, self.H, self.K, self.d, self.F = V, D, L, H, K, d, Fh
        torch.manual_seed(seed)
        # Constructor draws of a model built on the CPU (values discarded, RNG consumed).
        nn.Embedding(V, D)
        for _ in range(L):
            for out_f, in_f in [((H + 2 * K) * d, D), (D, H * d), (Fh, D), (D, Fh), (Fh, D)]:
                nn.Linear(in_f, out_f, bias=False)
        nn.Linear(D, V, bias=False)
        # init_states order (spec §9); norms are ones
        std = 0.02
        normal = lambda *shape: torch.empty(*shape).normal_(0.0, std)
        emb = None if tied else normal(V, D)
        self.layers = nn.ModuleList()
        for _ in range(L):
            m = nn.Module()
            m.wq = nn.Parameter(normal(H * d, D))
            m.wk = nn.Parameter(normal(K * d, D))
            m.wv = nn.Parameter(normal(K * d, D))
            m.wo = nn.Parameter(normal(D, H * d))
            m.q_norm = nn.Parameter(torch.ones(d))
            m.k_norm = nn.Parameter(torch.ones(d))
            m.w1 = nn.Parameter(normal(Fh, D))
            m.w2 = nn.Parameter(normal(D, Fh))
            m.w3 = nn.Parameter(normal(Fh, D))
            m.attention_norm = nn.Parameter(torch.ones(D))
            m.ffn_norm = nn.Parameter(torch.ones(D))
            self.layers.append(m)
        self.norm = nn.Parameter(torch.ones(D))
        self.lm_head = nn.Parameter(normal(V, D))
        self.tok_embeddings = self.lm_head if tied else nn.Parameter(emb)
        self.tied = tied
        self.to(dtype)
        if tied:
            self.tok_embeddings = self.lm_head

    def titan_state_dict(self):
        """TorchTitan's 91 keys -> tensors (tied entries share storage)."""
        sd = {"tok_embeddings.weight": self.tok_embeddings.data}
        for i, m in enumerate(self.layers):
            p = f"layers.{i}."
            sd.update({
                p + "attention.qkv_linear.wq.weight": m.wq.data,
                p + "attention.qkv_linear.wk.weight": m.wk.data,
                p + "attention.qkv_linear.wv.weight": m.wv.data,
                p + "attention.wo.weight": m.wo.data,
                p + "attention.q_norm.weight": m.q_norm.data,
                p + "attention.k_norm.weight": m.k_norm.data,
                p + "feed_forward.w1.weight": m.w1.data,
                p + "feed_forward.w2.weight": m.w2.data,
                p + "feed_forward.w3.weight": m.w3.data,
                p + "attention_norm.weight": m.attention_norm.data,
                p + "ffn_norm.weight": m.ffn_norm.data,
            })
        sd["norm.weight"] = self.norm.data
        sd["lm_head.weight"] = self.lm_head.data
        return sd

    def titan_grads(self):
        return {k: self._param_for(k).grad for k in self.titan_state_dict()}

    def _param_for(self, key):
        if key == "tok_embeddings.weight":
            return self.tok_embeddings
        if key == "lm_head.weight":
            return self.lm_head
        if key == "norm.weight":
            return self.norm
        parts = key.split(".")
        return getattr(self.layers[int(parts[1])], parts[-2])

    def load_titan(self, sd):
        with torch.no_grad():
            for k, v in sd.items():
                self._param_for(k).copy_(v.to(self._param_for(k).dtype))

    def rope(self, x, T):
        d = self.d
        inv = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        c, s = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)  # [T, d]
        xf = x.float()
        rot = torch.cat([-xf[..., d // 2:], xf[..., : d // 2]], -1)
        return (xf * c[:, None, :] + rot * s[:, None, :]).to(x.dtype)

    def forward(self, tokens):  # tokens [T] -> logits [T, V]
        T = tokens.shape[0]
        H, K, d = self.H, self.K, self.d
        h = self.tok_embeddings[tokens]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for m in self.layers:
            x = rms_norm(h, m.attention_norm)
            q = F.linear(x, m.wq).view(T, H, d)
            k = F.linear(x, m.wk).view(T, K, d)
            v = F.linear(x, m.wv).view(T, K, d)
            q = self.rope(rms_norm(q, m.q_norm), T)
            k = self.rope(rms_norm(k, m.k_norm), T)
            k = k.repeat_interleave(H // K, dim=1)
            v = v.repeat_interleave(H // K, dim=1)
            s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(d)
            p = s.masked_fill(~mask, float("-inf")).float().softmax(-1).to(q.dtype)
            o = torch.einsum("hts,shd->thd", p, v).reshape(T, H * d)
            h = h + F.linear(o, m.wo)
            x = rms_norm(h, m.ffn_norm)
            h = h + F.linear(F.silu(F.linear(x, m.w1)) * F.linear(x, m.w3), m.w2)
        return F.linear(rms_norm(h, self.norm), self.lm_head)


def make_batch(seq_len, vocab):
    tokens = torch.arange(seq_len, dtype=torch.int64) % vocab
    return tokens, (tokens + 1) % vocab


def loss_fn(logits, labels):
    """Explicit one-hot x log-softmax mean, in fp32, as the walkthrough."""
    logp = logits.float().log_softmax(-1)
    return -(F.one_hot(labels, logp.shape[-1]) * logp).sum(-1).mean()


def sgd_step(model, lr):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)
            p.grad = None
