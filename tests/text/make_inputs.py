#!/usr/bin/env python3
"""Writes the tokenizer tests' hard inputs into OUTDIR, one document per file.

usage: make_inputs.py OUTDIR [--jsonl FILE]

Every file is one document (a tokenizer encodes its whole content as one text). The names
say what each holds: prose with contractions, an e-mail with CRLF line endings, source code,
whitespace runs, digits, non-Latin scripts, emoji, combining marks and NFC, unusual
whitespace, Qwen3's special and added tokens in text, letters of recent Unicode versions,
control and edge code points, long runs (the BPE merge loop's worst cases), an empty file, a
single character, a ~200 KB mix of all of them; and invalid UTF-8 (bad-*.txt). Next to each
invalid file, FILE.py-replace holds Python's bytes.decode("utf-8", errors="replace")
re-encoded as UTF-8: what every reader of the file as text (Node's Buffer.toString, our
tokenizer) should see. --jsonl FILE also writes the valid documents, and lines that only JSON
can hold (escaped lone surrogates, escaped pairs, extra keys, a CRLF line end), as JSONL
{"text": ...} lines. Deterministic: the same bytes on every run (random.Random(1234)).
Python 3 with no extra packages.
"""
import json
import os
import random
import sys

SEED = 1234

# ---------------------------------------------------------------------------------------------
# Valid documents

PROSE = (
    "It's the end of the world as we know it, and I'm fine. They're sure we've won; "
    "you'll see, he'd said, and she'd've agreed if they'd asked. Don't, can't, won't, "
    "shouldn't've. O'Neil's dog's bone. Rock 'n' roll, 'tis the season, 'twas the night. "
    "IT'S LOUD. WE'LL SEE. THEY'RE HERE. I'M DONE. YOU'VE WON. HE'D GO. DON'T! "
    "Mixed: It'S, we'Ll, they'rE, I'm, you'VE, she'D, it'T. "
    "The long s: Congreſs'ſ act, 'ſ alone, it'ſt, we'ſhall, and the ligatures 'ﬅ and 'ﬆ, "
    "the Kelvin 'K, it'Kx. "
    "Curly quotes: it’s, we’ll, ‘quoted’, “double” — not contractions. "
    "Odd ones: '' 's ''s 'S' 'x 'll' ''ll trailing apostrophe' and a lone ' and "
    "possessive plurals: the Joneses' house, the boss's boss's office.\n\n"
    "\tA second paragraph, indented by a tab, with an ellipsis... and (parentheses), "
    "[brackets], {braces}; semi-colons: colons! Questions? Interrobang‽ Em—dash en–dash "
    "hyphen-ated -- double-hyphen. 100% of 3/4 cups @ $5.99 = #1 & *bold* _under_ ~tilde~ "
    "^caret^ `code` |pipe| \\backslash/ <angle>.\n"
    "Ünïcödé Latin: naïve café résumé coöperate façade jalapeño Øresund Łódź Ærø ẞtraße "
    "İstanbul ıi ǅungla ǈ Ǌ ŉ ǰ ﬁne ﬂow.\n"
)

