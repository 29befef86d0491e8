"""Drop-in for the walkthrough's train_tiny_qwen3.py (train-tiny-qwen3.md), needing only torch.

As a script it runs our C++ trainer, `tiny-qwen3 train`, and relays its output unchanged:

    python -u train_tiny_qwen3.py --backend cpu --steps 20 --output tiny-qwen3.pt

The trainer is $TINY_QWEN3, else ../build/tiny-qwen3 next to this file's real path, else
`tiny-qwen3` on PATH. The script path never imports torch, so it runs on any python3.

As a module it is the walkthrough's model API (step 4) and the repository's PyTorch oracle
for the C++ trainer: build_model, make_batch, loss_fn, sgd_step. The model is TorchTitan's
dense Qwen3 in plain PyTorch (spec qwen3-model.md): state_dict() has TorchTitan's keys in
TorchTitan's order, and initialization draws what the walkthrough's CPU-built model draws,
so a seed gives the trainer's initial weights. Works on torch 1.13 and 2.x.
"""
import argparse
import math
import os
import shutil
import sys
from dataclasses import dataclass

BACKENDS = ("cpu", "cuda")


# ---------------------------------------------------------------------------------- script
def find_trainer():
    if os.environ.get("TINY_QWEN3"):
        return os.environ["TINY_QWEN3"]
    built = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "build", "tiny-qwen3")
    if os.path.isfile(built) and os.access(built, os.X_OK):
        return os.path.normpath(built)
    return shutil.which("tiny-qwen3")


def fail(message):
    print(f"train_tiny_qwen3.py: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    p = argparse.ArgumentParser(description="Train the walkthrough's tiny Qwen3 with tiny-qwen3 (C++).")
    p.add_argument("--backend", default="cpu", help="cpu or cuda")
    p.add_argument("--output", required=True, help="checkpoint path (.pt)")
    # Passed through as typed: the trainer validates them, with one-line errors.
    for flag in ("--steps", "--learning-rate", "--preset", "--seq-len", "--seed", "--dtype",
                 "--batch-size", "--threads", "--init-from"):
        p.add_argument(flag)
    args = p.parse_args(argv)
    if args.backend not in BACKENDS:
        fail(f"unknown backend {args.backend!r}: this script runs tiny-qwen3 on {' or '.join(BACKENDS)}")
    trainer = find_trainer()
    if not trainer:
        fail("tiny-qwen3 not found: run `bash tools/walkthrough.sh` in the tiny-qwen3 repository "
             "(it builds build/tiny-qwen3) or set TINY_QWEN3 to the binary")
    cmd = [trainer, "train", "--backend", args.backend, "--output", args.output]
    for dest, value in vars(args).items():
        if dest not in ("backend", "output") and value is not None:
            cmd += ["--" + dest.replace("_", "-"), value]
    sys.stdout.flush()
    sys.stderr.flush()
    try:  # exec: the trainer's output, exit code and signals are the script's own
        os.execv(trainer, cmd)
    except OSError as e:
        fail(f"cannot run {trainer}: {e.strerror}")


if __name__ == "__main__":
    main()  # never returns. Only the model API below needs torch, so the relay does not import it.

# ---------------------------------------------------------------------------------- model
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# name: (vocab_size, dim, n_layers, n_heads, n_kv_heads, head_dim, hidden_dim, tied), spec §1
PRESETS = {
    "debugmodel": (2048, 256, 8, 16, 8, 128, 3072, True),
    "0.6B": (151936, 1024, 28, 16, 8, 128, 3072, True),
    "1.7B": (151936, 2048, 28, 16, 8, 128, 6144, True),
    "4B": (151936, 2560, 36, 32, 8, 128, 9728, True),
    "8B": (151936, 4096, 36, 32, 8, 128, 12288, False),
    "14B": (151936, 5120, 40, 40, 8, 128, 17408, False),
    "32B": (151936, 5120, 64, 64, 8, 128, 25600, False),
}


@dataclass
class Config:
    preset: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    tied: bool
    seq_len: int = 32
    rope_theta: float = 1e6
    norm_eps: float = 1e-6


def make_config(preset="debugmodel", seq_len=32):
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    return Config(preset, *PRESETS[preset], seq_len=seq_len)


def rms_norm(x, weight, eps=1e-6):
    # Statistics in fp32; cast back *before* the weight multiply, as PyTorch's RMSNorm (spec §2).
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return n.to(x.dtype) * weight


def rope_tables(config, T, device=None):
    """Rotate-half RoPE cos/sin tables [T, head_dim], fp32 throughout (spec §5)."""
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
    ang = torch.outer(torch.arange(T, dtype=torch.float32, device=device), inv)
    return torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)


