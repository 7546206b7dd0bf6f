#!/usr/bin/env python3
"""Tokenizer goldens from llama.cpp, for tests/unit/test_tokenizer.c.

How the goldens were made (re-run to regenerate):

    BIN=$(scripts/goldens/build-llama-cpp.sh)          # llama.cpp 0.3.36 sdist
    PYTHONPATH=/tmp/llcpp/llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=$BIN \
        python3 scripts/goldens/tokenizer_goldens.py MODEL.gguf tests/data

With a third argument "gemma" (MODEL.gguf = $(scripts/gemma-model.sh))
it writes tokenizer_golden_gemma.tsv alone: Gemma 3's vocabulary over
GEMMA_STRINGS (turn markers, specials, whitespace runs) and the strings
below.

MODEL.gguf is the default model (SmolLM2-135M-Instruct Q4_1, byte-level BPE,
pre-tokenizer "smollm"). llama.cpp (from the llama-cpp-python 0.3.36 sdist)
loads it vocab-only and tokenizes a fixed list of strings with
llama_tokenize (add_special, parse_special as given per line).

The script also trains a tiny SentencePiece BPE model (sentencepiece, byte
fallback on, 600 pieces, fixed seed and inputs written below) and writes it
as a GGUF file with the conventions of llama.cpp's converter (tokens, scores,
token types with <0xNN> byte tokens, tokenizer.ggml.model = "llama"), then
makes the same kind of goldens for it with llama.cpp.

Other pre-tokenizers are checked with the default model's vocabulary and
merges under another `tokenizer.ggml.pre` ("default", "gpt-2", "llama-bpe",
"qwen2"): the script writes such vocabulary-only files to a temporary
directory (the test builds the same files in memory) and records llama.cpp's
tokens for them. SmolLM2 has no multi-digit tokens, which would hide how a
pre-tokenizer groups digits, so these files append the tokens "00".."99" and
"000".."999" with the merges that make them ("d d", then "dd d").

Written:
  tokenizer_golden.tsv      default model goldens
  tokenizer_golden_pre.tsv  the default model's vocabulary under other
                            pre-tokenizers ("pre <name>" lines start each)
  spm_tiny.gguf             the tiny SentencePiece vocabulary (no tensors)
  tokenizer_golden_spm.tsv  its goldens

File format (tab-separated, one record per line, '#' lines are comments):
  meta  <key>  <value>                 e.g. "meta eog 0 2 4"
  enc   <add_special> <parse_special> <text as hex> <ids, space-separated>
  piece <id> <piece hex, special=0> <piece hex, special=1>
Strings are hex so tabs, newlines and any bytes survive.
"""
import ctypes
import hashlib
import os
import random
import sys
import tempfile

import llama_cpp

# ---------------------------------------------------------------------------
# The strings
# ---------------------------------------------------------------------------