EMAIL = "\r\n".join([
    "Return-Path: <jane.doe@example.org>",
    "Received: from mail.example.org (mail.example.org [192.0.2.17])",
    "\tby mx.example.net (Postfix) with ESMTPS id 4F3A21C0042",
    "\tfor <john@example.net>; Tue, 14 Mar 2023 09:26:53 +0100 (CET)",
    "Message-ID: <CAF=q8uY+3kD_x7@mail.example.org>",
    "Date: Tue, 14 Mar 2023 09:26:51 +0100",
    "From: \"Jane Doe\" <jane.doe@example.org>",
    "To: John Smith <john@example.net>, team@lists.example.com",
    "Cc: =?UTF-8?B?SsO2cmcgTcO8bGxlcg==?= <jorg@example.de>",
    "Subject: Re: Re: [proj-42] Q3 budget (v2) -- please review by Fri",
    "MIME-Version: 1.0",
    "Content-Type: text/plain; charset=\"UTF-8\"",
    "Content-Transfer-Encoding: 8bit",
    "",
    "Hi John,",
    "",
    "Thanks -- I've attached the revised sheet. Two things:",
    "",
    "  1. The totals on p. 3 were off by $1,204.50 (see row 17).",
    "  2. Can we move the call to 3:30pm? I'm out 12-14 Apr.",
    "",
    "Details are at https://wiki.example.org/proj-42/budget?rev=17&view=diff#L120 and",
    "http://192.0.2.17:8080/~jane/q3_v2.xlsx (VPN only); mirror: ftp://files.example.com/pub/q3.",
    "",
    "On Mon, Mar 13, 2023 at 6:02 PM John Smith <john@example.net> wrote:",
    "> Jane,",
    ">",
    "> Quick one: the Q3 numbers don't add up. Could you re-check?",
    ">> On Fri, Mar 10, 2023, Jörg Müller <jorg@example.de> wrote:",
    ">> > Attached. Let me know if anything's missing.",
    ">> > -- ",
    ">> > Jörg",
    "> ",
    "> Best,",
    "> John",
    "",
    "Cheers,",
    "Jane",
    "",
    "-- ",
    "Jane Doe | Senior Analyst | ACME Corp.",
    "1600 Amphitheatre Pkwy, Mountain View, CA 94043, USA",
    "Tel: +1 (650) 253-0000  Fax: +1-650-253-0001",
    "221B Baker Street, London NW1 6XE, United Kingdom",
    "Unsubscribe: <mailto:team-leave@lists.example.com?subject=unsubscribe>",
    "",
])

CODE = (
    "#include <stdio.h>\n"
    "\n"
    "/* A comment with a URL: https://example.com/a_b?c=d */\n"
    "static int add(int a, int b) {\n"
    "\treturn a + b;  // tab-indented\n"
    "}\n"
    "\n"
    "int main(void) {\n"
    "\tfor (int i = 0; i < 10; ++i) {\n"
    "\t\tif (i % 2 == 0 && i != 4) {\n"
    "\t\t\tprintf(\"%d\\n\", add(i, 0x7fffffff));\n"
    "\t\t} else if (i >= 8 || i <= -1) {\n"
    "\t\t\tcontinue;\n"
    "\t\t}\n"
    "\t}\n"
    "\treturn 0;\n"
    "}\n"
    "\n"
    "def f(x, *args, **kwargs):\n"
    "    \"\"\"Docstring with 'quotes' and \\\"escapes\\\".\"\"\"\n"
    "    if x is not None:\n"
    "        return [y ** 2 for y in range(x) if y % 3]  # comprehension\n"
    "        \n"
    "    return {'a': 1, \"b\": 2.5e-3, 'c': None}\n"
    "\n"
    "class Foo(Bar):\n"
    "  def __init__(self):\n"
    "    self._x = lambda a, b: a @ b\n"
    "\n"
    "fn main() -> Result<(), Box<dyn Error>> {\n"
    "    let v: Vec<u8> = vec![0u8; 1 << 20];\n"
    "    println!(\"{:?} {}\", &v[..4], v.len());\n"
    "    Ok(())\n"
    "}\n"
    "SELECT u.id, COUNT(*) AS n FROM users u WHERE u.name LIKE '%o''brien%' GROUP BY 1;\n"
    "$ ls -la | grep -E '^d' > /dev/null 2>&1 && echo \"ok\" || exit 1\n"
    "<div class=\"x\" data-id='3'>&nbsp;&lt;tag&gt;</div>\n"
    "    mixed\t \tindent\n"
    "\t    \n"
    "x=1;y=2;;z=x+++y---1;a->b;c=>d;e::f;g?.h??i;j!==k;l<<=2;m>>>=1\n"
)

