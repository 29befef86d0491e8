#!/usr/bin/env bash
# Bad input to the CLI: exit code 2, exactly one line on stderr, no output file left behind.
set -u
unset OMP_NUM_THREADS  # (it stands in for --threads: set below where tested)
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0
passes=0
expect_error() {  # expect_error "what" args...
  local what=$1
  shift
  (
    [ -n "${fsize:-}" ] && ulimit -f "$fsize"
    exec "$bin" "$@"
  ) >"$dir/out" 2>"$dir/err"
  local rc=$? lines
  lines=$(wc -l <"$dir/err")
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ls "$dir"/*.pt* >/dev/null 2>&1; then
    echo "FAIL: $what: rc=$rc, stderr lines=$lines: $(head -c 300 "$dir/err")"
    ls "$dir"
    fails=$((fails + 1))
  else
    echo "ok: $what: $(cat "$dir/err")"
    passes=$((passes + 1))
  fi
  rm -f "$dir"/*.pt*
}
out="--output $dir/x.pt"
expect_error "unknown flag" train --bogus $out
expect_error "no subcommand"
expect_error "missing --output" train
expect_error "seq-len 0" train --seq-len 0 $out
expect_error "seq-len above the context" train --seq-len 4097 $out
expect_error "negative steps" train --steps -1 $out
expect_error "zero steps" train --steps 0 $out
expect_error "non-numeric steps" train --steps ten $out
expect_error "unknown preset" train --preset 7B $out
expect_error "unknown dtype" train --dtype float16 $out
expect_error "negative learning rate" train --learning-rate -0.1 $out
expect_error "nan learning rate" train --learning-rate nan $out
expect_error "zero batch" train --batch-size 0 $out
expect_error "seed past 64 bits" train --seed 99999999999999999999 $out
expect_error "hexadecimal seed" train --seed 0x10 $out
expect_error "empty --output" train --output ""
expect_error "empty --init-from" train --init-from "" $out
expect_error "zero threads" train --threads 0 $out
expect_error "threads above 4096" train --threads 4097 $out
expect_error "unknown backend" train --backend tpu $out
expect_error "negative --device" train --backend cuda --device -1 $out
expect_error "non-numeric --device" train --backend cuda --device first $out
# no GPU, no CUDA build, or no device 9999: one line, whichever this machine is
expect_error "CUDA device that is not there" train --backend cuda --device 9999 $out
# the CUDA backend's plugin missing, or not a plugin (a CUDA build; else "no CUDA backend")
TQ_CUDA_LIB=$dir/none.so expect_error "CUDA backend library missing" train --backend cuda $out
echo "not a library" >"$dir/bad.so"
TQ_CUDA_LIB=$dir/bad.so expect_error "CUDA backend library not a library" train --backend cuda $out
expect_error "unwritable output folder" train --output /nonexistent/dir/x.pt
expect_error "preset too large for memory" train --preset 32B $out
mkdir "$dir/folder"
expect_error "output is a folder" train --output "$dir/folder"
rmdir "$dir/folder"
# a full disk (a 2 MB file-size limit): the error names it, no partial file is left
fsize=2048 expect_error "disk full while saving" train --steps 1 $out
expect_error "missing checkpoint" check "$dir/missing.pt"
printf 'not a zip' >"$dir/text.bin"
expect_error "non-zip checkpoint" check "$dir/text.bin"
printf '\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e' >"$dir/legacy.bin"
expect_error "legacy checkpoint" check "$dir/legacy.bin"
# a real checkpoint, then truncated
"$bin" train --steps 1 --dtype float32 --output "$dir/real.ckpt" >/dev/null 2>&1 || { echo "FAIL: could not train"; exit 1; }
head -c 1000000 "$dir/real.ckpt" >"$dir/trunc.bin"
expect_error "truncated checkpoint" check "$dir/trunc.bin"
# one bit flipped in a weight halfway through the file: caught by the record's CRC-32
cp "$dir/real.ckpt" "$dir/flip.bin"
half=$(($(stat -c %s "$dir/flip.bin") / 2))
byte=$(od -An -tu1 -j "$half" -N1 "$dir/flip.bin" | tr -d ' ')
printf "\\$(printf %03o $((byte ^ 16)))" | dd of="$dir/flip.bin" bs=1 seek="$half" conv=notrunc status=none
expect_error "checkpoint with a flipped bit" check "$dir/flip.bin"
grep -q "fails its CRC-32 check" "$dir/err" || { echo "FAIL: the flipped bit not named a CRC-32 failure"; fails=$((fails + 1)); }
expect_error "init-from a checkpoint with a flipped bit" train --init-from "$dir/flip.bin" $out
expect_error "check with seq-len 0" check "$dir/real.ckpt" --seq-len 0
expect_error "check of an empty path" check ""
expect_error "check with an empty --save-logits" check "$dir/real.ckpt" --save-logits ""
expect_error "check with negative threads" check "$dir/real.ckpt" --threads -5
expect_error "check with threads above 4096" check "$dir/real.ckpt" --threads 100000
# imports and exports
"$bin" export "$dir/real.ckpt" --format hf --out "$dir/hf" >/dev/null || { echo "FAIL: export"; exit 1; }
expect_error "init-from a missing file" train --init-from "$dir/none.safetensors" $out
expect_error "init-from a non-model file" train --init-from "$dir/text.bin" $out
expect_error "init-from a truncated checkpoint" train --init-from "$dir/trunc.bin" $out
expect_error "init-from with another preset" train --init-from "$dir/hf" --preset 0.6B $out
expect_error "init-from a folder without weights" train --init-from "$dir" $out
cp -r "$dir/hf" "$dir/hf4"
sed -i 's/"num_hidden_layers": 8/"num_hidden_layers": 4/' "$dir/hf4/config.json"
expect_error "config.json that disagrees with the weights" check "$dir/hf4"
# check of a model too large to evaluate in fp32 here: a sparse 32B safetensors file (65 GB
# apparent, no blocks written), refused before a weight is read
/usr/bin/python3 - "$dir/s32.safetensors" <<'PY'
import json, sys
# A sparse safetensors file with the 32B preset's tensors (bf16): its header, then a hole.
V, C, L, H, KVH, D, F = 151936, 5120, 64, 64, 8, 128, 25600
shapes = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C], "lm_head.weight": [V, C]}
for l in range(L):
    p = "model.layers.%d." % l
    shapes.update({p + "self_attn.q_proj.weight": [H * D, C], p + "self_attn.k_proj.weight": [KVH * D, C],
                   p + "self_attn.v_proj.weight": [KVH * D, C], p + "self_attn.o_proj.weight": [C, H * D],
                   p + "self_attn.q_norm.weight": [D], p + "self_attn.k_norm.weight": [D],
                   p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C],
                   p + "mlp.down_proj.weight": [C, F], p + "input_layernorm.weight": [C],
                   p + "post_attention_layernorm.weight": [C]})
hdr, off = {}, 0
for name, shape in shapes.items():
    n = 2
    for s in shape: n *= s
    hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
    off += n
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(len(h).to_bytes(8, "little") + h)
    f.truncate(8 + len(h) + off)
PY
expect_error "check of a model larger than memory" check "$dir/s32.safetensors"
rm -f "$dir/s32.safetensors"
expect_error "export format unknown" export "$dir/real.ckpt" --format onnx --out "$dir/x.onnx"
expect_error "export to an unwritable folder" export "$dir/real.ckpt" --format pt --out /nonexistent/x.pt
expect_error "export hf over a file" export "$dir/real.ckpt" --format hf --out "$dir/text.bin"
# a full disk during a Hugging Face export: a folder it made is gone, and an earlier export in
# the folder keeps every file as it was (none renamed before all are written)
fsize=2048 expect_error "disk full during an hf export" export "$dir/real.ckpt" --format hf --out "$dir/hfx"
if [ -e "$dir/hfx" ]; then
  echo "FAIL: an interrupted hf export left $dir/hfx: $(ls -A "$dir/hfx")"
  fails=$((fails + 1))
fi
"$bin" export "$dir/real.ckpt" --format hf --dtype float32 --out "$dir/hfx" >/dev/null 2>&1 ||
  { echo "FAIL: could not export"; exit 1; }
cp -r "$dir/hfx" "$dir/hfx.before"
fsize=2048 expect_error "disk full during an hf export over an earlier one" export "$dir/real.ckpt" --format hf --out "$dir/hfx"
if ! diff -r "$dir/hfx" "$dir/hfx.before" >/dev/null; then
  echo "FAIL: an interrupted hf export changed the earlier one: $(ls -A "$dir/hfx")"
  fails=$((fails + 1))
fi
rm -rf "$dir/hfx" "$dir/hfx.before"
# hostile safetensors: u64 header length, JSON header, data
st() {  # st FILE HEADER DATA_BYTES
  local n=${#2}
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8 & 255)) $((n >> 16 & 255)))" >"$1"
  printf '%s' "$2" >>"$1"
  head -c "$3" /dev/zero >>"$1"
}
printf '\xff\xff\xff\x00\x00\x00\x00\x00{}' >"$dir/short.safetensors"
expect_error "safetensors header past the end" check "$dir/short.safetensors"
st "$dir/overlap.safetensors" '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}' 16
expect_error "overlapping safetensors tensors" check "$dir/overlap.safetensors"
st "$dir/huge.safetensors" '{"model.embed_tokens.weight":{"dtype":"F32","shape":[1099511627776,4],"data_offsets":[0,16]}}' 16
expect_error "safetensors shape beyond memory" train --init-from "$dir/huge.safetensors" $out
st "$dir/offsets.safetensors" '{"model.embed_tokens.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,999999]}}' 8
expect_error "safetensors offsets past the end" check "$dir/offsets.safetensors"
st "$dir/dtype.safetensors" '{"model.norm.weight":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}' 8
expect_error "safetensors unknown dtype" check "$dir/dtype.safetensors"
# training that fails: exit 1, a FAILED line, the checkpoint kept under a name that says so
expect_failed_run() {  # what args...
  local what=$1
  shift
  "$bin" train --dtype float32 --output "$dir/run.pt" "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  if [ "$rc" -eq 1 ] && grep -q '^training: FAILED: ' "$dir/out" && [ -f "$dir/run.FAILED.pt" ] &&
    [ ! -e "$dir/run.pt" ]; then
    echo "ok: $what: $(grep FAILED "$dir/out" | tail -1)"
    passes=$((passes + 1))
  else
    echo "FAIL: $what: rc=$rc"
    cat "$dir/out" "$dir/err"
    fails=$((fails + 1))
  fi
  rm -f "$dir"/run*
}
expect_failed_run "diverging loss (NaN)" --learning-rate 1e30 --steps 4
# lr 1e-30 leaves every weight as it is (each step is far below its ulp): the loss cannot fall
expect_failed_run "loss not falling" --learning-rate 1e-30 --steps 2
# Integers are read in decimal: --seed 010 is seed 10 (CLI11 alone read it as octal, seed 8)
"$bin" train --steps 1 --seed 010 --output "$dir/a.pt" >"$dir/a" 2>&1
"$bin" train --steps 1 --seed 10 --output "$dir/b.pt" >"$dir/b" 2>&1
"$bin" train --steps 1 --seed 8 --output "$dir/c.pt" >"$dir/c" 2>&1
a=$(grep '^step 01' "$dir/a" | cut -d' ' -f3) b=$(grep '^step 01' "$dir/b" | cut -d' ' -f3)
c=$(grep '^step 01' "$dir/c" | cut -d' ' -f3)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ]; then
  echo "ok: --seed 010 is seed 10: $a"
  passes=$((passes + 1))
else
  echo "FAIL: --seed 010: $a, --seed 10: $b, --seed 8: $c"
  fails=$((fails + 1))
fi
rm -f "$dir"/a* "$dir"/b* "$dir"/c*
# Hostile files that reach the readers' limits, through every command that opens a model
# file: containers nested far deeper than any checkpoint (2 MB of one-item tuples), a list
# that holds itself through the pickle memo, and training-record metadata that is not a whole
# number (a float far past 64 bits, nan).
/usr/bin/python3 - "$dir" <<'PY'
import json, struct, sys, zipfile
d = sys.argv[1]
def pt(name, pickle):
    with zipfile.ZipFile(f"{d}/{name}", "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle)
        z.writestr("archive/version", "3\n")
pt("deep.bin", b"\x80\x02N" + b"\x85" * 2_000_000 + b".")
pt("marks.bin", b"\x80\x02" + b"(" * 300_000 + b"t" * 300_000 + b".")
pt("cycle.bin", b"\x80\x02]q\x00h\x00a.")
pt("dictcycle.bin", b"\x80\x02}q\x00X\x01\x00\x00\x00ah\x00s.")
for name, value in (("hugeint", "1e400"), ("nanint", "nan"), ("floatint", "3.5")):
    meta = {"final_loss": "1.5", "seq_len": value}
    hdr = json.dumps({"__metadata__": meta,
                      "model.norm.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    with open(f"{d}/{name}.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 8)
PY
for f in deep marks cycle dictcycle; do
  expect_error "check of a hostile pickle ($f)" check "$dir/$f.bin"
  expect_error "--init-from a hostile pickle ($f)" train --init-from "$dir/$f.bin" $out
  expect_error "export of a hostile pickle ($f)" export "$dir/$f.bin" --format pt --out "$dir/x.pt"
done
for f in hugeint nanint floatint; do
  expect_error "check of safetensors metadata ($f)" check "$dir/$f.safetensors"
  expect_error "--init-from safetensors metadata ($f)" train --init-from "$dir/$f.safetensors" $out
  expect_error "export of safetensors metadata ($f)" export "$dir/$f.safetensors" --format pt --out "$dir/x.pt"
done
rm -f "$dir"/deep.bin "$dir"/marks.bin "$dir"/*cycle.bin "$dir"/*int.safetensors
# The thread count on one CPU (taskset -c 0): the default is the CPUs this process may run
# on; OMP_NUM_THREADS stands in for --threads, which wins over it; more threads than CPUs run,
# with one warning line. expect_threads "what" THREADS WARNING [VAR=value ...] -- [args...]
# (WARNING: the start of stderr's one line after "warning: ", or "" for an empty stderr)
expect_threads() {
  local what=$1 want=$2 warn=$3 envs=()
  shift 3
  while [ "$1" != -- ]; do envs+=("$1") && shift; done
  shift
  env -u OMP_NUM_THREADS "${envs[@]}" taskset -c 0 "$bin" train --steps 2 --output "$dir/t.pt" "$@" >"$dir/out" 2>"$dir/err"
  local rc=$? ok=1
  if [ "$rc" -ne 0 ] || ! grep -q "^device: CPU(threads=$want," "$dir/out"; then
    ok=0
  elif [ -z "$warn" ]; then
    [ ! -s "$dir/err" ] || ok=0
  else
    [ "$(wc -l <"$dir/err")" -eq 1 ] && grep -q "^warning: $warn" "$dir/err" || ok=0
  fi
  if [ "$ok" -eq 1 ]; then
    echo "ok: $what: $(grep '^device' "$dir/out") $(cat "$dir/err")"
    passes=$((passes + 1))
  else
    echo "FAIL: $what: rc=$rc $(grep '^device' "$dir/out") $(cat "$dir/err")"
    fails=$((fails + 1))
  fi
  rm -f "$dir"/t.pt
}
# The tokenizer commands: one line, exit 2, and no output file (a tokenizer, ids, text, or a
# shard folder) left behind.
printf 'the quick brown fox\njumps over the lazy dog\n' >"$dir/text.txt"
"$bin" tokenizer-train --vocab-size 300 --input "$dir/text.txt" --out "$dir/tok.json" >/dev/null
expect_none() {  # expect_none "what" PATH args...: expect_error, and PATH must not exist
  local what=$1 path=$2
  shift 2
  expect_error "$what" "$@"
  if [ -e "$path" ]; then
    echo "FAIL: $what: left $path"
    fails=$((fails + 1))
    rm -rf "$path"
  fi
}
expect_none "encode: missing tokenizer" "$dir/ids" encode --tokenizer "$dir/none.json" --input "$dir/text.txt" --output "$dir/ids"
head -c 3000 "$dir/tok.json" >"$dir/truncated.json"
expect_none "encode: truncated tokenizer.json" "$dir/ids" encode --tokenizer "$dir/truncated.json" --input "$dir/text.txt" --output "$dir/ids"
sed 's/"type": "BPE"/"type": "WordPiece"/' "$dir/tok.json" >"$dir/wordpiece.json"
expect_none "encode: unsupported model" "$dir/ids" encode --tokenizer "$dir/wordpiece.json" --input "$dir/text.txt" --output "$dir/ids"
sed 's/"type": "NFC"/"type": "Lowercase"/' "$dir/tok.json" >"$dir/lower.json"
expect_none "encode: unsupported normalizer" "$dir/ids" encode --tokenizer "$dir/lower.json" --input "$dir/text.txt" --output "$dir/ids"
: >"$dir/empty.txt"
expect_none "encode: empty input" "$dir/ids" encode --tokenizer "$dir/tok.json" --input "$dir/empty.txt" --output "$dir/ids"
expect_none "encode: missing input" "$dir/ids" encode --tokenizer "$dir/tok.json" --input "$dir/none.txt" --output "$dir/ids"
printf '{"text": "a"}\n{"txt": "b"}\n' >"$dir/bad.jsonl"
expect_none "encode: a JSONL line without text" "$dir/ids" encode --tokenizer "$dir/tok.json" --input "$dir/bad.jsonl" --jsonl --output "$dir/ids"
printf '{"text": "a"}\nnot json\n' >"$dir/bad2.jsonl"
expect_none "encode: a JSONL line that is not JSON" "$dir/ids" encode --tokenizer "$dir/tok.json" --input "$dir/bad2.jsonl" --jsonl --output "$dir/ids"
printf '1 2 x 3' >"$dir/ids.txt"
expect_none "decode: not a number" "$dir/text" decode --tokenizer "$dir/tok.json" --input "$dir/ids.txt" --output "$dir/text"
printf '1 2 999999' >"$dir/ids.txt"
expect_none "decode: an id past the vocabulary" "$dir/text" decode --tokenizer "$dir/tok.json" --input "$dir/ids.txt" --output "$dir/text"
printf '1 2 99999999999' >"$dir/ids.txt"
expect_none "decode: an id past 32 bits" "$dir/text" decode --tokenizer "$dir/tok.json" --input "$dir/ids.txt" --output "$dir/text"
expect_none "tokenizer-train: vocabulary below 257" "$dir/t2.json" tokenizer-train --vocab-size 100 --input "$dir/text.txt" --out "$dir/t2.json"
expect_none "tokenizer-train: empty input" "$dir/t2.json" tokenizer-train --vocab-size 300 --input "$dir/empty.txt" --out "$dir/t2.json"
expect_none "tokenizer-train: missing input" "$dir/t2.json" tokenizer-train --vocab-size 300 --input "$dir/none.txt" --out "$dir/t2.json"
expect_none "tokenizer-train: no --input" "$dir/t2.json" tokenizer-train --vocab-size 300 --out "$dir/t2.json"
expect_none "prepare: no documents" "$dir/shards" prepare --tokenizer "$dir/tok.json" --input "$dir/empty.txt" --out "$dir/shards"
expect_none "prepare: two sources" "$dir/shards" prepare --tokenizer "$dir/tok.json" --input "$dir/text.txt" --jsonl "$dir/bad.jsonl" --out "$dir/shards"
expect_none "prepare: a bad JSONL line" "$dir/shards" prepare --tokenizer "$dir/tok.json" --jsonl "$dir/bad.jsonl" --out "$dir/shards"
expect_none "prepare: val fraction 1" "$dir/shards" prepare --tokenizer "$dir/tok.json" --input "$dir/text.txt" --val-fraction 1 --out "$dir/shards"
expect_none "prepare: zero shard tokens" "$dir/shards" prepare --tokenizer "$dir/tok.json" --input "$dir/text.txt" --shard-tokens 0 --out "$dir/shards"
mkdir -p "$dir/full" && echo x >"$dir/full/keep"
expect_error "prepare: an output folder that is not empty" prepare --tokenizer "$dir/tok.json" --input "$dir/text.txt" --out "$dir/full"
[ "$(ls "$dir/full")" = keep ] || { echo "FAIL: prepare wrote into a folder that was not empty"; fails=$((fails + 1)); }
expect_none "brown-text: not a Brown corpus" "$dir/b.jsonl" brown-text "$dir/full" --out "$dir/b.jsonl"
# Training on text: bad shard folders and flags
"$bin" prepare --tokenizer "$dir/tok.json" --input "$dir/text.txt" "$dir/text.txt" --val-fraction 0.5 --out "$dir/shards" >/dev/null
expect_error "train: --data folder missing" train --data "$dir/none" $out
expect_error "train: --data folder without meta.json" train --data "$dir/full" $out
expect_error "train: seq-len past the context" train --data "$dir/shards" --seq-len 5000 $out
expect_error "train: more tokens a batch than the split has" train --data "$dir/shards" --seq-len 512 --batch-size 8 $out
expect_error "train: --grad-accum without --data" train --grad-accum 2 $out
expect_error "train: --optimizer adamw without --data" train --optimizer adamw $out
expect_error "train: unknown optimizer" train --data "$dir/shards" --optimizer lion $out
expect_error "train: unknown decay type" train --data "$dir/shards" --decay-type step $out
expect_error "train: unknown data order" train --data "$dir/shards" --data-order random $out
expect_error "train: unknown attention" train --data "$dir/shards" --attention full $out
expect_error "train: --attention block-causal without --data" train --attention block-causal $out
expect_error "train: --val-every without --val-tokens" train --data "$dir/shards" --val-every 5 $out
expect_error "train: zero grad-accum" train --data "$dir/shards" --grad-accum 0 $out
expect_error "train: beta1 of 1" train --data "$dir/shards" --beta1 1 $out
expect_error "train: negative max-norm" train --data "$dir/shards" --max-norm -1 $out
expect_error "train: --dump-first-step with --data" train --data "$dir/shards" --dump-first-step "$dir/d.pt" $out
expect_error "train: --shard-optimizer without --data" train --shard-optimizer $out
expect_error "train: a zero --timeout" train --data "$dir/shards" --timeout 0 $out
expect_error "train: a --timeout that is not a number" train --data "$dir/shards" --timeout nan $out
cp -r "$dir/shards" "$dir/shards2"
cp -r "$dir/shards" "$dir/bigvocab" && sed -i 's/"vocab_size": [0-9]*/"vocab_size": 999999/' "$dir/bigvocab/meta.json"
expect_error "train: shards of a tokenizer larger than the model's vocabulary" train --data "$dir/bigvocab" $out
printf 'XXXX' | dd of="$dir/shards/train_000000.bin" bs=1 seek=0 conv=notrunc 2>/dev/null
expect_error "train: a shard with a wrong magic" train --data "$dir/shards" $out
# plot: a metrics file's steps and validations drawn (a PNG), bad metrics refused
printf '{"step":1,"loss":7.5,"lr":1e-4,"grad_norm":1,"tokens":64,"tokens_per_s":9,"ms":1}\n{"step":1,"tokens":64,"val_loss":7.6,"val_tokens":64}\n{"step":2,"loss":7.1,"lr":1e-4,"grad_norm":1,"tokens":128,"tokens_per_s":9,"ms":1}\n' >"$dir/m.jsonl"
if command -v gnuplot >/dev/null; then
  if "$bin" plot "$dir/m.jsonl" --out "$dir/loss.png" >/dev/null 2>"$dir/err" &&
    [ "$(head -c 4 "$dir/loss.png" | od -An -c | tr -d ' ')" = '211PNG' ] && ! ls "$dir"/loss.png.tmp* >/dev/null 2>&1; then
    echo "ok: plot draws a PNG"
    passes=$((passes + 1))
  else
    echo "FAIL: plot: $(cat "$dir/err")"
    fails=$((fails + 1))
  fi
else
  echo "skip: plot needs gnuplot (tools/deps.sh installs gnuplot-nox)"
fi
printf '{"step":1}\n' >"$dir/bad_m.jsonl"
expect_none "plot: not a metrics file" "$dir/p.png" plot "$dir/bad_m.jsonl" --out "$dir/p.png"
: >"$dir/empty_m.jsonl"
expect_none "plot: no steps" "$dir/p.png" plot "$dir/empty_m.jsonl" --out "$dir/p.png"
# On a terminal, train --data draws a progress line on stderr (script(1) gives it one)
if command -v script >/dev/null; then
  script -qec "$bin train --data $dir/shards2 --seq-len 4 --steps 3 --log-every 3 --output $dir/tty.pt" /dev/null >"$dir/tty.out" 2>&1 || true
  if grep -q "step 1/3 (33%), about" "$dir/tty.out" && grep -q "training: ok" "$dir/tty.out"; then
    echo "ok: a progress line on a terminal"
    passes=$((passes + 1))
  else
    echo "FAIL: no progress line on a terminal: $(tail -c 300 "$dir/tty.out")"
    fails=$((fails + 1))
  fi
  "$bin" train --data "$dir/shards2" --seq-len 4 --steps 3 --output "$dir/tty.pt" 2>"$dir/err" >/dev/null
  if [ -s "$dir/err" ]; then echo "FAIL: progress written without a terminal"; fails=$((fails + 1)); fi
  rm -f "$dir"/tty.pt
fi
# --resume: a run's configuration may not change, except --steps (more), logging and saving;
# files that are not a text run's checkpoint, or of other shards, are refused
mkdir -p "$dir/ck"
"$bin" train --data "$dir/shards2" --seq-len 4 --steps 3 --stop-after 1 --output "$dir/ck/run.pt" >/dev/null 2>&1
"$bin" train --seq-len 4 --steps 1 --output "$dir/ck/walk.pt" >/dev/null 2>&1
"$bin" tokenizer-train --vocab-size 280 --input "$dir/text.txt" --out "$dir/tok2.json" >/dev/null
"$bin" prepare --tokenizer "$dir/tok2.json" --input "$dir/text.txt" "$dir/text.txt" --val-fraction 0.5 --out "$dir/other" >/dev/null
head -c 200000 "$dir/ck/run.pt" >"$dir/ck/truncated.pt"
expect_error "train: --resume of a walkthrough's checkpoint" train --resume "$dir/ck/walk.pt"
expect_error "train: --resume of a missing file" train --resume "$dir/ck/none.pt"
expect_error "train: --resume of a truncated checkpoint" train --resume "$dir/ck/truncated.pt"
expect_error "train: --resume with another batch size" train --resume "$dir/ck/run.pt" --batch-size 2
expect_error "train: --resume with another preset" train --resume "$dir/ck/run.pt" --preset 0.6B
expect_error "train: --resume with another optimizer" train --resume "$dir/ck/run.pt" --optimizer sgd
expect_error "train: --resume with fewer steps" train --resume "$dir/ck/run.pt" --steps 2
expect_error "train: --resume on shards of another tokenizer" train --resume "$dir/ck/run.pt" --data "$dir/other"
expect_error "train: --keep with a file --output" train --data "$dir/shards2" --keep 2 $out
expect_error "train: --stop-after at the last step" train --data "$dir/shards2" --steps 3 --stop-after 3 $out
expect_error "train: --save-every without --data" train --save-every 2 $out
expect_error "train: negative --save-every" train --data "$dir/shards2" --save-every -1 $out
# eval: the text run's checkpoint and shards above (its val split: a few tokens)
run="$dir/ck/run.pt"
expect_error "eval: missing model" eval "$dir/ck/none.pt" --data "$dir/shards2"
expect_error "eval: neither --data nor --text" eval "$run"
expect_error "eval: both --data and --text" eval "$run" --data "$dir/shards2" --text "$dir/text.txt"
expect_error "eval: zero --tokens" eval "$run" --data "$dir/shards2" --tokens 0
expect_error "eval: negative --tokens" eval "$run" --data "$dir/shards2" --tokens -5
expect_error "eval: zero --batch" eval "$run" --data "$dir/shards2" --batch 0
expect_error "eval: --seq-len past the context" eval "$run" --data "$dir/shards2" --seq-len 4097
expect_error "eval: a split shorter than a window" eval "$run" --data "$dir/shards2" --seq-len 100
expect_error "eval: unknown split" eval "$run" --data "$dir/shards2" --split test
expect_error "eval: unknown attention" eval "$run" --data "$dir/shards2" --attention full
expect_error "eval: unknown dtype" eval "$run" --data "$dir/shards2" --dtype float16
expect_error "eval: --data folder without meta.json" eval "$run" --data "$dir/full"
expect_error "eval: shards of another tokenizer than the model's" eval "$run" --data "$dir/other"
expect_error "eval: --tokenizer not the model's" eval "$run" --data "$dir/shards2" --tokenizer "$dir/tok2.json"
expect_error "eval: --tokenizer not the shards'" eval "$dir/ck/walk.pt" --data "$dir/shards2" --tokenizer "$dir/tok2.json"
expect_error "eval: shards of a tokenizer larger than the model's vocabulary" eval "$dir/ck/walk.pt" --data "$dir/bigvocab"
expect_error "eval: --text with no tokenizer known" eval "$dir/ck/walk.pt" --text "$dir/text.txt"
expect_error "eval: --text file missing" eval "$dir/ck/walk.pt" --text "$dir/none.txt" --tokenizer "$dir/tok.json"
# generate: the same checkpoints (run.pt records tok.json through its shards)
python3 - "$dir/tok.json" "$dir/big.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t.setdefault("added_tokens", []).append({"id": 5000, "content": "<|big|>", "single_word": False,
    "lstrip": False, "rstrip": False, "normalized": False, "special": True})