HAND = [
    "Hello world",
    "Hello, world!",
    " Hello world",
    "Hello world ",
    "  Hello  world  ",
    "hello\tworld",
    "line one\nline two\n",
    "\n\nparagraph\n\n\nnext",
    "windows\r\nline\r\nends",
    "trailing newline\n",
    "\n",
    " ",
    "  ",
    "\t",
    "\t\t\t",
    " \n \n ",
    "\n \n",
    "a  b   c    d",
    "a\t\tb",
    "    indented four",
    "\tindented tab",
    "word   \n   word",
    "I'm sure you're right, we've seen they'll say it's what he'd do.",
    "I'M SURE YOU'RE RIGHT, WE'VE SEEN THEY'LL SAY IT'S WHAT HE'D DO.",
    "The cat's toy; the CAT'S toy; 'tis; don't DON'T Don't",
    "'s 't 're 've 'm 'll 'd",
    "it'sok IT'SOK we'REgood they'Veseen x'LLy I'Mhere 'dd 'Ss 'Tt",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "rock 'n' roll ''quoted'' '''",
    "It\u2019s curly \u2018quotes\u2019 and \u201cdouble\u201d",
    "1234567890",
    "3.14159265358979323846",
    "12,345,678.90",
    "0x1F600 0b1010 1e-9 -42 +7",
    "call 555-0123 or +1 (800) 123-4567",
    "In 2024, 73% of 1000 users paid $19.99.",
    "99999999999999999999999999999999999999",
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "v1.2.3-rc.4+build.567",
    "!!!???...,,,;;;:::",
    "Wait... what?! Really?!?",
    "---===+++***///\\\\\\|||",
    "@#$%^&*()_+{}[]<>~`",
    "(((nested))) [[[brackets]]] {{{braces}}}",
    "a.b,c;d:e!f?g",
    "https://example.com/path/to/page?query=1&x=y#frag",
    "Visit http://www.example.org:8080/index.html now",
    "mailto:someone@example.com",
    "user.name+tag@sub.example.co.uk",
    "C:\\Program Files\\App\\bin\\app.exe",
    "/usr/local/lib/python3.11/site-packages/",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "class Foo(Base):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, x: int = 0) -> None:\n        self.x = x\n",
    "import numpy as np\nx = np.arange(10).reshape(2, 5)\nprint(x.T @ x)\n",
    "#include <stdio.h>\n\nint main(void) {\n\tprintf(\"hello, %s!\\n\", \"world\");\n\treturn 0;\n}\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`);",
    "function foo() {\n  return { a: 1, 'b': [2, 3], \"c\": null };\n}",
    "fn main() {\n    let v: Vec<u8> = vec![1, 2, 3];\n    println!(\"{:?}\", v);\n}",
    "impl<'a> Iterator for Tokens<'a> { type Item = &'a str; }",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "<html><head><title>Test</title></head><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "<div>\n  <span>text</span>\n</div>",
    "#!/bin/sh\nset -eu\nfor f in *.txt; do echo \"$f\"; done\n",
    "ls -la | grep '^d' | awk '{print $9}' > dirs.txt 2>&1",
    "{\"key\": \"value\", \"list\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "key: value\nlist:\n  - one\n  - two\n",
    "\\begin{equation} E = mc^2 \\end{equation}",
    "x\u00b2 + y\u00b2 = z\u00b2, \u00bd + \u00bc = \u00be",
    "\u2160 \u2161 \u2162 \u216b roman numerals",
    "\uff11\uff12\uff13 fullwidth digits \uff21\uff22\uff23",
    "\u0661\u0662\u0663 arabic-indic digits",
    "\u0967\u0968\u0969 devanagari digits",
    "\u2200x \u2208 \u211d: x\u00b2 \u2265 0 \u21d2 \u221ax \u2208 \u211d",
    "\u03b1\u03b2\u03b3 \u0394\u03a3\u03a9 \u03c0 \u2248 3.14",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber se\u00f1or",
    "cafe\u0301 combining acute",
    "\u00c5ngstr\u00f6m vs A\u030angstro\u0308m",
    "Stra\u00dfe \u00df \u1e9e",
    "\u0130stanbul \u0131\u0130",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0393\u03b5\u03b9\u03b1 \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8\u3002",
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002",
    "\u4e2d\u6587English\u6df7\u5408mixed\u6587\u672c",
    "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c",
    "\u79c1\u306f\u5b66\u751f\u3067\u3059\u3002\u6771\u4eac\u306b\u4f4f\u3093\u3067\u3044\u307e\u3059\u3002",
    "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3068\u6f22\u5b57",
    "\uff76\uff80\uff76\uff85 halfwidth",
    "\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4",
    "\ud55c\uad6d\uc5b4\ub294 \uc7ac\ubbf8\uc788\uc2b5\ub2c8\ub2e4.",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u062c\u0645\u064a\u0644\u0629.",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e \u0938\u0941\u0902\u0926\u0930 \u0939\u0948\u0964",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
    "\u0532\u0561\u0580\u0587 \u0561\u0577\u056d\u0561\u0580\u0570",
    "Tiếng Việt có dấu",
    "\U0001F600\U0001F601\U0001F602",
    "I love \U0001F355 and \U0001F363!",
    "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 family",
    "\U0001F44D\U0001F3FD \U0001F44B\U0001F3FF \U0001F9D1\U0001F3FB\u200D\U0001F4BB",
    "\U0001F3F3\ufe0f\u200d\U0001F308 \U0001F3F4\u200d\u2620\ufe0f",
    "\U0001F1EB\U0001F1F7 \U0001F1EF\U0001F1F5 \U0001F1FA\U0001F1F8",
    "\u2764\ufe0f \u2764 \u263a\ufe0f \u2603",
    "emoji\U0001F680inside\U0001F680words",
    "  \U0001F600  ",
    "\u2728\u2728\u2728 sparkle \u2728",
    "zero\u200bwidth\u200cjoiner\u200dmarks\ufeff",
    "no\u00a0break\u00a0space",
    "ideographic\u3000space",
    "next\u0085line",
    "a \u0085b x\u0085 y \u0085\u0085\u0085 z",
    "word\u00a0\u00a0word a\u3000 b tab\t\u0085\nx",
    "\u2028\u2028a \u2029 b\u205f\u205f",
    "line\u2028separator\u2029paragraph",
    "em\u2003space en\u2002space thin\u2009space",
    "narrow\u202fnbsp math\u205fspace ogham\u1680space",
    "\u00a0 leading nbsp",
    "tab\u000bvertical\u000cformfeed",
    "\x00nul\x00byte",
    "control\x01\x02\x1b[0m chars",
    "\x1c\x1d\x1e\x1f separators",
    "\u00ad soft hyphen",
    "\ufffd replacement char",
    "\ue000 private use \U000F0000",
    "unicode 15: \U0001E4D0\U0001E4D1x \U00031350\U00031351 \U00011F50\U00011F51 \U0001D2C0 \U00011F43!",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
    "<|im_start|>assistant\nSure, here's the code:\n```python\nprint(1)\n```<|im_end|>",
    "text before<|endoftext|>text after",
    "<|endoftext|><|endoftext|>",
    "<|endoftext|>",
    "<|im_end|>",
    " <|im_end|> ",
    "<|im_start|><|im_end|>",
    "<|im_start|<|im_end|>|>",
    "<|im_start>user",
    "< |im_start| >",
    "<|IM_START|>",
    "<repo_name>cinfer<file_sep>main.c<filename>x.py<gh_stars>100",
    "<fim_prefix>def f(<fim_suffix>):<fim_middle>",
    "<issue_start>bug<issue_comment>fix<issue_closed>",
    "<jupyter_start><jupyter_code>x=1<jupyter_output>1<empty_output>",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n2 + 2 = 4.<|im_end|>\n",
    "Mr. O'Neil's co-op was 15% off -- sale!",
    "e.g. i.e. etc. vs. Dr. St.",
    "CamelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case",
    "__init__ __name__ == '__main__'",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "abababababababababababababababababababab",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "A man, a plan, a canal: Panama!",
    "   leading spaces",
    "trailing spaces   ",
    "\n\nleading newlines",
    "trailing newlines\n\n\n",
    " \t mixed \t whitespace \t ",
    "a\n\tb\n\t\tc\n\t\t\td",
    "end with tab\t",
    "\r",
    "\r\r\n\n",
    "x" * 200,
    "na" * 100,
    "1" * 64,
    " " * 33,
    "\n" * 17,
    "-" * 80,
    "=" * 40 + "\n" + "#" * 40,
]


