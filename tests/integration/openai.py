#!/usr/bin/env python3
"""The OpenAI-compatible HTTP API (--http-listen) of the real cinfer-server,
driven by the official `openai` Python package, against gRPC Generate on the
same server.

  completions  /v1/completions, non-streamed and streamed: the greedy text
               equals gRPC Generate's; usage; /v1/models; /health
  chat         /v1/chat/completions through the chat template, both ways,
               equal to Generate with chat input; include_usage
  samples      n=2 on both front ends (each gRPC chunk names its sample)
  stop         stop strings end the text before them (finish_reason stop)
  logprobs     completions' logprobs=N and chat's logprobs/top_logprobs,
               equal to gRPC's
  errors       the SDK's exception types: BadRequestError naming the field,
               NotFoundError, AuthenticationError, RateLimitError (429 with
               Retry-After), 503 with Retry-After while draining, 504 past
               --max-request-time, 413 past the body bound, malformed JSON
  disconnect   a client that drops a stream mid-way: its engine request is
               cancelled and its KV blocks freed (engine counters in
               /metrics and GetModelInfo)
  curl         the README's curl examples, run as they are written
  bench        cinfer-bench --protocol openai against the server: every
               request completes with its tokens counted
  json_schema  structured output: schemas (nested objects with required
               and optional fields, enum, arrays with minItems/maxItems,
               anyOf, $defs/$ref, integer/number/boolean) through gRPC's
               json_schema and the SDK's response_format, greedy and
               seeded; each output that ends by EOS validates with the
               jsonschema package; bad schemas are INVALID_ARGUMENT / 400
               naming json_schema and the keyword; regex output
               fullmatches; json_object parses; /metrics counts grammar
               cache hits on a repeat
  spec_ngram   --spec-ngram 4: the greedy text of a repetitive prompt is
               the text without it, and the spec counters in /metrics move
  frontends    gRPC and OpenAI calls on one server: each counts in
               cinfer:request_total, rejections, the latency histograms
               and the token counters under its own frontend label; the
               sums over frontend are the totals; log lines name the
               front end
  shutdown     a client leaves mid-prefill and SIGTERM follows at once:
               the server waits for the engine's last event and exits 0

Usage: openai.py CASE --server-bin ... --cli-bin ... --run-bin ...
                 --mkmodel-bin ... --model PATH [--tokens N]
"""
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (the integration helpers)

from run import Skip, check, check_eq, log  # noqa: E402

SKIP = 77
ARGS = None


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

class HttpServer(run.Server):
    """run.Server with the HTTP API on a free port (from its log)."""

    def __init__(self, model, extra=(), name="openai-server", **kw):
        super().__init__(model, extra=["--http-listen", "127.0.0.1:0"] +
                         list(extra), name=name, **kw)
        self.http_port = None

    def __enter__(self):
        super().__enter__()
        deadline = time.time() + 30
        while self.http_port is None:
            for line in self.log_lines():
                if line.get("msg") == "http listening":
                    self.http_port = int(line["port"])
            if self.http_port is None:
                check(time.time() < deadline, "no 'http listening' line")
                time.sleep(0.02)
        self.base = "http://127.0.0.1:%d" % self.http_port
        return self

    def client(self, api_key="none", **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key,
                             max_retries=0, timeout=300, **kw)

    def model_id(self):
        return self.client().models.list().data[0].id


def need_openai():
    """Imports the SDK: this file's own name must not shadow it, so its
    folder leaves sys.path for the import (the module stays cached)."""
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    try:
        import openai  # noqa: F401
        check(hasattr(openai, "OpenAI"), "the openai SDK, not this file")
    except ImportError:
        raise Skip("the openai package is not installed "
                   "(scripts/install-deps.sh installs it)")
    finally:
        sys.path[:] = saved


def grpc_text(srv, n, **kw):
    """Greedy gRPC Generate: (text, final)."""
    pb = run.stubs()[0]
    req = pb.GenerateRequest(**kw)
    req.sampling.temperature = 0
    req.stopping.max_tokens = n
    text, final, _ = run.collect(srv.stub().Generate(req, timeout=300))
    return text, final


def grpc_chat(pb, messages):
    chat = pb.Chat()
    for m in messages:
        chat.messages.add(role=m["role"], content=m["content"])
    return chat