DIGITS = (
    "0 1 12 123 1234 12345 123456 1234567 12345678901234567890 "
    "3.14159265358979 -2.5e-10 +6.022E23 0x1F 0b1010 0o777 1_000_000 "
    "1,234,567 1.234.567,89 12 345 678 (thin spaces) $1,000.00 €5 ¥100 ₹2,00,000 "
    "2023-03-14 14/03/2023 03/14/23 2023-03-14T09:26:51.123+01:00 09:26:51 "
    "+1 (650) 253-0000 +44 20 7946 0958 +86 10 6552 9988 555-0199 "
    "IPv4 192.168.0.1 IPv6 2001:db8::ff00:42:8329 v1.2.3-rc.4 "
    "Arabic-Indic ٠١٢٣٤٥٦٧٨٩ ١٢٣٫٤٥ Persian ۰۱۲۳۴۵۶۷۸۹ Devanagari ०१२३४५६७८९ "
    "Bengali ০১২৩ Thai ๐๑๒๓ full-width ０１２３４５６７８９ １２３，４５６ "
    "superscripts x² y³ 10⁻⁶ subscripts H₂O fractions ½ ¾ ⅞ Roman Ⅻ ⅻ Ⅳ circled ① ⑳ "
    "mathematical 𝟎𝟏𝟐 𝟘𝟙 "
    "digits in words: abc123def 3D 4K 5G A1B2C3 x86_64 ISO-8859-1 UTF-8 mp3 "
    "9999999999999999999999999999999999999999999999999999999999999999 0000000000007\n"
)

SCRIPTS = (
    "中文：我们今天去公园散步，天气很好。人工智能（AI）正在改变世界。繁體中文：這是一個測試。\n"
    "日本語：今日は良い天気ですね。カタカナとひらがな、漢字が混ざっています。ｶﾀｶﾅ（半角）。\n"
    "한국어: 안녕하세요, 만나서 반갑습니다. 대한민국의 수도는 서울입니다.\n"
    "Hangul jamo: \u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af (conjoining), "
    "\u3131\u314f (compatibility), \u1100\u1161 \u110b\u1175\u11bc\n"
    "العربية: مرحبا بالعالم، كيف حالك؟ هذا اختبار للنص العربي مع التشكيل: كَتَبَ الوَلَدُ الدَّرْسَ.\n"
    "עברית: שלום עולם! זהו מבחן. עִבְרִית עם ניקוד.\n"
    "हिन्दी: नमस्ते दुनिया। यह एक परीक्षण है। क्षत्रिय ज्ञान श्री।\n"
    "ไทย: สวัสดีครับ ภาษาไทยไม่มีช่องว่างระหว่างคำ น้ำ ที่นี่\n"
    "Русский: Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю. ЁЖИК ёжик\n"
    "Ελληνικά: Γειά σου Κόσμε! ΆΈΉΊΌΎΏ άέήίόύώ ΐΰ ς σ Σ\n"
    "ქართული: გამარჯობა მსოფლიო! Ⴀ ᲐᲑᲒ\n"
    "አማርኛ: ሰላም ለዓለም። እንዴት ነህ፧\n"
    "Other: Tiếng Việt có dấu: Việt Nam, người, được. Türkçe ğüşıöç. Ελλάς. "
    "Հայերեն բարեւ. ᏣᎳᎩ. ᠮᠣᠩᠭᠣᠯ. བོད་ཡིག. ខ្មែរ. ລາວ. မြန်မာ. தமிழ். తెలుగు. ಕನ್ನಡ. മലയാളം. ગુજરાતી. ਪੰਜਾਬੀ. සිංහල.\n"
    "RTL and bidi marks: \u200fשלום\u200e abc \u202aembed\u202c \u2066isolate\u2069 \u061c\n"
)

EMOJI = (
    "Faces 😀😃😄 😂🤣 hearts ❤️ ❤ 💔 🧡 "
    "ZWJ families 👨‍👩‍👧‍👦 👩‍❤️‍💋‍👨 🏳️‍🌈 🏴‍☠️ 👩🏽‍💻 🧑🏿‍🤝‍🧑🏻 "
    "flags 🇺🇸🇬🇧🇯🇵 🇩🇪 🇫🇷🇮🇹 lone regional 🇦 "
    "skin tones 👍🏻👍🏼👍🏽👍🏾👍🏿 👋🏽 "
    "variation selectors ☺︎ ☺️ ✔︎ ✔️ ©️ ®️ ™️ ↔️ "
    "keycaps 1️⃣ #️⃣ *️⃣ 🔟 "
    "tag sequence 🏴󠁧󠁢󠁳󠁣󠁴󠁿 "
    "text with emoji:I love 🍕and🍺!🎉🎉🎉 end🚀\n"
    "emoji then letters🙂abc and digits🙂123 and space 🙂 🙂  🙂\n"
)

