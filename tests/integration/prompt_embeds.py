#!/usr/bin/env python3
"""Prompt embeddings (soft prompts) through both front ends of the real
cinfer-server: gRPC Generate's prompt_embeds and /v1/completions'
prompt_embeds (the base64 of little-endian float32, row-major).

The rows are the dequantized rows of the model's token_embd, computed
here from the GGUF file with the `gguf` package (the default model's is
Q8_0, whose rows numpy computes bit for bit as the server does), so the
output must be the tokens' own.

  tokens   the default model: greedy output of the rows of a prompt's
           tokens (alone, followed by token ids, followed by text) equals
           the tokens'; seeded sampling with n=2 too; usage counts the
           rows as prompt tokens; /v1/completions gives gRPC's text
  errors   a wrong width, a NaN, rows past the context and values past
           16 MiB are INVALID_ARGUMENT naming prompt_embeds.width /
           prompt_embeds.values / prompt_embeds; over HTTP each is 400
           with param prompt_embeds, and so are bad base64 and a
           torch.save'd tensor

Usage: prompt_embeds.py CASE --server-bin ... --cli-bin ... --run-bin ...
                        --mkmodel-bin ... --model PATH [--tokens N]
"""
import base64
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (the integration helpers)

from run import Skip, check, check_eq, log  # noqa: E402

SKIP = 77
ARGS = None
CTX = 256  # the servers' --ctx-size: rows past it are refused
# longer than two KV blocks (16 tokens each), so the prefix cache holds
# full blocks of it
PROMPT = ("Once upon a time, in a small village by the sea, there lived an "
          "old fisherman who knew every wave and every wind, and each "
          "morning he rowed out past the rocks to cast his nets")