def generated():
    out = []
    ws = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\n ", "\r\n", "\t ",
          " \t", "\u00a0", "\u3000", "  \n  "]
    ctx = [("a", "b"), ("1", "2"), ("!", "?"), ("\u4e2d", "\u6587"),
           ("x", ""), ("", "y"), ("it", "s")]
    for w in ws:
        for l, r in ctx:
            out.append(l + w + r)
    # digits next to everything
    for s in ["a1", "1a", " 1", "1 ", "a 12 b", "12ab34", "\u00bd1", "1.000,5",
              "\u0663\u0664", "x\u00b2y"]:
        out.append(s)
    # contraction case mixes
    for c in ["s", "S", "t", "T", "re", "RE", "Re", "rE", "ve", "VE", "m", "M",
              "ll", "LL", "Ll", "d", "D"]:
        out.append("it'" + c + " ok")
        out.append("'" + c)
    # special tokens glued to text
    for tok in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]:
        for l, r in [("", ""), ("a", "b"), (" ", " "), ("\n", "\n"),
                     ("<", ">"), ("|", "|")]:
            out.append(l + tok + r)
    return out


def random_strings(n, seed=1234):
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "\u00e9\u00fc\u00df\u00f1\u00e7\u0101\u0161\u017e\u0142",
        "\u4e00\u4e8c\u4e09\u4eba\u5927\u5c0f\u5c71\u6c34\u706b",
        "\u3042\u3044\u3046\u30a2\u30a4\u30a6",
        "\uac00\ub098\ub2e4\ub77c",
        "\u0627\u0628\u062a\u062b",
        "\u0915\u0916\u0917\u093e\u093f",
        "\U0001F600\U0001F44D\U0001F3FD\u200d\u2764\ufe0f\U0001F680",
        "\u00a0\u2009\u3000\u0085",
        "\u00b2\u00bd\u2160\uff11",
    ]
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        s = "".join(rng.choice(rng.choice(pools)) for _ in range(k))
        out.append(s)
    return out