COMBINING = (
    # decomposed é (e + U+0301): NFC composes it to U+00E9
    "cafe\u0301 vs caf\u00e9; re\u0301sume\u0301; A\u030a (A+ring) vs \u00c5 vs \u212b (Angstrom sign); "
    "\u2126 (Ohm) vs \u03a9; \u1e9b\u0323 (long s dot above + dot below); "
    "o\u0308\u0304 \u022b; q\u0303 (no precomposed form); e\u0301\u0301\u0301 stacked; "
    "a\u0328\u0301 \u0105\u0301; "
    # singletons and composition exclusions
    "\u0340 \u0341 \u0343 \u0344 \u0374 \u037e \u0387 \u1f71 \u2000 \u2001 \u2126 \u212a "
    "\u0958 \u0915\u093c (Devanagari nukta, excluded from composition) \ufb1d \u05d9\u05b4 "
    "\u2adc \u2add\u0338 "
    # canonical ordering of marks
    "a\u0301\u0316 a\u0316\u0301 a\u0323\u0302 a\u0302\u0323 "
    # Hangul: conjoining jamo compose to syllables under NFC
    "\u1112\u1161\u11ab\u1100\u1173\u11af \u110b\u1175 \u1100\u1161\u11a8 \uac00\u11a8 "
    "\u1100\u1100\u1161 \u1161\u11a8 "
    # marks after non-letters and at the start
    "\u0301start 1\u0301 !\u0301 \u0301 \u200d\u0301 "
    "Zalgo: Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349"
    "a\u0360\u0357\u0310\u0351\u0357\u035d\u0326\u0339\u0323l\u0353\u0356g\u0352o\u0358\n"
    # Unicode 13-16 composites (Dives Akuru, Kaithi, Tulu-Tigalari, Gurung Khema, Todhri):
    # tables older than the version leave them decomposed
    "\U00011935\U00011930 \U00011938 \U00011099\U000110ba \U000110ab "
    "\U00011382\U000113c9 \U00011383 \U0001611e\U0001611e \U00016121 \U000105d2\u0307 \U000105c9\n"
    # marks of Unicode 5-15 before U+0316 (combining class 220): canonical ordering moves U+0316
    # first past a mark of class 230 that the tables know (HF's NFC: Unicode 9's)
    "a\u1dc0\u0316 a\u1ab0\u0316 a\ua69e\u0316 a\U0001e944\u0316 a\u1df6\u0316 a\U00010d24\u0316 "
    "a\U0001e130\u0316 a\u1ac1\u0316 a\u0898\u0316 a\U0001e08f\u0316 a\u0316\u1dfa a\u0301\u0898\u0316\n"
)

WHITESPACE_ODD = (
    "nbsp:a\u00a0b  ogham:a\u1680b  mongolian vs:a\u180eb  "
    "en-quad..hair:a\u2000b\u2001c\u2002d\u2003e\u2004f\u2005g\u2006h\u2007i\u2008j\u2009k\u200al  "
    "line sep:a\u2028b  para sep:a\u2029b  narrow nbsp:a\u202fb  math:a\u205fb  "
    "ideographic:a\u3000b  NEL:a\u0085b  BOM/ZWNBSP:a\ufeffb  zwsp:a\u200bb  zwnj:a\u200cb  zwj:a\u200db  "
    "word joiner:a\u2060b  vt:a\x0bb  ff:a\x0cb  fs/gs/rs/us:a\x1cb\x1dc\x1ed\x1fe\n"
    "runs: \u00a0\u00a0\u00a0x \u3000\u3000y \u2028\u2029z \u0085\u0085w \u00a0 \u00a0v\n"
    "before letters:\u2003word \u00a0word \u3000word\u3000\n"
    "end\u00a0\u2003\u3000"
)

