"""What the PyTorch-side test scripts share: named checks, running the CLI, the summary."""
import subprocess
import sys

results = []


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
