#!/usr/bin/env bash
# The walkthrough's steps 3-5 (train-tiny-qwen3.md) typed as written, with `--backend cpu`,
# in the environment tools/pyenv.sh makes: its `python` is torch 2.6, the step-4 snippet is
# verbatim and must print PASS. usage: walkthrough_steps.sh PYENV_DIR REPO
set -euo pipefail
pyenv=$1
repo=$2
work=$(mktemp -d "$repo/build/walkthrough.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp "$repo/python/train_tiny_qwen3.py" "$work/"  # step 1 downloads it; we copy it
cd "$work"
source "$pyenv/bin/activate"
set -x

env -u TT_METAL_RUNTIME_ROOT \
  python -u train_tiny_qwen3.py \
  --backend cpu \
  --steps 20 \
  --output tiny-qwen3.pt
uv pip freeze > training-environment.txt

python - <<'PY'
import torch
import torch.nn.functional as F

from train_tiny_qwen3 import build_model, make_batch

checkpoint = torch.load("tiny-qwen3.pt", map_location="cpu", weights_only=True)
config = checkpoint["config"]
model = build_model(**config)
model.load_state_dict(checkpoint["model"])
model.eval()
tokens, labels = make_batch(config["seq_len"], model.config.vocab_size)

with torch.inference_mode():
    logits = model(tokens).float()
    loss = F.cross_entropy(logits, labels)
    correct = (logits.argmax(-1) == labels).sum().item()

torch.testing.assert_close(
    loss, torch.tensor(checkpoint["final_loss"]), rtol=1e-2, atol=1e-2
)
print(f"CPU checkpoint loss: {loss.item():.6f}")
print(f"correct next tokens: {correct}/{labels.numel()}")
print("PASS: checkpoint loss matches TT within tolerance")
PY

python -u train_tiny_qwen3.py \
  --backend cpu \
  --steps 20 \
  --output tiny-qwen3-cpu.pt
set +x
grep -q '^torch==2\.' training-environment.txt
cmp <(python -c 'import torch; print(torch.load("tiny-qwen3.pt", weights_only=True)["losses"])') \
  <(python -c 'import torch; print(torch.load("tiny-qwen3-cpu.pt", weights_only=True)["losses"])')
echo "ok: walkthrough steps 3-5 as typed: trained, PASS, the second CPU run repeats the first exactly"
