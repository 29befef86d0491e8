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

# A text run's checkpoint (argv[3]): fp32 master weights, and an optimizer state that
# torch.optim.AdamW itself takes once unflattened from TorchTitan's flat names.
ck = torch.load(sys.argv[3], map_location="cpu", weights_only=True)
sd, flat = ck["model"], ck["optimizer"]
check("text run: weights_only=True load, fp32 master weights of a bf16 run",
      ck["dtype"] == "bfloat16" and all(v.dtype == torch.float32 for v in sd.values()))
names = [k for k in sd if k != "lm_head.weight"]  # the tied table is one parameter
params = [torch.nn.Parameter(sd[k].clone()) for k in names]
opt = torch.optim.AdamW(params, lr=ck["run"]["learning_rate"])
state = {i: {f: flat[f"state.{k}.{f}"] for f in ("step", "exp_avg", "exp_avg_sq")}
         for i, k in enumerate(names)}
group = {f: flat[f"param_groups.{names[0]}.{f}"] for f in
         ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
          "differentiable", "fused", "initial_lr")}
check("text run: every parameter's moments and step", all(
    state[i]["exp_avg"].shape == sd[k].shape and float(state[i]["step"]) == ck["steps"]
    for i, k in enumerate(names)))
opt.load_state_dict({"state": state, "param_groups": [dict(group, params=list(range(len(names))))]})
for p in params:
    p.grad = torch.zeros_like(p)
opt.step()
check("text run: torch.optim.AdamW loads the state and steps on", float(
    opt.state[params[0]]["step"]) == ck["steps"] + 1,
      f"lr scheduler last_epoch {ck['lr_scheduler']['last_epoch']}, data {ck['data']['position']}")
finish()
