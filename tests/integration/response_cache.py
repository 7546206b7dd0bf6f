#!/usr/bin/env python3
"""The response cache (--response-cache-mb) of the real cinfer-server, on
both front ends, against a server without it (a fresh run).

  grpc        Generate: a greedy request with logprobs and a seeded
              sampled one with n=2, each asked twice: the second is
              Usage.cached with the tokens, text, logprobs, finish
              reasons and usage of the first and of the uncached
              server's; unseeded sampling is never cached; changing
              max_tokens, the seed, a stop string, top_k of a sampled
              request or the prompt misses; /metrics counts hits,
              misses, insertions, bytes and entries
  openai      /v1/completions (non-streamed and streamed, logprobs) and
              /v1/chat/completions: the repeat carries
              usage.cinfer_response_cached true and the same choices
              and usage as the first and as the uncached server's; a
              greedy gRPC request's answer serves the same request over
              HTTP
  rate_limit  hits still pass the per-client token bucket: a client
              over its burst gets RESOURCE_EXHAUSTED (gRPC) and 429
              (HTTP) for a request whose answer is cached, counted as
              rate_limited_client, while the cache's hit count does not
              move for them
  eviction    a cache of 1 MiB under many distinct answers: bytes stay
              within the bound, evictions are counted, and an evicted
              answer is computed again (equal to the first run)

All cases run on a tiny random model (cinfer-mkmodel), so they take
seconds, under the sanitizers too.

Usage: response_cache.py CASE --server-bin ... --cli-bin ... --run-bin ...
                         --mkmodel-bin ... [--tokens N]
"""
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
CACHE = ["--response-cache-mb", "16"]