SPECIAL = (
    "<|endoftext|>Start of text.<|endoftext|>\n"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat's 2+2? Answer in <think>one</think> word.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nThe user asks 2+2.\n</think>\n\nFour.<|im_end|>\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
    "<tool_response>sunny</tool_response>\n"
    "glued:abc<|endoftext|>def<|im_end|><|im_end|>  <|im_start|>  x<|endoftext|>\n"
    "fim:<|fim_prefix|>def f(<|fim_suffix|>)<|fim_middle|>x<|fim_pad|> <|repo_name|>r<|file_sep|>a.py\n"
    "vision:<|vision_start|><|image_pad|><|image_pad|><|vision_end|><|video_pad|><|vision_pad|>"
    "<|object_ref_start|>o<|object_ref_end|><|box_start|>(1,2)<|box_end|><|quad_start|>q<|quad_end|>\n"
    "partial:<|endoftext| <|endoftext <|im_start> <im_start|> <|im_end <|endoftext|>> <<|endoftext|>\n"
    "<|ENDOFTEXT|> <| endoftext |> <|endoftext|\u200b> <think > </think <thinking> <|think|> </tool_call\n"
    "nested:<|im_<|endoftext|>start|> <<think>> <|im_start|<|im_end|>|>\n"
    "decomposed near specials: e\u0301<|endoftext|>e\u0301 <think>e\u0301</think>"
)

LETTERS_RECENT = (
    # letters and digits of Unicode 12-16 scripts: \p{L} / \p{N} tables of another version split
    # them differently
    "Unicode 12 Elymaic \U00010fe0\U00010fe1\U00010fe2 Nandinagari \U000119a0\U000119a1 "
    "Wancho \U0001e2c0\U0001e2c1 digits \U0001e2f0\U0001e2f1\n"
    "Unicode 13 Chorasmian \U00010fb0\U00010fb1 Dives Akuru \U00011900\U00011901 digits \U00011950\U00011951 "
    "Khitan \U00018b00\U00018b01 Yezidi \U00010e80\U00010e81\n"
    "Unicode 14 Cypro-Minoan \U00012f90\U00012f91 Old Uyghur \U00010f70\U00010f71 Tangsa \U00016a70\U00016a71 "
    "digits \U00016ac0\U00016ac1 Toto \U0001e290\U0001e291 Vithkuqi \U00010570\U00010597\n"
    "Unicode 15 Kawi \U00011f04\U00011f05 digits \U00011f50\U00011f51 Nag Mundari \U0001e4d0\U0001e4d1 "
    "digits \U0001e4f0\U0001e4f1 Cyrillic modifiers \U0001e030\U0001e031 CJK Ext H \U00031350\U00031351\n"
    "Unicode 15.1 CJK Ext I \U0002ebf0\U0002ebf1\n"
    "Unicode 16 Garay \U00010d4a\U00010d4b digits \U00010d40\U00010d41 Gurung Khema \U00016100\U00016101 "
    "Kirat Rai \U00016d43\U00016d44 Sunuwar \U00011bc0\U00011bc1 Todhri \U000105c0\U000105c1 "
    "Tulu-Tigalari \U00011380\U00011381 Ol Onal \U0001e5d0\U0001e5d1 Egyptian ext \U00013460\U00013461\n"
    "Unicode 17 (if any) \U00010ec5 \U00011db0 \U00016ea0\n"
    "Unassigned \U0003ffff? \U000e0080 plane 4 \U00040000\n"
)

CONTROLS = (
    "NUL:\x00 SOH:\x01 BEL:\x07 BS:\x08 ESC:\x1b[31mred\x1b[0m DEL:\x7f "
    "C1:\x80\x81\x9f "
    "noncharacters:\ufdd0\ufffe\uffff\U0001fffe\U0010ffff private:\ue000\uf8ff\U000f0000\U00100000 "
    "specials:\ufff9\ufffa\ufffb\ufffc\ufffd replacement\ufffd\ufffd "
    "max BMP \uffef last \U0010fffd surrogate-adjacent \ud7ff\ue000 "
    "soft hyphen co\u00adop bidi \u202e reversed\u202c tag \U000e0041\n"
)