def http_post(srv, path, body, headers=None):
    """(status, headers, parsed JSON or text) of a raw POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(srv.base + path, data=data,
                                 headers=headers or {
                                     "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read().decode()
            return r.status, r.headers, raw
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def scrape(srv):
    from prometheus_client.parser import text_string_to_metric_families
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" %
                                  srv.metrics_port, timeout=10).read()
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


PROMPT = "Once upon a time"
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name three colours."}]


# ---------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------

def case_completions():
    model = run.need_model()
    n = ARGS.tokens
    with HttpServer(model) as srv:
        want, final = grpc_text(srv, n, text=PROMPT)
        c = srv.client()
        mid = srv.model_id()
        r = c.completions.create(model=mid, prompt=PROMPT, max_tokens=n,
                                 temperature=0)
        check_eq(r.choices[0].text, want, "non-streamed text = gRPC's")
        check_eq(r.object, "text_completion", "object")
        check_eq(r.usage.prompt_tokens, final.usage.prompt_tokens,
                 "usage.prompt_tokens = gRPC's")
        check_eq(r.usage.completion_tokens, final.usage.completion_tokens,
                 "usage.completion_tokens")
        check_eq(r.usage.total_tokens,
                 r.usage.prompt_tokens + r.usage.completion_tokens,
                 "usage.total_tokens")
        check_eq(r.choices[0].finish_reason,
                 "length" if final.usage.completion_tokens == n else "stop",
                 "finish_reason")
        parts = []
        finish = None
        for ch in c.completions.create(model=mid, prompt=PROMPT, max_tokens=n,
                                       temperature=0, stream=True):
            if ch.choices:
                parts.append(ch.choices[0].text)
                finish = ch.choices[0].finish_reason or finish
        check_eq("".join(parts), want, "streamed text = gRPC's")
        check(finish in ("length", "stop"), "streamed finish %r" % finish)
        st, hdr, body = http_post(srv, "/v1/models", b"")
        check_eq(st, 400, "POST /v1/models refused")
        h = json.loads(urllib.request.urlopen(srv.base + "/health",
                                              timeout=10).read())
        check_eq(h.get("status"), "ok", "/health")
        m = scrape(srv)
        ok = m.get(("cinfer:request_total",
                    (("code", "OK"), ("frontend", "openai"),
                     ("method", "/v1/completions"))), 0)
        check(ok >= 2, "request_total{frontend=openai,method=/v1/completions,"
              "code=OK} counts (%r)" % ok)
        log("ok: completions equal gRPC's %r, both ways" % want)


def case_chat():
    model = run.need_model()
    n = ARGS.tokens
    with HttpServer(model) as srv:
        pb = run.stubs()[0]
        want, final = grpc_text(srv, n, chat=grpc_chat(pb, MESSAGES))
        c = srv.client()
        mid = srv.model_id()
        r = c.chat.completions.create(model=mid, messages=MESSAGES,
                                      max_tokens=n, temperature=0)
        check_eq(r.choices[0].message.content, want, "chat text = gRPC's")
        check_eq(r.choices[0].message.role, "assistant", "role")
        check_eq(r.usage.prompt_tokens, final.usage.prompt_tokens,
                 "chat usage.prompt_tokens = gRPC's")
        parts, usage, roles = [], None, []
        for ch in c.chat.completions.create(
                model=mid, messages=MESSAGES, max_completion_tokens=n,
                temperature=0, stream=True,
                stream_options={"include_usage": True}):
            if ch.usage:
                usage = ch.usage
            for choice in ch.choices:
                if choice.delta.role:
                    roles.append(choice.delta.role)
                if choice.delta.content:
                    parts.append(choice.delta.content)
        check_eq("".join(parts), want, "streamed chat = gRPC's")
        check_eq(roles, ["assistant"], "the role comes once")
        check(usage is not None, "include_usage: a usage chunk")
        check_eq(usage.completion_tokens, final.usage.completion_tokens,
                 "streamed usage")
        log("ok: chat equals gRPC's %r, both ways" % want)


def case_samples():
    model = run.need_model()
    n = ARGS.tokens
    with HttpServer(model) as srv:
        want, gfinal = grpc_text(srv, n, text=PROMPT)
        c = srv.client()
        mid = srv.model_id()
        r = c.completions.create(model=mid, prompt=PROMPT, max_tokens=n,
                                 temperature=0, n=2)
        check_eq(sorted(ch.index for ch in r.choices), [0, 1], "two choices")
        for ch in r.choices:
            check_eq(ch.text, want, "greedy sample %d" % ch.index)
        check_eq(r.usage.completion_tokens,
                 2 * gfinal.usage.completion_tokens, "usage counts both")
        texts = {0: [], 1: []}
        for ch in c.chat.completions.create(
                model=mid, messages=MESSAGES, max_tokens=n, temperature=0.8,
                seed=7, n=2, stream=True):
            for choice in ch.choices:
                texts[choice.index].append(choice.delta.content or "")
        check(all(texts[k] for k in texts), "both samples streamed")
        # gRPC: n=2, each chunk names its sample, the final lists both.
        pb = run.stubs()[0]
        req = pb.GenerateRequest(text=PROMPT, n=2)
        req.sampling.temperature = 0
        req.stopping.max_tokens = n
        got = {0: [], 1: []}
        final = None
        for resp in srv.stub().Generate(req, timeout=300):
            if resp.HasField("chunk"):
                got[resp.chunk.index].append(resp.chunk.text)
            else:
                final = resp.final
        check_eq("".join(got[0]), want, "gRPC sample 0")
        check_eq("".join(got[1]), want, "gRPC sample 1")
        check_eq([s.index for s in final.samples], [0, 1], "final.samples")
        check_eq(final.usage.completion_tokens,
                 sum(s.completion_tokens for s in final.samples),
                 "completion tokens summed")
        r = c.completions.create(model=mid, prompt=PROMPT, max_tokens=n,
                                 temperature=0.9, seed=3, n=2)
        log("ok: n=2 on both front ends (sampled pair: %r / %r)" %
            (r.choices[0].text, r.choices[1].text))


def case_stop():
    model = run.need_model()
    n = max(ARGS.tokens, 16)
    with HttpServer(model) as srv:
        full, _ = grpc_text(srv, n, text=PROMPT)
        words = full.split()
        check(len(words) >= 3, "a long enough greedy text: %r" % full)
        stop = " " + words[2]
        c = srv.client()
        mid = srv.model_id()
        r = c.completions.create(model=mid, prompt=PROMPT, max_tokens=n,
                                 temperature=0, stop=[stop, "\n\n\n"])
        want = full[:full.index(stop)]
        check_eq(r.choices[0].text, want, "text cut before the stop string")
        check_eq(r.choices[0].finish_reason, "stop", "finish_reason")
        pb = run.stubs()[0]
        req = pb.GenerateRequest(text=PROMPT)
        req.sampling.temperature = 0
        req.stopping.max_tokens = n
        req.stopping.stop.append(stop)
        gtext, _, _ = run.collect(srv.stub().Generate(req, timeout=300))
        check_eq(gtext, want, "gRPC with the same stop")
        parts = [ch.choices[0].text for ch in c.completions.create(
            model=mid, prompt=PROMPT, max_tokens=n, temperature=0, stop=stop,
            stream=True) if ch.choices]
        check_eq("".join(parts), want, "streamed with a stop string")
        log("ok: stop %r ends %r" % (stop, want))


def case_logprobs():
    model = run.need_model()
    n = ARGS.tokens
    with HttpServer(model) as srv:
        pb = run.stubs()[0]
        req = pb.GenerateRequest(text=PROMPT, logprobs=2)
        req.sampling.temperature = 0
        req.stopping.max_tokens = n
        glp = []
        for resp in srv.stub().Generate(req, timeout=300):
            if resp.HasField("chunk"):
                glp += [t.logprob for t in resp.chunk.logprobs]
        c = srv.client()
        mid = srv.model_id()
        r = c.completions.create(model=mid, prompt=PROMPT, max_tokens=n,
                                 temperature=0, logprobs=2)
        lp = r.choices[0].logprobs
        check_eq(len(lp.token_logprobs), len(glp), "one logprob per token")
        for a, b in zip(lp.token_logprobs, glp):
            check(abs(a - b) < 1e-4, "logprob %r = gRPC's %r" % (a, b))
        check(all(len(t) <= 2 for t in lp.top_logprobs), "top 2")
        check_eq("".join(lp.tokens), r.choices[0].text, "tokens make the text")
        r = c.chat.completions.create(model=mid, messages=MESSAGES,
                                      max_tokens=n, temperature=0,
                                      logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        check_eq(len(content), r.usage.completion_tokens,
                 "chat: one entry per token")
        for e in content:
            check(len(e.top_logprobs) == 3, "three alternatives")
            check(e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob,
                  "most likely first")
            check(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4,
                  "greedy: the chosen token is the most likely")
        log("ok: logprobs equal gRPC's on %d tokens" % len(glp))


def case_errors():
    import openai
    model = run.need_model()
    key = "sk-cinfer-test-key"
    keys = os.path.join(ARGS.work, "keys")
    with open(keys, "w") as f:
        f.write("%s tester qps=0.01 burst=2\n" %
                hashlib.sha256(key.encode()).hexdigest())
    with HttpServer(model, extra=["--api-keys", keys]) as srv:
        good = srv.client(api_key=key)
        mid = good.models.list().data[0].id
        try:
            srv.client(api_key="wrong").completions.create(
                model=mid, prompt="hi", max_tokens=2)
            raise AssertionError("a wrong key was let in")
        except openai.AuthenticationError as e:
            check_eq(e.status_code, 401, "401")
        try:
            good.completions.create(model=mid, prompt="hi", max_tokens=2,
                                    top_p=3)
            raise AssertionError("top_p=3 accepted")
        except openai.BadRequestError as e:
            check_eq(e.body.get("param"), "top_p", "param names the field")
            check("top_p" in e.message, "message names it: %s" % e.message)
        try:
            good.completions.create(model="no-such-model", prompt="hi",
                                    max_tokens=2)
            raise AssertionError("another model accepted")
        except openai.NotFoundError as e:
            check_eq(e.status_code, 404, "404")
        # The key's bucket (burst 2) is spent: 429 with Retry-After.
        try:
            for _ in range(3):
                good.completions.create(model=mid, prompt="hi", max_tokens=1)
            raise AssertionError("the key's rate was not enforced")
        except openai.RateLimitError as e:
            check(int(e.response.headers.get("retry-after", "0")) >= 1,
                  "Retry-After on 429")
            check_eq(e.body.get("code"), "rate_limited_client", "code")
        st, _, body = http_post(srv, "/v1/completions", b"{not json",
                                {"Authorization": "Bearer " + key})
        check_eq(st, 400, "malformed JSON is 400")
        check("not valid JSON" in body, body)
        big = b'{"model": "x", "prompt": "' + b"a" * (5 << 20) + b'"}'
        st, _, _ = http_post(srv, "/v1/completions", big,
                             {"Authorization": "Bearer " + key})
        check_eq(st, 413, "a body past the bound is 413")
    with HttpServer(model, extra=["--max-request-time", "0.02"],
                    name="openai-deadline") as srv:
        c = srv.client()
        mid = srv.model_id()
        # 504: the request cannot end within --max-request-time.
        try:
            c.completions.create(model=mid, prompt=PROMPT, max_tokens=400,
                                 temperature=0,
                                 extra_body={"ignore_eos": True})
            raise AssertionError("a request past --max-request-time ended")
        except openai.APIStatusError as e:
            check_eq(e.status_code, 504, "504 past the deadline")
    # A drain long enough for the running stream on a slow (sanitizer)
    # build.
    with HttpServer(model, extra=["--drain-timeout", "600"],
                    name="openai-drain") as srv:
        c = srv.client()
        mid = srv.model_id()
        # 503 while draining, with Retry-After; the stream running then
        # finishes.
        stream = c.completions.create(model=mid, prompt=PROMPT,
                                      max_tokens=64,
                                      temperature=0, stream=True,
                                      extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it)
        srv.sigterm()
        deadline = time.time() + 10
        seen = None
        while time.time() < deadline and seen is None:
            try:
                c.completions.create(model=mid, prompt="hi", max_tokens=1)
            except openai.InternalServerError as e:
                seen = e
            except openai.APIConnectionError:
                break
            time.sleep(0.01)
        check(seen is not None, "no 503 while draining")
        check_eq(seen.status_code, 503, "503 while draining")
        check(int(seen.response.headers.get("retry-after", "0")) >= 1,
              "Retry-After on 503")
        rest = [ch.choices[0].text for ch in it if ch.choices]
        check(len(rest) > 0, "the running stream finished during the drain")
        check_eq(srv.wait_exit(60), 0, "drained server exits 0")
    log("ok: 401, 400 naming the field, 404, 504, 429, 413, 503 through the "
        "SDK")


def case_disconnect():
    model = run.need_model()
    with HttpServer(model) as srv:
        c = srv.client()
        mid = srv.model_id()
        before = srv.info().stats
        stream = c.completions.create(model=mid, prompt=PROMPT,
                                      max_tokens=2000, temperature=0,
                                      stream=True,
                                      extra_body={"ignore_eos": True})
        it = iter(stream)
        for _ in range(2):
            next(it)
        check(scrape(srv).get(("cinfer:num_requests_running", ()), 0) >= 1,
              "the request runs")
        stream.close()  # the client hangs up mid-stream
        info = run.wait_engine_idle(srv, 30, since=before, want_gone=1)
        check(info.stats.requests_cancelled > before.requests_cancelled,
              "the engine request was cancelled")
        m = scrape(srv)
        check_eq(m.get(("cinfer:num_requests_running", ())), 0.0,
                 "num_requests_running")
        check_eq(m.get(("cinfer:kv_cache_usage_perc", ())), 0.0,
                 "KV blocks freed")
        # The stream counts once, as CANCELLED (the client left), as a
        # gRPC stream would.
        deadline = time.time() + 10
        key = ("cinfer:request_total", (("code", "CANCELLED"),
                                        ("frontend", "openai"),
                                        ("method", "/v1/completions")))
        while m.get(key, 0) < 1 and time.time() < deadline:
            time.sleep(0.05)
            m = scrape(srv)
        check_eq(m.get(key, 0), 1.0, "the dropped stream counted CANCELLED")
        check_eq(sum(v for (n, lb), v in m.items()
                     if n == "cinfer:request_total"
                     and ("frontend", "openai") in lb), 2.0,
                 "openai calls counted: /v1/models and the stream")
        log("ok: a dropped stream is cancelled and its KV blocks freed "
            "(%d generated before)" % (info.stats.generated_tokens -
                                        before.generated_tokens))


def readme_curl_examples():
    """The curl commands of the README's "The OpenAI-compatible API"
    section, continuation lines joined, as they are written there (the
    address 127.0.0.1:8000 and MODEL are filled in by the caller)."""
    path = os.path.join(os.path.dirname(os.path.dirname(HERE)), "README.md")
    with open(path) as f:
        text = f.read()
    start = text.index("## The OpenAI-compatible API")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    out, cur = [], None
    for line in section.splitlines():
        if cur is None and line.startswith("curl "):
            cur = line
        elif cur is not None:
            cur += "\n" + line
        else:
            continue
        if not cur.endswith("\\"):
            out.append(cur)
            cur = None
    check(len(out) >= 4, "the README's API section has its curl examples: %r"
          % out)
    return out


def case_curl():
    model = run.need_model()
    with HttpServer(model) as srv:
        mid = srv.model_id()
        examples = readme_curl_examples()
        for ex in examples:
            cmd = ex.replace("127.0.0.1:8000",
                             "127.0.0.1:%d" % srv.http_port).replace(
                "MODEL", mid)
            r = subprocess.run(["sh", "-c", cmd], capture_output=True,
                               text=True, timeout=120)
            check_eq(r.returncode, 0, "curl: %s" % cmd)
            out = r.stdout
            if "stream" in cmd:
                check(out.rstrip().endswith("data: [DONE]"),
                      "SSE ends with [DONE]: %r" % out[-200:])
                for line in out.splitlines():
                    if line.startswith("data: {"):
                        json.loads(line[6:])
            else:
                j = json.loads(out)
                check("error" not in j, "curl answer: %r" % j)
        log("ok: %d curl examples" % len(examples))


def case_bench():
    model = run.need_model()
    if not ARGS.bench_bin:
        raise Skip("cinfer-bench not built (libcurl missing)")
    with HttpServer(model) as srv:
        out = os.path.join(ARGS.work, "bench.json")
        r = subprocess.run([ARGS.bench_bin, "--protocol", "openai",
                            "--server", "127.0.0.1:%d" % srv.http_port,
                            "--num-requests", "6", "--input-len", "16",
                            "--output-len", "8", "--concurrency", "3",
                            "--ignore-eos", "--json", out],
                           capture_output=True, text=True, timeout=600)
        check_eq(r.returncode, 0, "cinfer-bench: %s" % r.stderr[-2000:])
        with open(out) as f:
            res = json.load(f)
        check_eq(res["completed"], 6, "every request completed")
        check_eq(res["failed"], 0, "none failed")
        check_eq(res["total_output_tokens"], 48, "8 tokens each, counted "
                 "from the events' logprobs")
        check_eq(res["total_input_tokens"], 96, "prompt tokens from usage")
        check_eq(res["backend"], "cinfer-openai", "backend")
        log("ok: cinfer-bench --protocol openai: 6 requests, 48 tokens")


SCHEMAS = [
    ("person", {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer"},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10},
                               "zip": {"type": "string",
                                       "pattern": "[0-9]{5}"}},
                "required": ["city"],
                "additionalProperties": False},
        },
        "required": ["name", "age"],
        "additionalProperties": False}),
    ("enum", {"type": "object",
              "properties": {"colour": {"enum": ["red", "green", "blue"]},
                             "ok": {"type": "boolean"}},
              "required": ["colour", "ok"]}),
    ("array", {"type": "array", "items": {"type": "integer"},
               "minItems": 2, "maxItems": 4}),
    ("anyof", {"type": "object",
               "properties": {"v": {"anyOf": [{"type": "number"},
                                              {"type": "null"},
                                              {"type": "boolean"}]}},
               "required": ["v"]}),
    ("defs", {"$defs": {"pt": {"type": "object",
                               "properties": {"x": {"type": "number"},
                                              "y": {"type": "number"}},
                               "required": ["x", "y"]}},
              "type": "object",
              "properties": {"a": {"$ref": "#/$defs/pt"},
                             "b": {"$ref": "#/$defs/pt"}},
              "required": ["a", "b"]}),
    ("scalars", {"type": "object",
                 "properties": {"i": {"type": "integer"},
                                "n": {"type": "number"},
                                "b": {"type": "boolean"}},
                 "required": ["i", "n", "b"]}),
]

# Greedy, and one seeded sample.
SETTINGS = [{"temperature": 0}, {"temperature": 0.8, "seed": 7}]


def schema_prompt(name):
    return [{"role": "user",
             "content": "Reply with a short JSON value (%s)." % name}]


def check_json(text, schema, finished, what):
    """An output that ended by EOS parses and validates."""
    import jsonschema
    if not finished:
        log("  %s: ended by length, not checked: %r" % (what, text[:80]))
        return 0
    try:
        v = json.loads(text)
    except ValueError as e:
        raise AssertionError("%s: not JSON (%s): %r" % (what, e, text))
    jsonschema.validate(v, schema)
    return 1


def case_json_schema():
    import openai
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        raise Skip("jsonschema not installed")
    import grpc
    model = run.need_model()
    pb = run.stubs()[0]
    max_tokens = 96
    # A sanitizer build (--tokens 8) is about 10x slower: greedy only.
    settings = SETTINGS if ARGS.tokens >= 16 else SETTINGS[:1]
    with HttpServer(model) as srv:
        c = srv.client()
        mid = srv.model_id()
        checked = 0
        for name, schema in SCHEMAS:
            text = json.dumps(schema)
            for st in settings:
                # gRPC: json_schema, chat input.
                req = pb.GenerateRequest(
                    chat=grpc_chat(pb, schema_prompt(name)), json_schema=text)
                req.sampling.temperature = st["temperature"]
                if "seed" in st:
                    req.sampling.seed = st["seed"]
                req.stopping.max_tokens = max_tokens
                out, final, _ = run.collect(
                    srv.stub().Generate(req, timeout=600))
                checked += check_json(
                    out, schema,
                    final.finish_reason != pb.FINISH_REASON_LENGTH,
                    "grpc %s %s" % (name, st))
                # The SDK: response_format json_schema.
                kw = {"temperature": st["temperature"]}
                if "seed" in st:
                    kw["seed"] = st["seed"]
                r = c.chat.completions.create(
                    model=mid, messages=schema_prompt(name),
                    max_tokens=max_tokens,
                    response_format={"type": "json_schema",
                                     "json_schema": {"name": name,
                                                     "schema": schema,
                                                     "strict": True}},
                    **kw)
                ch = r.choices[0]
                checked += check_json(ch.message.content, schema,
                                      ch.finish_reason == "stop",
                                      "openai %s %s" % (name, st))
                if st["temperature"] == 0 and ch.finish_reason == "stop":
                    # Greedy: both front ends write the same document.
                    if final.finish_reason != pb.FINISH_REASON_LENGTH:
                        check_eq(ch.message.content, out,
                                 "greedy %s: SDK and gRPC agree" % name)
        log("ok: %d structured outputs validated" % checked)
        check(checked >= len(SCHEMAS), "too few outputs finished to judge: "
              "%d" % checked)
        m = scrape(srv)
        hits = m.get(("cinfer:grammar_cache_hits_total", ()), 0)
        # Each schema compiled once: the gRPC text and the SDK's dump are
        # different texts, and each repeats once per setting (greedy
        # only: the repeated regex below is the hit).
        if len(settings) > 1:
            check(hits >= len(SCHEMAS), "grammar cache hits %s" % hits)
        check(m.get(("cinfer:grammar_cache_bytes", ()), 0) > 0,
              "grammar cache bytes")
        misses = m.get(("cinfer:grammar_cache_misses_total", ()), 0)
        log("ok: grammar cache hits %d misses %d" % (hits, misses))

        # json_object and text.
        r = c.chat.completions.create(
            model=mid, messages=schema_prompt("an object"), max_tokens=96,
            temperature=0, response_format={"type": "json_object"})
        ch = r.choices[0]
        if ch.finish_reason == "stop":
            check(isinstance(json.loads(ch.message.content), dict),
                  "json_object: an object: %r" % ch.message.content)
        r = c.chat.completions.create(
            model=mid, messages=schema_prompt("x"), max_tokens=4,
            temperature=0, response_format={"type": "text"})
        check(r.choices[0].message.content is not None, "text")

        # Regex through both.
        rx = "(yes|no), [0-9]{2}"
        req = pb.GenerateRequest(text=PROMPT, regex=rx)
        req.sampling.temperature = 0
        req.stopping.max_tokens = 32
        out, final, _ = run.collect(srv.stub().Generate(req, timeout=600))
        check(final.finish_reason != pb.FINISH_REASON_LENGTH,
              "regex output ended by length: %r" % out)
        import re
        check(re.fullmatch(rx, out), "regex: %r" % out)
        r = c.completions.create(model=mid, prompt=PROMPT, max_tokens=32,
                                 temperature=0, extra_body={"regex": rx})
        check(re.fullmatch(rx, r.choices[0].text),
              "regex (HTTP): %r" % r.choices[0].text)
        m2 = scrape(srv)
        check(m2[("cinfer:grammar_cache_hits_total", ())] > hits,
              "the repeated regex is a hit")

        # Refusals, naming the field and the keyword.
        for bad, kw in (({"type": "string", "format": "email"}, "format"),
                        ({"type": "integer", "minimum": 3}, "minimum")):
            req = pb.GenerateRequest(text=PROMPT, json_schema=json.dumps(bad))
            req.stopping.max_tokens = 4
            try:
                run.collect(srv.stub().Generate(req, timeout=60))
                raise AssertionError("bad schema accepted: %s" % bad)
            except grpc.RpcError as e:
                check_eq(e.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         "bad schema status")
                check(e.details().startswith("json_schema: ") and
                      kw in e.details(), e.details())
            try:
                c.chat.completions.create(
                    model=mid, messages=schema_prompt("x"), max_tokens=4,
                    response_format={"type": "json_schema",
                                     "json_schema": {"name": "b",
                                                     "schema": bad}})
                raise AssertionError("bad schema accepted (HTTP)")
            except openai.BadRequestError as e:
                check("json_schema" in e.message and kw in e.message,
                      e.message)
                check("json_schema" in (e.body.get("param") or ""),
                      "param %r" % e.body.get("param"))
        try:
            c.chat.completions.create(
                model=mid, messages=schema_prompt("x"), max_tokens=4,
                response_format={"type": "xml"})
            raise AssertionError("response_format xml accepted")
        except openai.BadRequestError as e:
            check("response_format.type" in e.message, e.message)
        req = pb.GenerateRequest(text=PROMPT, regex="a+",
                                 json_schema='{"type":"integer"}')
        try:
            run.collect(srv.stub().Generate(req, timeout=60))
            raise AssertionError("regex and json_schema together accepted")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.INVALID_ARGUMENT, "both")
            check("regex" in e.details() and "json_schema" in e.details(),
                  e.details())
        # Nothing leaked into the engine from the refusals.
        run.wait_engine_idle(srv, 60)
    log("ok: json_schema, response_format, regex, refusals, cache metrics")


def case_spec_ngram():
    model = run.need_model()
    prompt = ("one two three four five six seven eight. " * 4 +
              "one two three four")
    n = max(24, ARGS.tokens)
    with HttpServer(model, name="plain") as srv:
        base, _ = grpc_text(srv, n, text=prompt)
    with HttpServer(model, extra=["--spec-ngram", "4",
                                  "--spec-ngram-range", "2,4",
                                  "--spec-max-seqs", "4"],
                    name="spec") as srv:
        spec, _ = grpc_text(srv, n, text=prompt)
        m = scrape(srv)
    check_eq(spec, base, "the greedy text with --spec-ngram 4")
    drafted = m.get(("cinfer:spec_draft_tokens_total", ()), 0)
    accepted = m.get(("cinfer:spec_accepted_tokens_total", ()), 0)
    check(drafted > 0, "spec_draft_tokens_total %s" % drafted)
    check(accepted > 0, "spec_accepted_tokens_total %s" % accepted)
    log("ok: --spec-ngram 4 text unchanged; drafted %d accepted %d" %
        (drafted, accepted))


def series(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def fe_sum(m, name):
    """{frontend: sum of the family's samples}."""
    out = {}
    for (n, labels), v in m.items():
        if n == name:
            fe = dict(labels).get("frontend", "")
            out[fe] = out.get(fe, 0.0) + v
    return out


def case_frontends():
    """A gRPC call and OpenAI calls against one server: each counts in the
    same families under its own frontend label, sums over the label equal
    the totals, and each request's log lines name its front end."""
    import openai
    model = run.tiny_model(ctx=256)
    n = 4
    pb = run.stubs()[0]
    import grpc
    # Burst 3 and a refill far slower than the test: three generations
    # pass, the fourth and fifth are refused (one per front end).
    with HttpServer(model, extra=["--rate-limit-qps", "0.001",
                                  "--rate-limit-burst", "3"]) as srv:
        c = srv.client()
        mid = srv.model_id()
        m0 = scrape(srv)
        check_eq(sum(fe_sum(m0, "cinfer:request_total").values()), 1.0,
                 "only /v1/models counted so far")
        req = pb.GenerateRequest(text="hello front ends")
        req.sampling.temperature = 0
        req.stopping.max_tokens = n
        req.stopping.ignore_eos = True
        _, final, _ = run.collect(srv.stub().Generate(req, timeout=120))
        r = c.completions.create(model=mid, prompt="hello front ends",
                                 max_tokens=n, temperature=0,
                                 extra_body={"ignore_eos": True})
        http_prompt = r.usage.prompt_tokens
        http_gen = r.usage.completion_tokens
        usage = None
        for ch in c.completions.create(
                model=mid, prompt="hello streams", max_tokens=n,
                temperature=0, stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True}):
            usage = ch.usage or usage
        check(usage is not None, "the stream's usage chunk")
        http_prompt += usage.prompt_tokens
        http_gen += usage.completion_tokens
        try:
            list(srv.stub().Generate(req, timeout=60))
            raise AssertionError("the fourth generation was not limited")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, "gRPC 4th")
        try:
            c.completions.create(model=mid, prompt="hi", max_tokens=1)
            raise AssertionError("the fifth generation was not limited")
        except openai.RateLimitError as e:
            check_eq(e.status_code, 429, "HTTP 5th")
        try:
            c.completions.create(model=mid, prompt="hi", max_tokens=1,
                                 top_p=3)
            raise AssertionError("top_p=3 accepted")
        except openai.BadRequestError:
            pass
        st, _, _ = http_post(srv, "/v1/nowhere", {})
        check_eq(st, 404, "unknown path")
        urllib.request.urlopen(srv.base + "/health", timeout=10).read()

        def settled(m):
            return (series(m, "cinfer:request_total", frontend="openai",
                           method="/v1/completions",
                           code="INVALID_ARGUMENT") >= 1 and
                    series(m, "cinfer:request_total", frontend="grpc",
                           method="Generate",
                           code="RESOURCE_EXHAUSTED") >= 1)
        deadline = time.time() + 10
        m = scrape(srv)
        while not settled(m) and time.time() < deadline:
            time.sleep(0.05)
            m = scrape(srv)
        want = {
            ("grpc", "Generate", "OK"): 1,
            ("grpc", "Generate", "RESOURCE_EXHAUSTED"): 1,
            ("openai", "/v1/models", "OK"): 1,
            ("openai", "/v1/completions", "OK"): 2,
            ("openai", "/v1/completions", "RESOURCE_EXHAUSTED"): 1,
            ("openai", "/v1/completions", "INVALID_ARGUMENT"): 1,
        }
        got = {}
        for (name, labels), v in m.items():
            if name == "cinfer:request_total":
                d = dict(labels)
                got[(d["frontend"], d["method"], d["code"])] = int(v)
        check_eq(got, want, "request_total by frontend, method and code "
                 "(/health and unknown paths are not counted)")
        sums = fe_sum(m, "cinfer:request_total")
        check_eq(sums, {"grpc": 2.0, "openai": 5.0}, "calls per front end")
        check_eq(sum(sums.values()), float(sum(want.values())),
                 "the sum over front ends is the total")
        for fe in ("grpc", "openai"):
            check_eq(series(m, "cinfer:rejected_requests_total", frontend=fe,
                            reason="rate_limited_global"), 1.0,
                     "rejected_requests_total{frontend=%s}" % fe)
            check_eq(series(m, "cinfer:rejection_latency_seconds_count",
                            frontend=fe), 1.0,
                     "rejection latency observations, %s" % fe)
        admitted = {"grpc": 1.0, "openai": 2.0}
        for fam in ("cinfer:time_to_first_token_seconds",
                    "cinfer:e2e_request_latency_seconds",
                    "cinfer:request_queue_time_seconds"):
            counts = {fe: series(m, fam + "_count", frontend=fe)
                      for fe in admitted}
            check_eq(counts, admitted, fam + " observations per front end")
            check_eq(sum(counts.values()),
                     sum(v for (nm, lb), v in m.items()
                         if nm == fam + "_bucket" and ("le", "+Inf") in lb),
                     fam + ": the +Inf buckets add up to the count")
        for fe, itl_max in (("grpc", n - 1), ("openai", 2 * (n - 1))):
            itl = series(m, "cinfer:inter_token_latency_seconds_count",
                         frontend=fe)
            check(0 < itl <= itl_max, "ITL observations %s: %r" % (fe, itl))
        check_eq(series(m, "cinfer:generation_tokens_total", frontend="grpc"),
                 float(final.usage.completion_tokens), "gRPC tokens")
        check_eq(series(m, "cinfer:prompt_tokens_total", frontend="grpc"),
                 float(final.usage.prompt_tokens), "gRPC prompt tokens")
        check_eq(series(m, "cinfer:generation_tokens_total",
                        frontend="openai"), float(http_gen), "HTTP tokens")
        check_eq(series(m, "cinfer:prompt_tokens_total", frontend="openai"),
                 float(http_prompt), "HTTP prompt tokens")
        check(not any(nm.startswith("cinfer:frontend_requests")
                      for nm, _ in m), "no separate front-end counter")

        lines = srv.log_lines()
        done = [l.get("frontend") for l in lines
                if l.get("msg") == "generate done"]
        check_eq(sorted(done), ["grpc", "openai", "openai"],
                 "each generation's log line names its front end")
        rejected = [l.get("frontend") for l in lines
                    if l.get("msg") == "call rejected"]
        check_eq(sorted(rejected), ["grpc", "openai"],
                 "each rejection's log line names its front end")
    log("ok: %r" % got)