def all_strings():
    seen = set()
    res = []
    for s in HAND + generated() + random_strings(120):
        if s not in seen:
            seen.add(s)
            res.append(s)
    return res


# ---------------------------------------------------------------------------
# llama.cpp access
# ---------------------------------------------------------------------------

class Vocab:
    def __init__(self, path):
        self.llm = llama_cpp.Llama(model_path=path, vocab_only=True,
                                   verbose=False)
        self.v = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n = llama_cpp.llama_vocab_n_tokens(self.v)

    def tokenize(self, data, add_special, parse_special):
        cap = len(data) * 2 + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.v, data, len(data), buf, cap,
                                     add_special, parse_special)
        assert n >= 0, (data, n)
        return list(buf[:n])

    def piece(self, tok, special):
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.v, tok, buf, 256, 0, special)
        assert n >= 0
        return buf.raw[:n]

    def meta(self):
        v = self.v
        eog = [i for i in range(self.n) if llama_cpp.llama_vocab_is_eog(v, i)]
        ctl = [i for i in range(self.n)
               if llama_cpp.llama_vocab_is_control(v, i)]
        return [
            ("n_vocab", str(self.n)),
            ("bos", str(llama_cpp.llama_vocab_bos(v))),
            ("eos", str(llama_cpp.llama_vocab_eos(v))),
            ("eot", str(llama_cpp.llama_vocab_eot(v))),
            ("pad", str(llama_cpp.llama_vocab_pad(v))),
            ("add_bos", str(int(llama_cpp.llama_vocab_get_add_bos(v)))),
            ("add_eos", str(int(llama_cpp.llama_vocab_get_add_eos(v)))),
            ("eog", " ".join(map(str, eog))),
            ("control", " ".join(map(str, ctl))),
        ]


def header(path_model, title):
    sha = hashlib.sha256(open(path_model, "rb").read()).hexdigest()
    return [
        f"# cinfer tokenizer goldens ({title}): made by "
        "scripts/goldens/tokenizer_goldens.py",
        "# llama.cpp from the llama-cpp-python 0.3.36 sdist (llama_tokenize, "
        "llama_token_to_piece)",
        f"# model {os.path.basename(path_model)} sha256 {sha}",
        "# meta <key> <value> | enc <add_special> <parse_special> <text hex> "
        "<ids> | piece <id> <hex special=0> <hex special=1> | pre <name>",
    ]


def enc_lines(voc, strings, all_modes=True):
    lines = []
    for i, s in enumerate(strings):
        data = s.encode("utf-8")
        modes = [(0, 1)]
        if all_modes and ("<" in s or i % 4 == 0):
            modes.append((0, 0))
        if all_modes and i % 7 == 0:
            modes.append((1, 1))
        for add, parse in modes:
            ids = voc.tokenize(data, bool(add), bool(parse))
            lines.append(f"enc\t{add}\t{parse}\t{data.hex()}\t"
                         + " ".join(map(str, ids)))
    return lines


