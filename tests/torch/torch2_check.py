"""Runs inside the Debian 13 root with torch 2.x: weights_only loads and PyTorch reloads."""
import sys

import torch

import train_tiny_qwen3 as Q
from harness import check, finish


check("torch is 2.x", int(torch.__version__.split(".")[0]) >= 2, torch.__version__)
for path, dtype, tol in [(sys.argv[1], torch.bfloat16, 1e-2), (sys.argv[2], torch.float32, 1e-4)]:
    ck = torch.load(path, map_location="cpu", weights_only=True)
    sd = ck["model"]
    check(f"{path}: weights_only=True load, 91 {dtype} tensors",
          len(sd) == 91 and all(v.dtype == dtype for v in sd.values()))
    check(f"{path}: tied weight is one storage",
          sd["lm_head.weight"].data_ptr() == sd["tok_embeddings.weight"].data_ptr())
    check(f"{path}: floats are Python floats", isinstance(ck["final_loss"], float)
          and all(isinstance(x, float) for x in ck["losses"]))
    m = Q.build_model(ck["config"]["preset"], seed=1)
    m.load_titan(sd)
    tokens, labels = Q.make_batch(ck["config"]["seq_len"], m.V)
    with torch.inference_mode():
        loss = torch.nn.functional.cross_entropy(m(tokens).float(), labels)
    torch.testing.assert_close(loss, torch.tensor(ck["final_loss"]), rtol=tol, atol=tol)
    check(f"{path}: PyTorch reload matches final_loss within {tol}", True,
          f"{loss.item():.6f} vs {ck['final_loss']:.6f}")
finish()
