# What the training scripts share, sourced by them: tests/train_resume.sh, tests/dist_train.sh,
# bench/gpu_check.sh.

# made_up_shards BIN DIR SEED DOCS: DOCS made-up documents of 3 to 42 words (several to a row:
# block-causal attention has documents to keep apart), their words of a skewed frequency so
# that a tokenizer has something to learn, into DIR/docs.jsonl; a 600-id BPE trained on them
# (DIR/tok.json) and their shards (DIR/shards, 10 % validation). Non-zero if any step fails.
made_up_shards() {
  local bin=$1 dir=$2 seed=$3 docs=$4
  awk -v seed="$seed" -v docs="$docs" 'BEGIN { srand(seed); for (d = 0; d < docs; ++d) {
    n = 3 + int(rand() * 40); line = "";
    for (i = 0; i < n; ++i) { w = ""; k = 1 + int(rand() * rand() * 7);
      for (j = 0; j < k; ++j) w = w substr("etaoinshrdlucmfwyp", 1 + int(rand() * rand() * 18), 1);
      line = line (i ? " " : "") w }
    printf "{\"text\": \"%s.\"}\n", line } }' >"$dir/docs.jsonl" &&
    "$bin" tokenizer-train --vocab-size 600 --jsonl "$dir/docs.jsonl" --out "$dir/tok.json" >/dev/null &&
    "$bin" prepare --tokenizer "$dir/tok.json" --jsonl "$dir/docs.jsonl" --val-fraction 0.1 \
      --out "$dir/shards" >/dev/null
}

# same_tensors A B: whether two checkpoints hold the same tensors (every data/ record, byte for
# byte).
same_tensors() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, zipfile
a, b = (zipfile.ZipFile(p) for p in sys.argv[1:3])
def records(z):
    return {n.split("/", 1)[1]: z.read(n) for n in z.namelist() if "/data/" in n}
ra, rb = records(a), records(b)
sys.exit(0 if ra == rb and len(ra) > 10 else 1)
PY
}