json.dump(t, open(sys.argv[2], "w"))
PY
python3 -c 'print("the " * 5000)' >"$dir/long.txt"
: >"$dir/no_prompts.txt"
expect_error "generate: missing model" generate "$dir/ck/none.pt" --prompt "the"
expect_error "generate: no prompt" generate "$run"
expect_error "generate: an empty prompt" generate "$run" --prompt ""
expect_error "generate: a prompt past the context" generate "$run" --prompt-file "$dir/long.txt"
expect_error "generate: new tokens past the context" generate "$run" --prompt "the" --max-new-tokens 5000
expect_error "generate: --top-p 0" generate "$run" --prompt "the" --top-p 0
expect_error "generate: --top-p above 1" generate "$run" --prompt "the" --top-p 1.5
expect_error "generate: negative --temperature" generate "$run" --prompt "the" --temperature -1
expect_error "generate: negative --top-k" generate "$run" --prompt "the" --top-k -1
expect_error "generate: zero --max-new-tokens" generate "$run" --prompt "the" --max-new-tokens 0
expect_error "generate: unknown dtype" generate "$run" --prompt "the" --dtype float16
expect_error "generate: --tokenizer not the model's" generate "$run" --prompt "the" --tokenizer "$dir/tok2.json"
expect_error "generate: a tokenizer larger than the model's vocabulary" generate "$dir/ck/walk.pt" --prompt "the" --tokenizer "$dir/big.json"
expect_error "generate: no tokenizer known" generate "$dir/ck/walk.pt" --prompt "the"
expect_error "generate: --prompt-file missing" generate "$run" --prompt-file "$dir/none.txt"
expect_error "generate: --prompt-file with no prompt" generate "$run" --prompt-file "$dir/no_prompts.txt"
expect_error "train: --sample-every without --prompt" train --data "$dir/shards2" --sample-every 2 $out
expect_error "train: --prompt without --data" train --prompt "the" $out
expect_error "train: an empty --prompt" train --data "$dir/shards2" --seq-len 4 --steps 2 --prompt "" $out
if command -v taskset >/dev/null; then
  expect_threads "default threads" 1 "" --
  expect_threads "--threads 2" 2 "--threads 2 is more than the 1 CPU(s)" -- --threads 2
  expect_threads "OMP_NUM_THREADS=3" 3 "OMP_NUM_THREADS=3 is more than the 1 CPU(s)" \
    OMP_NUM_THREADS=3 --
  expect_threads "--threads 1 over OMP_NUM_THREADS=3" 1 "" OMP_NUM_THREADS=3 -- --threads 1
else
  echo "skip: the thread-count checks need taskset (util-linux)"
fi
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