def write_goldens(path_model, path_out, strings, piece_ids, title):
    voc = Vocab(path_model)
    lines = header(path_model, title)
    for k, val in voc.meta():
        lines.append(f"meta\t{k}\t{val}")
    enc = enc_lines(voc, strings)
    n_enc = len(enc)
    lines += enc
    for t in piece_ids:
        if t < voc.n:
            lines.append(f"piece\t{t}\t{voc.piece(t, False).hex()}\t"
                         f"{voc.piece(t, True).hex()}")
    open(path_out, "w").write("\n".join(lines) + "\n")
    print(f"{path_out}: {len(strings)} strings, {n_enc} encodings, "
          f"{len(piece_ids)} pieces")


# ---------------------------------------------------------------------------
# The default model's vocabulary under other pre-tokenizers
# ---------------------------------------------------------------------------

PRE_VARIANTS = ["default", "gpt-2", "llama-bpe", "qwen2"]


def make_pre_variant(model, pre, path):
    """A vocabulary-only copy of `model` with tokenizer.ggml.pre = pre."""
    import gguf

    r = gguf.GGUFReader(model)

    def scalar(key):
        f = r.fields[key]
        return f.contents()

    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(256)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    toks = [bytes(r.fields["tokenizer.ggml.tokens"].parts[i])
            for i in r.fields["tokenizer.ggml.tokens"].data]
    types = [int(x) for x in scalar("tokenizer.ggml.token_type")]
    merges = [bytes(r.fields["tokenizer.ggml.merges"].parts[i]).decode()
              for i in r.fields["tokenizer.ggml.merges"].data]
    for i in range(100):
        toks.append(f"{i:02d}".encode())
        types.append(1)
        merges.append(f"{i // 10} {i % 10}")
    for i in range(1000):
        toks.append(f"{i:03d}".encode())
        types.append(1)
        merges.append(f"{i // 10:02d} {i % 10}")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(int(scalar("tokenizer.ggml.bos_token_id")))
    w.add_eos_token_id(int(scalar("tokenizer.ggml.eos_token_id")))
    w.add_unk_token_id(int(scalar("tokenizer.ggml.unknown_token_id")))
    w.add_pad_token_id(int(scalar("tokenizer.ggml.padding_token_id")))
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_pre_goldens(model, path_out, strings):
    lines = header(model, "default model vocabulary, other pre-tokenizers")
    with tempfile.TemporaryDirectory() as d:
        for pre in PRE_VARIANTS:
            path = os.path.join(d, f"vocab-{pre}.gguf")
            make_pre_variant(model, pre, path)
            voc = Vocab(path)
            lines.append(f"pre\t{pre}")
            lines += enc_lines(voc, strings, all_modes=False)
    open(path_out, "w").write("\n".join(lines) + "\n")
    print(f"{path_out}: {len(PRE_VARIANTS)} pre-tokenizers x "
          f"{len(strings)} strings")


# ---------------------------------------------------------------------------
# Tiny SentencePiece vocabulary
# ---------------------------------------------------------------------------

SPM_TRAIN = [
    "The quick brown fox jumps over the lazy dog.",
    "A tokenizer turns text into numbers that a model can read.",
    "Byte fallback keeps every character, even ones never seen in training.",
    "Hello world! Hello there. Hello again, my old friend.",
    "Numbers like 123, 4567 and 3.14 appear in text all the time.",
    "Spaces, tabs\tand newlines\nmatter to the tokenizer.",
    "It's what they're saying: we'll see, you'd think, I'm sure.",
    "def main():\n    print('hello')\n    return 0\n",
    "The model reads tokens one by one and predicts the next.",
    "Sentences end with periods. Questions end with question marks?",
    "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e na\u00efve r\u00e9sum\u00e9.",
    "\u4f60\u597d\u4e16\u754c \u3053\u3093\u306b\u3061\u306f",
]


def spm_corpus():
    rng = random.Random(7)
    words = " ".join(SPM_TRAIN).split()
    lines = list(SPM_TRAIN)
    for _ in range(3000):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))))
    return lines