def it_openai():
    """openai.py's helpers (HttpServer, http_post), loaded under another
    name: as `openai` it would shadow the SDK it is named after."""
    spec = importlib.util.spec_from_file_location(
        "it_openai", os.path.join(HERE, "openai.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.ARGS = ARGS
    return mod


def need_gguf():
    try:
        import gguf  # noqa: F401
        import numpy  # noqa: F401
    except ImportError:
        raise Skip("the gguf / numpy packages are not installed "
                   "(scripts/install-deps.sh installs them)")


class Rows:
    """The dequantized rows of token_embd.weight of a GGUF file."""

    def __init__(self, path):
        import gguf
        r = gguf.GGUFReader(path)
        self.t = [t for t in r.tensors if t.name == "token_embd.weight"][0]
        self.width = int(self.t.shape[0])
        self.qtype = self.t.tensor_type

    def of(self, ids):
        import gguf
        import numpy as np
        rows = gguf.quants.dequantize(self.t.data[np.asarray(ids)],
                                      self.qtype)
        return np.ascontiguousarray(rows, dtype="<f4").reshape(len(ids),
                                                               self.width)


def grpc_req(pb, rows=None, width=None, n=None, seed=None, samples=1,
             **kw):
    req = pb.GenerateRequest(**kw)
    if rows is not None:
        req.prompt_embeds.width = rows.shape[1] if width is None else width
        req.prompt_embeds.values.extend(rows.ravel().tolist())
    if seed is None:
        req.sampling.temperature = 0
    else:
        req.sampling.temperature = 0.9
        req.sampling.top_p = 0.95
        req.sampling.seed = seed
    if samples > 1:
        req.n = samples
    req.stopping.max_tokens = n or ARGS.tokens
    req.stopping.ignore_eos = True
    return req


def generate(srv, req):
    """(texts by sample, final) of a Generate stream."""
    texts = {}
    final = None
    for resp in srv.stub().Generate(req, timeout=600):
        if resp.HasField("chunk"):
            texts[resp.chunk.index] = (texts.get(resp.chunk.index, "") +
                                       resp.chunk.text)
        else:
            final = resp.final
    check(final is not None, "a final message")
    return texts, final


def grpc_error(srv, req):
    import grpc
    try:
        for _ in srv.stub().Generate(req, timeout=120):
            pass
    except grpc.RpcError as e:
        return e.code().name, e.details()
    raise AssertionError("the call succeeded")


def tokenize(srv, pb, text):
    return list(srv.stub().Tokenize(pb.TokenizeRequest(text=text),
                                    timeout=30).token_ids)


def b64(rows):
    return base64.b64encode(rows.astype("<f4").tobytes()).decode()


def model_id(srv):
    """GET /v1/models' one id (without the SDK, which openai.py's name
    would shadow here)."""
    import urllib.request
    with urllib.request.urlopen(srv.base + "/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def completion(mod, srv, body):
    st, _, raw = mod.http_post(srv, "/v1/completions", body)
    try:
        return st, json.loads(raw)
    except ValueError:
        return st, raw


# ---------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------

def case_tokens():
    model = run.need_model()
    need_gguf()
    mod = it_openai()
    pb = run.stubs()[0]
    rows = Rows(model)
    with mod.HttpServer(model, extra=["--ctx-size", str(CTX)]) as srv:
        info = srv.info()
        check_eq(rows.width, info.embedding_length, "the file's width")
        ids = tokenize(srv, pb, PROMPT)
        check(len(ids) > 32, "a prompt of three blocks (%d)" % len(ids))
        k = len(ids) // 2
        emb = rows.of(ids)

        want, fin = generate(srv, grpc_req(pb, token_ids=pb.TokenIds(ids=ids)))
        _, again = generate(srv, grpc_req(pb, token_ids=pb.TokenIds(ids=ids)))
        check(again.usage.cached_tokens >= 32,
              "the tokens' blocks are cached (%d)" % again.usage.cached_tokens)
        got, fin2 = generate(srv, grpc_req(pb, rows=emb))
        check_eq(got, want, "greedy: the rows alone = the tokens")
        check_eq(fin2.usage.prompt_tokens, len(ids), "rows count as prompt")
        check_eq(fin2.usage.cached_tokens, 0, "rows never hit the cache")
        got, fin2 = generate(srv, grpc_req(pb, rows=emb[:k],
                                           token_ids=pb.TokenIds(ids=ids[k:])))
        check_eq(got, want, "greedy: %d rows then %d token ids" %
                 (k, len(ids) - k))
        check_eq(fin2.usage.prompt_tokens, len(ids), "rows + tokens")
        check_eq(fin2.usage.completion_tokens, fin.usage.completion_tokens,
                 "completion tokens")
        # rows of the prompt's first words, then the rest as text (no BOS)
        words = PROMPT.split(" ")
        head = " ".join(words[:4])
        tail = " " + " ".join(words[4:])
        hids, tids = tokenize(srv, pb, head), tokenize(srv, pb, tail)
        check_eq(hids + tids, ids, "the prompt tokenizes as its two parts")
        got, _ = generate(srv, grpc_req(pb, rows=rows.of(hids), text=tail))
        check_eq(got, want, "greedy: rows then text")

        # seeded, two samples: each the tokens'
        want2, _ = generate(srv, grpc_req(pb, token_ids=pb.TokenIds(ids=ids),
                                          seed=77, samples=2))
        check(len(want2) == 2 and want2[0] != want2[1], "two samples differ")
        got2, fin2 = generate(srv, grpc_req(pb, rows=emb[:k], seed=77,
                                            samples=2,
                                            token_ids=pb.TokenIds(
                                                ids=ids[k:])))
        check_eq(got2, want2, "seeded n=2: rows then tokens")

        # /v1/completions: the same text
        mid = model_id(srv)
        base = {"model": mid, "max_tokens": ARGS.tokens, "temperature": 0,
                "ignore_eos": True}
        st, body = completion(mod, srv, dict(base, prompt_embeds=b64(emb)))
        check_eq(st, 200, "completions with prompt_embeds alone: %r" % body)
        check_eq(body["choices"][0]["text"], want[0], "HTTP text = gRPC's")
        check_eq(body["usage"]["prompt_tokens"], len(ids), "HTTP usage")
        st, body = completion(mod, srv, dict(base, prompt="",
                                             prompt_embeds=b64(emb[:k])))
        check_eq(st, 200, "prompt '' and embeddings: %r" % body)
        check_eq(body["usage"]["prompt_tokens"], k, "HTTP usage, k rows")
        st, body = completion(mod, srv, dict(base, prompt=ids[k:],
                                             prompt_embeds=b64(emb[:k])))
        check_eq(st, 200, "rows then ids: %r" % body)
        check_eq(body["choices"][0]["text"], want[0], "HTTP rows then ids")
        st, body = completion(mod, srv, dict(base, prompt=tail,
                                             prompt_embeds=b64(
                                                 rows.of(hids))))
        check_eq(body["choices"][0]["text"], want[0], "HTTP rows then text")
        stats = srv.info().stats
        log("engine cached_tokens %d" % stats.cached_tokens)


def case_errors():
    model = run.need_model()
    need_gguf()
    import numpy as np
    mod = it_openai()
    pb = run.stubs()[0]
    rows = Rows(model)
    w = rows.width
    with mod.HttpServer(model, extra=["--ctx-size", str(CTX),
                                      "--max-receive-message-bytes",
                                      str(24 << 20)]) as srv:
        emb = rows.of([1, 2, 3])

        def bad(req, field, has):
            code, msg = grpc_error(srv, req)
            check_eq(code, "INVALID_ARGUMENT", "status of %s" % field)
            check(msg.startswith(field), "%r names %s" % (msg, field))
            check(has in msg, "%r says %r" % (msg, has))

        bad(grpc_req(pb, rows=emb, width=w - 1), "prompt_embeds.width",
            "width %d, got %d" % (w, w - 1))
        r = grpc_req(pb, rows=emb)
        r.prompt_embeds.values.append(0.5)
        bad(r, "prompt_embeds.values", "not a whole number of rows of %d" % w)
        nan = emb.copy()
        nan[1, 7] = np.nan
        bad(grpc_req(pb, rows=nan), "prompt_embeds.values[%d]" % (w + 7),
            "row 1, column 7")
        inf = emb.copy()
        inf[2, 0] = np.inf
        bad(grpc_req(pb, rows=inf, text="x"),
            "prompt_embeds.values[%d]" % (2 * w), "not finite")
        many = np.zeros((CTX, w), dtype="<f4")
        bad(grpc_req(pb, rows=many), "prompt_embeds",
            "%d rows; the context holds %d" % (CTX, CTX))
        bad(grpc_req(pb, rows=many[:CTX - 2],
                     token_ids=pb.TokenIds(ids=[1, 2])),
            "prompt_embeds", "prompt positions")
        huge = np.zeros(((16 << 20) // (4 * w) + 1, w), dtype="<f4")
        bad(grpc_req(pb, rows=huge), "prompt_embeds.values",
            "at most %d" % (16 << 20))
        # still serving, and the good request works
        generate(srv, grpc_req(pb, rows=emb, n=2))

        mid = model_id(srv)
        base = {"model": mid, "max_tokens": 2, "temperature": 0}

        def http_bad(extra, has):
            st, body = completion(mod, srv, dict(base, **extra))
            check_eq(st, 400, "status for %s" % has)
            err = body.get("error", {}) if isinstance(body, dict) else {}
            check_eq(err.get("param"), "prompt_embeds", "param of %r" % err)
            check(has in err.get("message", ""), "%r says %r" % (err, has))

        http_bad({"prompt_embeds": b64(emb.ravel()[:-1])},
                 "not a whole number of rows of %d" % w)
        http_bad({"prompt_embeds": b64(nan)}, "prompt_embeds[%d]" % (w + 7))
        http_bad({"prompt_embeds": b64(many)}, "%d rows" % CTX)
        http_bad({"prompt_embeds": "not*base64"}, "base64")
        http_bad({"prompt_embeds": base64.b64encode(
            b"PK\x03\x04" + bytes(60)).decode()}, "torch.save")
        http_bad({"prompt_embeds": [1.0, 2.0]}, "must be a string")
        st, body = completion(mod, srv, dict(base, prompt_embeds=b64(emb)))
        check_eq(st, 200, "a good one after: %r" % body)


CASES = {"tokens": case_tokens, "errors": case_errors}


if __name__ == "__main__":
    sys.exit(run.case_main(__name__, CASES, "embeds", stubs=True))