def whitespace_runs():
    parts = []
    for n in range(1, 41):
        parts.append("w%d" % n + " " * n + "x")
    parts.append("\n")
    for n in range(1, 13):
        parts.append("t%d" % n + "\t" * n + "y")
    for n in range(1, 13):
        parts.append("n%d" % n + "\n" * n + "z")
    for n in range(1, 9):
        parts.append("r%d" % n + "\r\n" * n + "v")
    parts.append("lone cr\rx\r\ry\n\r\n\r z")
    mixes = [" \t", "\t ", " \n", "\n ", "  \n  ", " \r\n ", "\t\n\t", " \t \n\t \r\n  ",
             "\n\n \n", "   \t\t  ", " \u00a0 ", "\u00a0\n", "\n\u3000"]
    for m in mixes:
        parts.append("[" + m + "a" + m + "!" + m + "1" + m + "]")
    parts.append("spaces before punctuation   ...   !!!   ,,,\n")
    parts.append("   leading spaces then text and trailing spaces   ")
    parts.append("\n\n   \n\t\n  ")
    return "".join(parts)


def long_runs(rng):
    # the BPE merge loop's worst cases: long words, repeated symbols, overlapping pairs
    parts = [
        "a" * 3000, " ", "ab" * 1500, " ", "aab" * 700, " ", " " * 2000, "x", "\n" * 500,
        "0" * 1000, " ", "1234567890" * 100, " ", "!" * 1500, " ", "=-" * 800, "\n",
        "😀" * 300, " ", "中" * 1000, " ", "\u0301" * 200, " ", "e\u0301" * 300, " ",
        "\t" * 300, "y", "\r\n" * 300, "z ",
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5000)), " ",
        "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(2000)), " ",
        "antidisestablishmentarianism" * 50, " ",
        "<|endoftext|>" * 100, "\n",
    ]
    return "".join(parts)


def mixed(rng, docs, size):
    """~size bytes: random pieces of every document, with random joints."""
    pieces = []
    for d in docs:
        step = 97
        for i in range(0, len(d), step):
            pieces.append(d[i:i + rng.randint(1, 300)])
    joints = ["", " ", "\n", "\r\n", "  ", "\t", "'s ", "<|endoftext|>", "\u00a0", "e\u0301"]
    out = []
    n = 0
    while n < size:
        p = rng.choice(pieces) + rng.choice(joints)
        out.append(p)
        n += len(p.encode("utf-8"))
    return "".join(out)


def valid_documents(rng):
    docs = [
        ("prose-contractions", PROSE),
        ("email-crlf", EMAIL),
        ("source-code", CODE),
        ("whitespace-runs", whitespace_runs()),
        ("digits", DIGITS),
        ("scripts", SCRIPTS),
        ("emoji", EMOJI),
        ("combining-nfc", COMBINING),
        ("whitespace-unicode", WHITESPACE_ODD),
        ("special-tokens", SPECIAL),
        ("letters-recent-unicode", LETTERS_RECENT),
        ("controls-edge-codepoints", CONTROLS),
        ("long-runs", long_runs(rng)),
        ("empty", ""),
        ("one-char", "a"),
        ("one-space", " "),
        ("one-newline", "\n"),
        ("one-emoji", "\U0001f600"),
        ("one-special", "<|im_end|>"),
        ("bom-start", "\ufeffText after a byte order mark.\n"),
        ("end-space", "ends with a space "),
        ("end-newlines", "ends with newlines\n\n"),
        ("end-spaces-newline", "ends with spaces and a newline  \n"),
        ("end-apostrophe", "ends with an apostrophe'"),
        ("end-contraction", "ends with a contraction we'll"),
        ("end-crlf", "line\r\nline\r\n"),
    ]
    base = [d for _, d in docs]
    docs.append(("mixed-200k", mixed(rng, base, 200_000)))
    return docs


# ---------------------------------------------------------------------------------------------
# Invalid UTF-8