def make_spm_gguf(path):
    import sentencepiece as spm
    import gguf

    with tempfile.TemporaryDirectory() as d:
        corpus = os.path.join(d, "corpus.txt")
        open(corpus, "w").write("\n".join(spm_corpus()) + "\n")
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=os.path.join(d, "m"), model_type="bpe",
            vocab_size=600, byte_fallback=True, character_coverage=0.9995,
            split_digits=True, allow_whitespace_only_pieces=True,
            remove_extra_whitespaces=False, normalization_rule_name="identity",
            user_defined_symbols=["<|user|>"], num_threads=1, seed_sentencepiece_size=20000,
            minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "m.model"))

    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            tt = gguf.TokenType.UNKNOWN
        elif sp.is_control(i):
            tt = gguf.TokenType.CONTROL
        elif sp.is_unused(i):
            tt = gguf.TokenType.UNUSED
        elif sp.is_byte(i):
            tt = gguf.TokenType.BYTE
        elif sp.id_to_piece(i) == "<|user|>":
            tt = gguf.TokenType.USER_DEFINED
        else:
            tt = gguf.TokenType.NORMAL
        types.append(tt)

    w = gguf.GGUFWriter(path, "llama")
    w.add_name("spm-tiny")
    w.add_context_length(256)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


SPM_STRINGS = [
    "Hello world",
    "Hello world!",
    " Hello world",
    "  two leading spaces",
    "trailing space ",
    "The quick brown fox jumps over the lazy dog.",
    "the lazy dog jumps over the quick brown fox",
    "Tokenizer tokens numbers 123 4567 89",
    "It's what they're saying: we'll see.",
    "tabs\tand\nnewlines\n",
    "\n",
    " ",
    "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e",
    "\u4f60\u597d\u4e16\u754c",
    "unseen: \u0416\u0436 \u05d0 \u0e01 \U0001F600 \U0001F468\u200d\U0001F469",
    "emoji \U0001F44D\U0001F3FD here",
    "<s>Hello</s>",
    "<s> Hello </s> world",
    "<unk>",
    "a<|user|>b",
    "<|user|> hi <|user|>",
    "def main():\n    print('hello')\n",
    "Sentences end with periods. Questions end with question marks?",
    "xyzzy qwerty zxcvbn",
    "\u00bd \u00b2 \u2160",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "\x00\x01 control",
    "mixed \u4e2d\u6587 and English",
]


GEMMA_STRINGS = [
    "<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n",
    "<start_of_image> <end_of_image> <pad> <eos> <unk> <mask>",
    "tabs\tand\t\ttabs, newlines\n\n\nand    runs of     spaces",
    "a" * 40 + " " + "ab" * 30,
    "\u00a0non-breaking\u2003em space\u3000ideographic",
    "\U0001F600\U0001F4A9\U0001F9D1\u200d\U0001F4BB",
    "\x00\x01\x7f control bytes",
]


def gemma_main(model, outdir):
    """Gemma 3's SentencePiece vocabulary (262,144 tokens, byte fallback, no
    space prefix): tokenizer_golden_gemma.tsv."""
    strings = GEMMA_STRINGS + [s for s in all_strings()
                               if s not in GEMMA_STRINGS]
    rng = random.Random(262144)
    vocab_n = Vocab(model).n
    piece_ids = sorted(set(list(range(0, 300)) +
                           [rng.randrange(vocab_n) for _ in range(400)]))
    write_goldens(model, os.path.join(outdir, "tokenizer_golden_gemma.tsv"),
                  strings, piece_ids, "Gemma 3 270M")


def main():
    model, outdir = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3 and sys.argv[3] == "gemma":
        gemma_main(model, outdir)
        return
    strings = all_strings()
    rng = random.Random(99)
    vocab_n = Vocab(model).n
    piece_ids = sorted(set(list(range(0, 300)) +
                           [rng.randrange(vocab_n) for _ in range(400)]))
    write_goldens(model, os.path.join(outdir, "tokenizer_golden.tsv"),
                  strings, piece_ids, "default model")

    pre_strings = [x for x in HAND if len(x) < 120] + random_strings(30, seed=77)
    write_pre_goldens(model, os.path.join(outdir, "tokenizer_golden_pre.tsv"),
                      pre_strings)

    spm_path = os.path.join(outdir, "spm_tiny.gguf")
    make_spm_gguf(spm_path)
    spm_strings = SPM_STRINGS + random_strings(60, seed=4321)
    write_goldens(spm_path, os.path.join(outdir, "tokenizer_golden_spm.tsv"),
                  spm_strings, list(range(0, 600)), "spm_tiny.gguf")


if __name__ == "__main__":
    main()