def rope(x, cos, sin):  # x [B, T, heads, d]: dimension e pairs with e + d/2, computed in fp32
    # cos, sin: [T, d] (positions 0..T-1), or [B, T, d] (each token's own position)
    half = x.shape[-1] // 2
    xf = x.float()
    rot = torch.cat([-xf[..., half:], xf[..., :half]], -1)
    return (xf * cos.unsqueeze(-2) + rot * sin.unsqueeze(-2)).to(x.dtype)


def document_starts(tokens, eos_id):
    """Block-causal attention over packed documents (TorchTitan's document mask; the C++
    mark_documents): in each row of tokens [B, T] a document starts at the first token and after
    every eos_id, the eos ending the document before it. Returns [B, T], where each token's
    document starts."""
    B, T = tokens.shape
    pos = torch.arange(T, device=tokens.device).expand(B, T)
    first = torch.zeros(B, T, dtype=torch.bool, device=tokens.device)
    first[:, 0] = True
    first[:, 1:] = tokens[:, :-1] == eos_id
    return torch.where(first, pos, torch.zeros_like(pos)).cummax(-1).values


def _linear(in_f, out_f, dtype):
    # Built in fp32 on the CPU so that its constructor consumes the RNG as the walkthrough's
    # CPU-built model does; cast at once so a large preset never holds a whole fp32 copy.
    return nn.Linear(in_f, out_f, bias=False).to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6, dtype=torch.float32):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class QKVLinear(nn.Module):
    """TorchTitan fuses q/k/v into one wqkv but saves it split as wq/wk/wv. Split modules give
    those keys directly; their constructors draw as many values as the fused one."""

    def __init__(self, c, dtype):
        super().__init__()
        self.wq = _linear(c.dim, c.n_heads * c.head_dim, dtype)
        self.wk = _linear(c.dim, c.n_kv_heads * c.head_dim, dtype)
        self.wv = _linear(c.dim, c.n_kv_heads * c.head_dim, dtype)


class Attention(nn.Module):
    def __init__(self, c, dtype):
        super().__init__()
        self.c = c
        self.qkv_linear = QKVLinear(c, dtype)
        self.wo = _linear(c.n_heads * c.head_dim, c.dim, dtype)
        self.q_norm = RMSNorm(c.head_dim, c.norm_eps, dtype)
        self.k_norm = RMSNorm(c.head_dim, c.norm_eps, dtype)

    def forward(self, x, cos, sin, mask):  # x [B, T, D]; mask: True where a query sees a key
        (B, T, _), H, K, d = x.shape, self.c.n_heads, self.c.n_kv_heads, self.c.head_dim
        q = self.qkv_linear.wq(x).view(B, T, H, d)
        k = self.qkv_linear.wk(x).view(B, T, K, d)
        v = self.qkv_linear.wv(x).view(B, T, K, d)
        q = rope(self.q_norm(q), cos, sin)  # QK-norm before RoPE
        k = rope(self.k_norm(k), cos, sin)
        k = k.repeat_interleave(H // K, dim=2)  # query head h reads kv head h // (H/K)
        v = v.repeat_interleave(H // K, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d)
        p = s.masked_fill(~mask, float("-inf")).float().softmax(-1).to(q.dtype)
        return self.wo(torch.einsum("bhts,bshd->bthd", p, v).reshape(B, T, H * d))


class FeedForward(nn.Module):  # SwiGLU
    def __init__(self, c, dtype):
        super().__init__()
        self.w1 = _linear(c.dim, c.hidden_dim, dtype)  # gate
        self.w2 = _linear(c.hidden_dim, c.dim, dtype)  # down
        self.w3 = _linear(c.dim, c.hidden_dim, dtype)  # up

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    # Registration order is TorchTitan's state_dict order: attention, feed_forward, norms.
    def __init__(self, c, dtype):
        super().__init__()
        self.attention = Attention(c, dtype)
        self.feed_forward = FeedForward(c, dtype)
        self.attention_norm = RMSNorm(c.dim, c.norm_eps, dtype)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps, dtype)

    def forward(self, h, cos, sin, mask):
        h = h + self.attention(self.attention_norm(h), cos, sin, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Qwen3(nn.Module):
    """TorchTitan's dense Qwen3: forward(tokens [T] or [B, T]) -> logits [T, V] or [B, T, V];
    causal attention, or with eos_id block-causal (document_starts: each document sees only
    itself, its RoPE positions from 0).
    build_model() gives a seeded, initialized model; the constructor alone leaves PyTorch's
    constructor values in the weights (it consumes the RNG as the walkthrough's model does)."""

    def __init__(self, config, dtype=torch.float32):
        super().__init__()
        c = self.config = config
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim).to(dtype)
        self.layers = nn.ModuleList(Block(c, dtype) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim, c.norm_eps, dtype)
        self.lm_head = _linear(c.dim, c.vocab_size, dtype)
        if c.tied:  # one Parameter under both keys: both saved, trained once
            self.lm_head.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self):
        """TorchTitan's init_states (spec §9): N(0, 0.02^2) in module order, norms ones. Each
        draw is an fp32 tensor rounded into the parameter: a bf16 model holds bf16(fp32 init)."""

        def normal(w):
            w.copy_(torch.empty(w.shape, dtype=torch.float32).normal_(0.0, 0.02))

        if not self.config.tied:  # when tied the embedding is lm_head, drawn last
            normal(self.tok_embeddings.weight)
        for b in self.layers:
            a, f = b.attention, b.feed_forward
            for m in (a.qkv_linear.wq, a.qkv_linear.wk, a.qkv_linear.wv, a.wo, f.w1, f.w2, f.w3):
                normal(m.weight)
            for n in (a.q_norm, a.k_norm, b.attention_norm, b.ffn_norm):
                n.weight.fill_(1.0)
        self.norm.weight.fill_(1.0)
        normal(self.lm_head.weight)

    def forward(self, tokens, eos_id=None):
        single = tokens.dim() == 1
        tokens = tokens[None] if single else tokens
        T, device = tokens.shape[1], tokens.device
        cos, sin = rope_tables(self.config, T, device)
        at = torch.arange(T, device=device)
        if eos_id is None:  # [T, T]: query i sees keys 0..i
            mask = at[None, :] <= at[:, None]
        else:  # [B, 1, T, T]: query i sees keys start(i)..i; position i - start(i)
            start = document_starts(tokens, eos_id)
            key, query = at[None, None, :], at[None, :, None]
            mask = ((key <= query) & (key >= start[:, :, None]))[:, None]
            cos, sin = cos[at - start], sin[at - start]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        logits = self.lm_head(self.norm(h))
        return logits[0] if single else logits

    # Shorthands for the parity tests and benchmarks (tests/torch, bench/).
    @property
    def V(self):
        return self.config.vocab_size

    def titan_state_dict(self):
        """TorchTitan's keys -> tensors; tied entries share storage."""
        return self.state_dict()

    def titan_grads(self):
        """TorchTitan's keys -> gradients (a tied weight's under both of its keys)."""
        return {k: p.grad for k, p in self.state_dict(keep_vars=True).items()}

    def load_titan(self, state_dict):
        """Loads TorchTitan-keyed tensors of any float dtype, cast to the model's."""
        self.load_state_dict(state_dict)