def invalid_documents(rng):
    docs = [
        ("lone-continuation", b"abc\x80def \xbf\xbf ghi\x80\x81\x82 \xc3\xa9\xa9 end"),
        ("truncated-2", b"caf\xc3 au lait \xc3"  b"x \xdf\xdf"),
        ("truncated-3", b"euro \xe2\x82 sign \xe2 x \xe2\x82\xe2\x82\xac ok \xef\xbf"),
        ("truncated-4", b"smile \xf0\x9f\x98 x \xf0\x9f y \xf0 z \xf0\x9f\x98\xf0\x9f\x98\x80"),
        ("overlong", b"nul \xc0\x80 slash \xc0\xaf \xc1\xbf 3-byte \xe0\x80\x80 \xe0\x9f\xbf "
         b"4-byte \xf0\x80\x80\x80 \xf0\x8f\xbf\xbf"),
        ("surrogates", b"high \xed\xa0\x80 low \xed\xbf\xbf pair \xed\xa0\xbd\xed\xb8\x80 "
         b"(CESU-8 for U+1F600) max \xed\x9f\xbf ok"),
        ("bytes-f5-ff", b"\xf5 \xf6 \xf7 \xf8\x88\x80\x80\x80 \xf9 \xfa \xfb \xfc\x84\x80\x80\x80\x80 "
         b"\xfd \xfe \xff \xfe\xff \xff\xfe past max \xf4\x90\x80\x80"),
        ("truncated-at-end-3", b"the file ends inside a character \xe2\x82"),
        ("truncated-at-end-4", b"the file ends inside an emoji \xf0\x9f\x98"),
        ("truncated-at-end-2", b"ends \xc3"),
        ("only-invalid", b"\xff"),
        ("invalid-near-specials", b"<|endoftext|>\xff<|im_end|>\xc3<|im_start|>\xe2\x82 "
         b"<|endof\xfftext|> <think>\xed\xa0\x80</think>'\x80s it\xe2\x80's"),
        ("invalid-in-whitespace", b"a \xa0b  \xc2 \xc2\xa0\xa0 c\r\xff\nd\t\x80\t"),
        ("invalid-after-combining", b"e\xcc\x81\xcc e\xcc\x81\x81 \xe1\x84\x92\xe1\x85"),
        ("random-bytes", bytes(rng.getrandbits(8) for _ in range(4096))),
    ]
    # valid text with about 1% of its bytes replaced by random ones
    text = bytearray((PROSE + SCRIPTS + EMOJI + SPECIAL).encode("utf-8") * 4)
    for i in range(len(text)):
        if rng.random() < 0.01:
            text[i] = rng.getrandbits(8)
    docs.append(("corrupted-text", bytes(text)))
    return docs


def jsonl_lines(docs):
    """JSONL for --jsonl: every valid document, then lines only JSON can express."""
    lines = []
    for i, (_, d) in enumerate(docs):
        # alternate raw UTF-8 and \u escapes (ensure_ascii) so both are read
        lines.append(json.dumps({"text": d}, ensure_ascii=bool(i % 2)))
    extra = [
        '{"text": "lone high surrogate \\ud800 and low \\udc00 escaped"}',
        '{"text": "escaped pair \\ud83d\\ude00 and reversed \\ude00\\ud83d"}',
        '{"text": "escapes \\" \\\\ \\/ \\b \\f \\n \\r \\t \\u0000 \\u001f \\u00e9 \\u00E9"}',
        '{"id": 7, "meta": {"text": "not this"}, "text": "text after other keys", "x": [1, 2]}',
        '  {  "text"  :  "whitespace around the JSON"  }  ',
        '{"text": "a CRLF line end"}\r',
        '{"text": ""}',
    ]
    return lines + extra


def main():
    args = sys.argv[1:]
    jsonl = None
    if len(args) == 3 and args[1] == "--jsonl":
        jsonl = args[2]
        args = args[:1]
    if len(args) != 1:
        sys.exit("usage: make_inputs.py OUTDIR [--jsonl FILE]")
    out = args[0]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(SEED)
    docs = valid_documents(rng)
    for i, (name, text) in enumerate(docs):
        with open(os.path.join(out, "%02d-%s.txt" % (i, name)), "wb") as f:
            f.write(text.encode("utf-8"))
    for name, data in invalid_documents(rng):
        path = os.path.join(out, "bad-%s.txt" % name)
        try:
            data.decode("utf-8")
            sys.exit("make_inputs.py: %s is valid UTF-8" % path)
        except UnicodeDecodeError:
            pass
        with open(path, "wb") as f:
            f.write(data)
        with open(path + ".py-replace", "wb") as f:
            f.write(data.decode("utf-8", errors="replace").encode("utf-8"))
    if jsonl:
        with open(jsonl, "w", encoding="utf-8", newline="") as f:
            for line in jsonl_lines(docs):
                f.write(line + "\n")


if __name__ == "__main__":
    main()