def case_shutdown():
    """A client leaves mid-prefill and the server is told to stop at once:
    the drain must wait for the engine's last event of that request, and
    the server exit 0 without a sanitizer report. (A sanitizer run once
    caught the HTTP front end freed while the engine thread still unlisted
    a finished request; this path is where that ordering matters, though
    no test can force that interleaving.)"""
    model = run.need_model()
    with HttpServer(model, extra=["--ctx-size", "2048"]) as srv:
        mid = srv.model_id()
        body = json.dumps({"model": mid, "prompt": PROMPT * 120,
                           "max_tokens": 64, "temperature": 0}).encode()
        s = socket.create_connection(("127.0.0.1", srv.http_port), 30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.time() + 60
        while scrape(srv).get(("cinfer:num_requests_running", ()), 0) < 1:
            check(time.time() < deadline, "the request never ran")
            time.sleep(0.02)
        s.close()  # mid-prefill: a long prompt takes several steps
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(120)
        text = srv.log_text()
        check("AddressSanitizer" not in text, "no sanitizer report:\n" +
              text[-4000:])
        check_eq(srv.proc.returncode, 0, "exit code after SIGTERM")
    log("ok: a request whose client left is waited for at shutdown")


def case_cudasim():
    """The OpenAI API of cinfer-server-cudasim (--device cuda: the CUDA
    backend on the harness) answers completions with logit_bias (one token
    pushed up, one banned), frequency and presence penalties, top_p and a
    seed, greedy and sampled, with the CPU server's text, token for token:
    the bias and penalties are applied to the logits on the device
    (edited_steps), and the draws are made there (drawn_steps)."""
    if not ARGS.cudasim_bin or not os.path.isfile(ARGS.cudasim_bin):
        raise Skip("cinfer-server-cudasim not built (--cudasim-bin)")
    model = run.tiny_model()
    n = ARGS.tokens
    reqs = [dict(prompt=PROMPT, max_tokens=n, temperature=0,
                 logit_bias={"17": 4, "40": -100}),
            dict(prompt=PROMPT + ",", max_tokens=n, temperature=0.8, seed=21,
                 top_p=0.9, logit_bias={"9": 3}, frequency_penalty=0.7,
                 presence_penalty=0.3),
            dict(prompt=PROMPT + " there", max_tokens=n, temperature=1.1,
                 seed=22, frequency_penalty=-0.5)]

    def texts(srv):
        c = srv.client()
        mid = srv.model_id()
        return [c.completions.create(model=mid, **kw).choices[0].text
                for kw in reqs]

    with HttpServer(model, ["--device", "cpu"], name="cpu", threads=1) as cpu:
        want = texts(cpu)
        check_eq(cpu.info().stats.edited_steps, 0, "the CPU edits on the host")
    with HttpServer(model, ["--device", "cuda"], name="cudasim",
                    binary=ARGS.cudasim_bin, env={"CUDASIM_THREADS": "1"},
                    threads=1) as srv:
        got = texts(srv)
        for i, (g, w) in enumerate(zip(got, want)):
            check_eq(g, w, "request %d's text" % i)
        st = srv.info().stats
        check(st.edited_steps > 0, "bias and penalties applied on the device")
        check(st.drawn_steps > 0, "tokens drawn on the device")
    log("ok: biased and penalized completions on the harness = the CPU's")


CASES = {
    "cudasim": case_cudasim,
    "completions": case_completions,
    "chat": case_chat,
    "samples": case_samples,
    "stop": case_stop,
    "logprobs": case_logprobs,
    "errors": case_errors,
    "disconnect": case_disconnect,
    "curl": case_curl,
    "bench": case_bench,
    "json_schema": case_json_schema,
    "spec_ngram": case_spec_ngram,
    "frontends": case_frontends,
    "shutdown": case_shutdown,
}


def prepare():
    need_openai()
    try:
        import prometheus_client.parser  # noqa: F401
    except ImportError:
        raise Skip("prometheus_client not installed")


if __name__ == "__main__":
    threading.stack_size(8 << 20)
    sys.exit(run.case_main(__name__, CASES, "openai",
                           extra=("--bench-bin", "--cudasim-bin"),
                           stubs=True, prepare=prepare))