def build_model(preset="debugmodel", seq_len=32, seed=0, dtype=torch.float32, **ignored):
    """The walkthrough's model: torch.manual_seed(seed), a CPU-built Qwen3 (its constructors
    consume the RNG), then TorchTitan's init, in `dtype` (a torch.dtype or its name). Other
    checkpoint config entries are ignored."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    config = make_config(preset, seq_len)
    torch.manual_seed(seed)
    model = Qwen3(config, dtype)
    model.init_weights()
    return model


def make_batch(seq_len, vocab_size):
    """The walkthrough's fixed batch: inputs 0, 1, ..., each target the next integer."""
    tokens = torch.arange(seq_len, dtype=torch.int64) % vocab_size
    labels = (tokens + 1) % vocab_size
    return tokens, labels


def loss_fn(logits, labels):
    """Explicit one-hot x log-softmax mean in fp32, as the walkthrough (= cross-entropy)."""
    logp = logits.float().log_softmax(-1)
    return -(F.one_hot(labels, logp.shape[-1]) * logp).sum(-1).mean()


def lr_factor(s, steps, warmup=2, decay_ratio=0.8, decay_type="linear", min_factor=0.0):
    """TorchTitan's linear_warmup_stable_decay, as torchtitan/components/optimizer/
    lr_scheduler.py builds and computes it: the factor LambdaLR applies at 0-based step s of
    `steps` (the defaults are qwen3_debugmodel's, and `tiny-qwen3 train --data`'s)."""
    warmup = min(warmup, steps)
    decay = round(steps * decay_ratio)
    if warmup + decay > steps:
        decay = steps - warmup
    stable = steps + 1 - warmup - decay
    if s < warmup:
        return (s + 1) / warmup
    if s < warmup + stable:
        return 1.0
    p = (s + 1 - warmup - stable) / decay
    f = {"linear": 1 - p, "sqrt": 1 - math.sqrt(p), "cosine": 0.5 * (1 + math.cos(math.pi * p))}
    return min_factor + (1 - min_factor) * f[decay_type]


def sgd_step(model, lr):
    """Plain SGD on every distinct parameter (the tied weight once); clears the gradients."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)
            p.grad = None