def oai():
    """tests/integration/openai.py (its HttpServer, http_post), loaded
    under another name so that it does not shadow the openai package."""
    spec = importlib.util.spec_from_file_location(
        "openai_it", os.path.join(HERE, "openai.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def metrics(srv):
    m = run.scrape(srv)
    if m is None:
        raise Skip("prometheus_client not installed")
    return {k: run.metric(m, "cinfer:response_cache_" + k)
            for k in ("hits_total", "misses_total", "insertions_total",
                      "evictions_total", "bytes", "entries")}


# ---------------------------------------------------------------------------
# gRPC
# ---------------------------------------------------------------------------

def generate(srv, req, metadata=None):
    """Everything a client sees of a Generate call but timings: per
    sample its tokens, text and logprobs; the finish reasons and usage;
    and whether it was cached."""
    samples = {}
    final = None
    for resp in srv.stub().Generate(req, timeout=120, metadata=metadata):
        if resp.HasField("chunk"):
            ch = resp.chunk
            s = samples.setdefault(ch.index, {"ids": [], "text": "",
                                              "lp": []})
            s["ids"] += list(ch.token_ids)
            s["text"] += ch.text
            s["lp"] += [(t.token_id, t.logprob,
                         [(x.token_id, x.logprob) for x in t.top])
                        for t in ch.logprobs]
        else:
            check(final is None, "two final messages")
            final = resp.final
    check(final is not None, "no final message")
    out = {
        "samples": [samples.get(k) for k in sorted(samples)],
        "finish": final.finish_reason,
        "sample_finish": [(s.index, s.finish_reason, s.completion_tokens)
                          for s in final.samples],
        "prompt_tokens": final.usage.prompt_tokens,
        "completion_tokens": final.usage.completion_tokens,
    }
    return out, final.usage.cached


def greedy_req(pb, prompt="Once upon a time", n=None, **kw):
    req = pb.GenerateRequest(text=prompt, **kw)
    req.sampling.temperature = 0
    req.stopping.max_tokens = n or ARGS.tokens
    return req


def seeded_req(pb, seed=7, n_samples=2, **kw):
    req = pb.GenerateRequest(text="The weather today", n=n_samples, **kw)
    req.sampling.temperature = 0.9
    req.sampling.top_p = 0.95
    req.sampling.seed = seed
    req.stopping.max_tokens = ARGS.tokens
    return req


def twice(srv, fresh, req, what):
    """Asks req twice on srv (and once on the uncached server): the first
    is computed, the second cached with the same answer, both the fresh
    run's."""
    a, ca = generate(srv, req)
    b, cb = generate(srv, req)
    f, cf = generate(fresh, req)
    check(not ca, "%s: the first answer is computed" % what)
    check(cb, "%s: the repeat is Usage.cached" % what)
    check(not cf, "%s: the server without a cache never says cached" % what)
    check_eq(b, a, "%s: the cached answer = the first" % what)
    check_eq(a, f, "%s: the first answer = a fresh run's" % what)
    check(a["completion_tokens"] > 0, "%s: tokens were generated" % what)
    return a


def case_grpc():
    model = run.tiny_model()
    pb = run.stubs()[0]
    with run.Server(model, CACHE, name="cached") as srv, \
            run.Server(model, name="fresh") as fresh:
        m0 = metrics(srv)
        greedy = greedy_req(pb, logprobs=3)
        twice(srv, fresh, greedy, "greedy with logprobs")
        twice(srv, fresh, seeded_req(pb), "seeded n=2")
        m1 = metrics(srv)
        check_eq(m1["hits_total"] - m0["hits_total"], 2, "hits counted")
        check_eq(m1["misses_total"] - m0["misses_total"], 2,
                 "misses counted")
        check_eq(m1["insertions_total"] - m0["insertions_total"], 2,
                 "insertions counted")
        check_eq(m1["entries"], 2, "entries")
        check(m1["bytes"] > 0, "bytes held")

        # Unseeded sampling: never looked up, never stored.
        req = seeded_req(pb, n_samples=1)
        req.sampling.ClearField("seed")
        for _ in range(2):
            _, cached = generate(srv, req)
            check(not cached, "unseeded sampling is never cached")
        m2 = metrics(srv)
        check_eq(m2["hits_total"], m1["hits_total"], "no hit for unseeded")
        check_eq(m2["misses_total"], m1["misses_total"],
                 "no lookup for unseeded")
        check_eq(m2["entries"], m1["entries"], "nothing stored for unseeded")

        # Each changed field misses (then is stored in its turn).
        changes = []
        r = greedy_req(pb, logprobs=3)
        r.stopping.max_tokens = ARGS.tokens - 1
        changes.append(("max_tokens", r))
        r = greedy_req(pb, logprobs=3, prompt="Once upon a tim")
        changes.append(("prompt", r))
        r = greedy_req(pb, logprobs=2)
        changes.append(("logprobs", r))
        r = greedy_req(pb, logprobs=3)
        r.stopping.stop.append("zzz")
        changes.append(("stop", r))
        changes.append(("seed", seeded_req(pb, seed=8)))
        r = seeded_req(pb)
        r.sampling.top_k = 5
        changes.append(("top_k", r))
        r = seeded_req(pb, n_samples=3)
        changes.append(("n", r))
        for what, r in changes:
            _, cached = generate(srv, r)
            check(not cached, "changing %s misses" % what)
        # Fields that do not decide the output still hit; a time limit
        # only cuts a run short, and the stored run is complete.
        r = greedy_req(pb, logprobs=3, request_id="another-id", priority=1)
        r.stopping.time_limit_ms = 60000
        _, cached = generate(srv, r)
        check(cached, "request_id, priority and a time limit are not in "
              "the key")
        m3 = metrics(srv)
        check_eq(m3["misses_total"] - m2["misses_total"], len(changes),
                 "one miss per changed field")
        check_eq(m3["hits_total"] - m2["hits_total"], 1, "one more hit")


# ---------------------------------------------------------------------------
# OpenAI-compatible HTTP
# ---------------------------------------------------------------------------

def post(o, srv, path, body):
    st, _, raw = o.http_post(srv, path, body)
    check_eq(st, 200, "%s answered: %s" % (path, raw[:300]))
    return raw


def completion(o, srv, body):
    """(choices and usage without the cached flag, the flag)."""
    j = json.loads(post(o, srv, "/v1/completions", body))
    usage = dict(j["usage"])
    cached = usage.pop("cinfer_response_cached", None)
    check(cached is not None, "usage.cinfer_response_cached is present")
    return {"choices": j["choices"], "usage": usage}, cached


def joined(choices):
    """Streamed choices per index: the text, tokens, logprobs and top
    entries joined, and the finish reason. Where a stream's events break
    is a matter of timing (what accumulated while the last one was being
    sent goes out as one; a replay, which does not wait for the model,
    comes as few events), so streams are compared by their content."""
    out = {}
    for c in choices:
        o = out.setdefault(c["index"], {"text": "", "tokens": [], "lp": [],
                                        "top": [], "finish": None})
        o["text"] += c.get("text") or ""
        lp = c.get("logprobs")
        if lp:
            o["tokens"] += lp["tokens"]
            o["lp"] += lp["token_logprobs"]
            o["top"] += lp["top_logprobs"]
        o["finish"] = c.get("finish_reason") or o["finish"]
    return out


def streamed(o, srv, body):
    """The streamed choices (joined) and the usage chunk, and the
    flag."""
    raw = post(o, srv, "/v1/completions", dict(body, stream=True,
               stream_options={"include_usage": True}))
    choices, usage = [], None
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        j = json.loads(line[6:])
        choices += j.get("choices") or []
        if j.get("usage"):
            usage = dict(j["usage"])
    check(usage is not None, "a usage chunk")
    cached = usage.pop("cinfer_response_cached", None)
    check(cached is not None, "usage.cinfer_response_cached is present")
    return {"choices": joined(choices), "usage": usage}, cached


def http_twice(fn, o, srv, fresh, body, what):
    a, ca = fn(o, srv, body)
    b, cb = fn(o, srv, body)
    f, cf = fn(o, fresh, body)
    check(ca is False, "%s: the first answer is computed" % what)
    check(cb is True, "%s: the repeat is cached" % what)
    check(cf is False, "%s: never cached without the cache" % what)
    check_eq(b, a, "%s: cached = first" % what)
    check_eq(a, f, "%s: first = a fresh run's" % what)
    check_eq(a["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0, True,
             "%s: cached_tokens is the prefix cache's" % what)
    return a


def case_openai():
    o = oai()
    model = run.tiny_model()
    pb = run.stubs()[0]
    with o.HttpServer(model, CACHE, name="cached") as srv, \
            o.HttpServer(model, name="fresh") as fresh:
        mid = json.loads(o.urllib.request.urlopen(
            srv.base + "/v1/models", timeout=10).read())["data"][0]["id"]
        body = {"model": mid, "prompt": "Once upon a time",
                "max_tokens": ARGS.tokens, "temperature": 0, "logprobs": 2}
        m0 = metrics(srv)
        http_twice(completion, o, srv, fresh, body, "completions")
        # Streamed: another request on the wire, the same key: a hit at
        # once, framed as a stream.
        a, cached = streamed(o, srv, body)
        check(cached is True, "streamed: served from the cache")
        f, _ = streamed(o, fresh, body)
        check_eq(a, f, "streamed cached = a fresh streamed run")
        full, _ = completion(o, fresh, body)
        check_eq(a["choices"][0]["text"], full["choices"][0]["text"],
                 "streamed text = the non-streamed text")
        seeded = dict(body, temperature=0.8, seed=11, n=2)
        http_twice(completion, o, srv, fresh, seeded, "seeded n=2")
        unseeded = dict(body, temperature=0.8)
        for _ in range(2):
            _, cached = completion(o, srv, unseeded)
            check(cached is False, "unseeded sampling is never cached")
        _, cached = completion(o, srv, dict(body, max_tokens=3))
        check(cached is False, "another max_tokens misses")
        _, cached = completion(o, srv, dict(seeded, seed=12))
        check(cached is False, "another seed misses")
        # Chat, through the template.
        chat = {"model": mid, "max_tokens": ARGS.tokens, "temperature": 0,
                "messages": [{"role": "user", "content": "Hi there"}]}
        ans = []
        for s in (srv, srv, fresh):
            j = json.loads(post(o, s, "/v1/chat/completions", chat))
            u = dict(j["usage"])
            ans.append((j["choices"], u.pop("cinfer_response_cached"), u))
        check_eq([c for _, c, _ in ans], [False, True, False],
                 "chat: cached only on the repeat")
        check_eq(ans[1][0], ans[0][0], "chat: cached choices = first")
        check_eq(ans[0][0], ans[2][0], "chat: first = a fresh run's")
        check_eq(ans[1][2], ans[0][2], "chat: usage")
        # A greedy gRPC request stored; the same request over HTTP hits.
        req = greedy_req(pb, prompt="A different start")
        grpc_ans, c1 = generate(srv, req)
        check(not c1, "gRPC first: computed")
        j, cached = completion(o, srv, {
            "model": mid, "prompt": "A different start",
            "max_tokens": ARGS.tokens, "temperature": 0})
        check(cached is True, "the HTTP request hits gRPC's answer")
        check_eq(j["choices"][0]["text"], grpc_ans["samples"][0]["text"],
                 "the same text on both front ends")
        m1 = metrics(srv)
        check_eq(m1["hits_total"] - m0["hits_total"], 5, "hits counted")
        check(m1["bytes"] > 0 and m1["entries"] >= 4, "entries held")


# ---------------------------------------------------------------------------
# The rate limiter and eviction
# ---------------------------------------------------------------------------

def case_rate_limit():
    import grpc
    o = oai()
    model = run.tiny_model()
    pb = run.stubs()[0]
    # Two requests per client, and (almost) no refill while the case runs.
    limits = ["--client-rate-limit-qps", "0.001",
              "--client-rate-limit-burst", "2"]
    with o.HttpServer(model, CACHE + limits, name="limited") as srv:
        req = greedy_req(pb)
        md = [("x-client-id", "alice")]
        a, c1 = generate(srv, req, metadata=md)
        b, c2 = generate(srv, req, metadata=md)
        check(not c1 and c2, "alice: computed, then cached")
        check_eq(b, a, "the cached answer")
        hits = metrics(srv)["hits_total"]
        try:
            generate(srv, req, metadata=md)
            raise AssertionError("alice's third request was admitted")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                     "a hit over the client's rate")
        mid = json.loads(o.urllib.request.urlopen(
            srv.base + "/v1/models", timeout=10).read())["data"][0]["id"]
        body = {"model": mid, "prompt": "Once upon a time",
                "max_tokens": ARGS.tokens, "temperature": 0, "user": "bob"}
        for i in range(2):
            _, cached = completion(o, srv, body)
            check(cached is True, "bob's request %d hits alice's answer" % i)
        st, hdr, raw = o.http_post(srv, "/v1/completions", body)
        check_eq(st, 429, "bob over his rate, with the answer cached: %s" %
                 raw[:200])
        check(hdr.get("Retry-After"), "429 with Retry-After")
        m = run.scrape(srv)
        check_eq(run.metric(m, "cinfer:response_cache_hits_total"),
                 hits + 2, "refused requests are no hits")
        refused = sum(v for (name, labels), v in m.items()
                      if name == "cinfer:rejected_requests_total" and
                      ("reason", "rate_limited_client") in labels)
        check_eq(refused, 2, "both counted as rate_limited_client")


def long_req(pb, i):
    """A greedy answer of 200 tokens with 20 logprobs each (about 40 KiB
    held)."""
    req = greedy_req(pb, prompt="story number %d" % i, logprobs=20, n=200)
    req.stopping.ignore_eos = True
    return req


def case_eviction():
    model = run.tiny_model()
    pb = run.stubs()[0]
    bound = 1 << 20
    with run.Server(model, ["--response-cache-mb", "1"],
                    name="small") as srv:
        first = None
        evicted = False
        for i in range(100):
            req = long_req(pb, i)
            ans, cached = generate(srv, req)
            check(not cached, "a new prompt is computed")
            if i == 0:
                first = ans
            m = metrics(srv)
            check(m["bytes"] <= bound, "bytes %d within the bound" %
                  m["bytes"])
            if m["evictions_total"] > 0:
                evicted = True
                break
        check(evicted, "the answers outgrew 1 MiB")
        log("evicted after %d answers, %d bytes held in %d entries" %
            (i + 1, m["bytes"], m["entries"]))
        check(m["entries"] < i + 1, "fewer entries than answers")
        # The first, least recently used, was evicted: computed again,
        # the same answer.
        again, cached = generate(srv, long_req(pb, 0))
        check(not cached, "the evicted answer is computed again")
        check_eq(again, first, "and is the same")


CASES = {
    "grpc": case_grpc,
    "openai": case_openai,
    "rate_limit": case_rate_limit,
    "eviction": case_eviction,
}


if __name__ == "__main__":
    sys.exit(run.case_main(__name__, CASES, "rcache", stubs=True))
