"""What the PyTorch-side test scripts share: torch or a skip, named checks, running the CLI,
the summary. Importing it puts the repository's python/ (train_tiny_qwen3) on sys.path."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
results = []


def torch_or_skip():
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not importable by", sys.executable, "(apt-get install python3-torch)")
        sys.exit(77)
    return torch


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(("ok: " if ok else "FAIL: ") + name + (f" ({detail})" if detail else ""), flush=True)


def run(binary, *args, expect_rc=0):
    p = subprocess.run([binary, *args], capture_output=True, text=True)
    if p.returncode != expect_rc:
        print(p.stdout, p.stderr)
    return p


def finish():
    passed, failed = results.count(True), results.count(False)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
