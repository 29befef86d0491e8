#!/usr/bin/env python3
"""Writes variants of a byte-level BPE tokenizer.json (Qwen3's) into OUTDIR, each exercising
pipeline settings the tokenizer library supports beyond Qwen's own: GPT-2's ByteLevel regex
(with and without a prefix space), Llama 3's pattern with ignore_merges and a BOS template,
the other Split behaviours and invert, and added tokens with lstrip / rstrip / single_word and
a normalized one. tests/text/parity.sh then compares tiny-qwen3 with Hugging Face on each.

usage: tests/text/variants.py TOKENIZER.json OUTDIR
"""
import copy
import json
import os
import sys

src, out = sys.argv[1], sys.argv[2]
base = json.load(open(src, encoding="utf-8"))
os.makedirs(out, exist_ok=True)
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
              "use_regex": False}
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def variant(name, change):
    t = copy.deepcopy(base)
    change(t)
    with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(t, f, ensure_ascii=False)


def gpt2(t, prefix):
    t["normalizer"] = None
    t["pre_tokenizer"] = dict(byte_level, add_prefix_space=prefix, use_regex=True)


variant("gpt2", lambda t: gpt2(t, False))
variant("gpt2-prefix-space", lambda t: gpt2(t, True))


def llama3(t):
    t["normalizer"] = None
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
        byte_level]}
    t["model"]["ignore_merges"] = True
    bos = "<|im_start|>"
    t["post_processor"] = {"type": "Sequence", "processors": [
        dict(byte_level, trim_offsets=True),
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": bos, "type_id": 1}},
                  {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {bos: {"id": bos, "ids": [151644], "tokens": [bos]}}}]}


variant("llama3", llama3)


def behaviours(t):
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "MergedWithNext",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": r"\p{N}+"}, "behavior": "Contiguous",
         "invert": False},
        {"type": "Split", "pattern": {"String": "."}, "behavior": "MergedWithPrevious",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": r"[\p{L}']+"}, "behavior": "Removed",
         "invert": True},
        dict(byte_level, use_regex=True)]}


variant("split-behaviours", behaviours)


def added_rules(t):
    for a in t["added_tokens"]:
        if a["content"] == "<think>":
            a["lstrip"] = True
        elif a["content"] == "</think>":
            a["rstrip"] = True
        elif a["content"] == "<tool_call>":
            a["single_word"] = True
        elif a["content"] == "<|im_end|>":
            a["lstrip"] = a["rstrip"] = True
    # a normalized added token, matched after NFC (written decomposed here)
    t["added_tokens"].append({"id": 151669, "content": "re\u0301sume\u0301", "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": True,
                              "special": False})
    t["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}]}


variant("added-rules", added_rules)
print("\n".join(sorted(os.listdir(out))))
