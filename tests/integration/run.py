#!/usr/bin/env python3
"""Integration tests: the real cinfer-server on a free loopback port, driven
by cinfer-cli, the Python example client, grpcio and grpcurl.

    run.py CASE --server-bin B --cli-bin C --run-bin R --mkmodel-bin M \\
           [--faulty-bin F] [--model PATH] [--tokens N] [--work DIR]

Each case starts its own server(s) with --listen 127.0.0.1:0 (the port is
read from the server's "listening" log line, so parallel tests never race
for a port) and always stops them at the end, even when the case fails.
Exit status: 0 pass, 1 fail, 77 skip (the default model, grpcio or grpcurl
is missing). Cases that need real text compare against what cinfer-run
prints for the same greedy request; cases that only need a model use a tiny
random one made with cinfer-mkmodel, so they run in a second.

The resilience cases (rejections, retry, timeouts, deadline_free, breaker,
saturated) also use cinfer-server-faulty (--faulty-bin): the same server
over a backend whose steps a control file can slow down (hang_ms) or fail
with device errors (fail), which makes queues, deadlines and breaker trips
happen on cue with the tiny model. Rejections are checked on the wire with
a raw HTTP/2 client (the h2 package): one HEADERS frame with END_STREAM
(Trailers-Only), the status, grpc-retry-pushback-ms and the
google.rpc.Status of grpc-status-details-bin.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

SKIP = 77
ARGS = None
STUBS = None


class Skip(Exception):
    pass


def log(*a):
    print("[it]", *a, file=sys.stderr, flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def check_eq(a, b, what):
    if a != b:
        raise AssertionError("%s: %r != %r" % (what, a, b))


# ---------------------------------------------------------------------------
# Stubs and servers
# ---------------------------------------------------------------------------

def stubs():
    """(cinfer_pb2, cinfer_pb2_grpc, health_pb2, health_pb2_grpc)."""
    global STUBS
    if STUBS is None:
        try:
            import grpc  # noqa: F401
            import grpc_tools  # noqa: F401
        except ImportError:
            raise Skip("grpcio / grpcio-tools not installed")
        import cinfer_client
        d = os.path.join(ARGS.work, "stubs")
        pb, rpc = cinfer_client.load_stubs(d)
        hpb, hrpc = cinfer_client.load_health_stubs(d)
        STUBS = (pb, rpc, hpb, hrpc)
    return STUBS


class Server:
    """A cinfer-server process; use as a context manager."""

    def __init__(self, model, extra=(), name="server", wait_serving=True,
                 threads=2, binary=None, env=None):
        self.model = model
        self.extra = list(extra)
        self.name = name
        self.wait_serving = wait_serving
        self.threads = threads
        self.binary = binary or ARGS.server_bin
        self.env = env
        self.proc = None
        self.port = None
        self.metrics_port = None
        self.channel = None
        self.listening = None  # the "listening" log line

    def __enter__(self):
        self.log_path = os.path.join(ARGS.work, self.name + ".log")
        self.log_file = open(self.log_path, "w")
        cmd = [self.binary, "--listen", "127.0.0.1:0", "--model",
               self.model, "--threads", str(self.threads),
               "--log-level", "debug"]
        # /metrics on a free port too (tests run in parallel).
        if "--metrics-listen" not in self.extra:
            cmd += ["--metrics-listen", "127.0.0.1:0"]
        cmd += self.extra
        log("start", " ".join(cmd))
        env = None
        if self.env:
            env = dict(os.environ)
            env.update(self.env)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=self.log_file, env=env)
        deadline = time.time() + 60
        while self.port is None:
            if self.proc.poll() is not None:
                raise AssertionError("server exited early (%d):\n%s" %
                                     (self.proc.returncode, self.log_text()))
            if time.time() > deadline:
                raise AssertionError("server did not listen:\n" +
                                     self.log_text())
            for line in self.log_lines():
                if line.get("msg") == "listening":
                    self.port = line["port"]
                    self.listening = line
                    # A case run with the emission thread forced (the
                    # *_emit tests) must really have it.
                    want = os.environ.get("CINFER_EMIT_THREAD")
                    if want and line.get("emit_thread") != want:
                        raise AssertionError(
                            "emit_thread %r, CINFER_EMIT_THREAD %r" %
                            (line.get("emit_thread"), want))
                elif line.get("msg") == "metrics listening":
                    self.metrics_port = line["port"]
            time.sleep(0.02)
        self.addr = "127.0.0.1:%d" % self.port
        if self.wait_serving:
            self.wait_health("SERVING", 300)
        return self

    def __exit__(self, exc_type, exc, tb):
        stopped_by_us = self.stop()
        # A server told to stop must exit 0: sanitizer reports (leaks, UB at
        # shutdown) and crashes during shutdown fail the case.
        if exc_type is None and stopped_by_us and self.proc.returncode != 0:
            raise AssertionError("%s exited %d after SIGTERM:\n%s" % (
                self.name, self.proc.returncode, self.log_text()[-6000:]))
        return False

    def log_text(self):
        if not self.log_file.closed:
            self.log_file.flush()
        with open(self.log_path) as f:
            return f.read()

    def log_lines(self):
        out = []
        for line in self.log_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def grpc_channel(self):
        import grpc
        if self.channel is None:
            self.channel = grpc.insecure_channel(self.addr)
        return self.channel

    def stub(self):
        pb, rpc, _, _ = stubs()
        return rpc.InferenceStub(self.grpc_channel())

    def health(self, service=""):
        _, _, hpb, hrpc = stubs()
        r = hrpc.HealthStub(self.grpc_channel()).Check(
            hpb.HealthCheckRequest(service=service), timeout=10)
        return hpb.HealthCheckResponse.ServingStatus.Name(r.status)

    def wait_health(self, want, timeout):
        import grpc
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("server exited (%d):\n%s" %
                                     (self.proc.returncode, self.log_text()))
            try:
                last = self.health()
                if last == want:
                    return
            except grpc.RpcError as e:
                last = e.code().name
            time.sleep(0.05)
        raise AssertionError("health never became %s (last %s)" %
                             (want, last))

    def info(self):
        pb, _, _, _ = stubs()
        return self.stub().GetModelInfo(pb.GetModelInfoRequest(), timeout=30)

    def sigterm(self):
        self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("server did not exit within %ss" % timeout)

    def stop(self):
        """Stops the server if it still runs; True if it had to."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        ours = False
        if self.proc and self.proc.poll() is None:
            ours = True
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.returncode not in (0, None):
            log("%s exit code %s; log tail:\n%s" % (
                self.name, self.proc.returncode, self.log_text()[-4000:]))
        self.log_file.close()
        return ours


def need_model():
    if not ARGS.model or not os.path.isfile(ARGS.model):
        raise Skip("the default model is not installed")
    return ARGS.model


def tiny_model(name="tiny", chat_template=True, ctx=256):
    path = os.path.join(ARGS.work, name + ".gguf")
    if not os.path.exists(path):
        cmd = [ARGS.mkmodel_bin, "-o", path, "--ctx", str(ctx)]
        if not chat_template:
            cmd.append("--no-chat-template")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return path


# ---------------------------------------------------------------------------
# Reference output and clients
# ---------------------------------------------------------------------------

_expected = {}


def expected(prompt, n):
    """What cinfer-run prints for the greedy request (text + newline)."""
    key = (prompt, n)
    if key not in _expected:
        r = subprocess.run([ARGS.run_bin, "-m", ARGS.model, "-p", prompt,
                            "-n", str(n), "--temperature", "0", "-t", "2"],
                           capture_output=True, timeout=600)
        check(r.returncode == 0, "cinfer-run failed: " +
              r.stderr.decode(errors="replace"))
        _expected[key] = r.stdout.decode()
    return _expected[key]


def cli(server, *args, timeout=300, stdin=None):
    cmd = [ARGS.cli_bin, "--server", server.addr] + list(args)
    r = subprocess.run(cmd, capture_output=True, timeout=timeout,
                       input=stdin)
    return r.returncode, r.stdout.decode(errors="replace"), \
        r.stderr.decode(errors="replace")


def py_client(server, *args, timeout=300):
    cmd = [sys.executable, os.path.join(ROOT, "clients", "python",
                                        "cinfer_client.py"),
           "--server", server.addr,
           "--stubs-dir", os.path.join(ARGS.work, "stubs")] + list(args)
    r = subprocess.run(cmd, capture_output=True, timeout=timeout)
    return r.returncode, r.stdout.decode(errors="replace"), \
        r.stderr.decode(errors="replace")


def grpcurl_bin():
    g = shutil.which("grpcurl")
    if not g:
        raise Skip("grpcurl not installed")
    return g


def grpcurl(server, *args, data=None, timeout=300):
    cmd = [grpcurl_bin(), "-plaintext", "-format", "json"]
    if data is not None:
        cmd += ["-d", "@"]
    cmd += [server.addr] + list(args)
    r = subprocess.run(cmd, capture_output=True, timeout=timeout,
                       input=json.dumps(data).encode() if data is not None
                       else None)
    return r.returncode, r.stdout.decode(errors="replace"), \
        r.stderr.decode(errors="replace")


def json_stream(text):
    """The JSON objects of grpcurl's output, in order."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        obj, i = dec.raw_decode(text, i)
        out.append(obj)


def greedy_request(pb, prompt, n, **kw):
    req = pb.GenerateRequest(text=prompt, **kw)
    req.sampling.temperature = 0
    req.stopping.max_tokens = n
    return req


def collect(stream):
    """Text, final message and chunk count of a Generate stream."""
    text, final, chunks = [], None, 0
    for resp in stream:
        if resp.HasField("chunk"):
            text.append(resp.chunk.text)
            chunks += 1
        elif resp.HasField("final"):
            check(final is None, "two final messages")
            final = resp.final
        else:
            raise AssertionError("response with neither chunk nor final")
    check(final is not None, "stream ended without a final message")
    return "".join(text), final, chunks


def wait_engine_idle(server, timeout, since=None, want_gone=0):
    """Waits until the engine holds nothing (no running or waiting request,
    no KV block in use, no Generate call in the server) and, if `since` is
    a stats snapshot, until want_gone more requests ended (finished or
    cancelled). Returns the last GetModelInfo response."""
    deadline = time.time() + timeout
    while True:
        info = server.info()
        s = info.stats
        ended = 0
        if since is not None:
            ended = (s.requests_finished + s.requests_cancelled) - \
                (since.requests_finished + since.requests_cancelled)
        idle = (s.running == 0 and s.waiting == 0 and s.kv_blocks_used == 0
                and info.server.generate_open == 0 and ended >= want_gone)
        if idle:
            return info
        if time.time() > deadline:
            raise AssertionError(
                "engine not idle after %ss: running=%d waiting=%d "
                "kv_used=%d generate_open=%d ended=%d/%d" %
                (timeout, s.running, s.waiting, s.kv_blocks_used,
                 info.server.generate_open, ended, want_gone))
        time.sleep(0.05)


PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at",
]


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

def case_streams():
    """C client, Python client and grpcurl stream the same text as
    cinfer-run; chat input equals the Jinja rendering of the template."""
    model = need_model()
    n = ARGS.tokens
    with Server(model) as srv:
        for prompt in PROMPTS[:2]:
            want = expected(prompt, n)
            check(len(want.strip()) > 0, "cinfer-run printed nothing")
            rc, out, err = cli(srv, "generate", "--prompt", prompt,
                               "--max-tokens", str(n), "--temperature", "0")
            check_eq(rc, 0, "cinfer-cli exit (stderr: %s)" % err)
            check_eq(out, want, "cinfer-cli text for %r" % prompt)
            # The prompt on standard input.
            rc, out, err = cli(srv, "generate", "-n", str(n),
                               "--temperature", "0", stdin=prompt.encode())
            check_eq(rc, 0, "cinfer-cli stdin exit (%s)" % err)
            check_eq(out, want, "cinfer-cli stdin text")
            rc, out, err = py_client(srv, "generate", "--prompt", prompt,
                                     "--max-tokens", str(n),
                                     "--temperature", "0")
            check_eq(rc, 0, "python client exit (stderr: %s)" % err)
            check_eq(out, want, "python client text for %r" % prompt)
            try:
                rc, out, err = grpcurl(
                    srv, "cinfer.v1.Inference/Generate",
                    data={"text": prompt, "stopping": {"maxTokens": n},
                          "sampling": {"temperature": 0}})
                check_eq(rc, 0, "grpcurl exit (stderr: %s)" % err)
                msgs = json_stream(out)
                text = "".join(m["chunk"].get("text", "") for m in msgs
                               if "chunk" in m)
                check("final" in msgs[-1], "grpcurl: last message is final")
                check_eq(text + "\n", want, "grpcurl text for %r" % prompt)
            except Skip as e:
                log("grpcurl part skipped:", e)
            log("ok: C, Python and grpcurl streams equal cinfer-run for %r"
                % prompt)

        # --json prints each message; the final carries usage.
        rc, out, err = cli(srv, "--json", "generate", "-p", PROMPTS[0], "-n",
                           str(n), "--temperature", "0", "--ignore-eos")
        check_eq(rc, 0, "cinfer-cli --json exit")
        msgs = [json.loads(l) for l in out.splitlines() if l.strip()]
        check("final" in msgs[-1], "--json: last line is the final message")
        fin = msgs[-1]["final"]
        check_eq(fin["finishReason"], "FINISH_REASON_LENGTH", "finish")
        check_eq(fin["usage"]["completionTokens"], n, "completion tokens")
        ids = [i for m in msgs[:-1] for i in m["chunk"].get("tokenIds", [])]
        check_eq(len(ids), n, "token ids streamed")
        # Detokenizing the streamed ids gives the streamed text.
        rc, out, err = cli(srv, "detokenize", *[str(i) for i in ids])
        check_eq(rc, 0, "detokenize exit")
        check_eq(out, expected(PROMPTS[0], n), "detokenized stream")

        # Logprobs: one entry per token, with the asked alternatives.
        pb, _, _, _ = stubs()
        req = greedy_request(pb, PROMPTS[0], 4, logprobs=3)
        lp_count = 0
        for resp in srv.stub().Generate(req, timeout=300):
            if resp.HasField("chunk"):
                check_eq(len(resp.chunk.logprobs), len(resp.chunk.token_ids),
                         "logprobs per token")
                for tl, tid in zip(resp.chunk.logprobs, resp.chunk.token_ids):
                    check_eq(tl.token_id, tid, "logprob token id")
                    check(tl.logprob <= 0.0, "logprob <= 0")
                    check_eq(len(tl.top), 3, "top alternatives")
                    # Greedy: the chosen token is the most likely.
                    check_eq(tl.top[0].token_id, tid, "greedy = top-1")
                    lp_count += 1
        check_eq(lp_count, 4, "logprob entries")

        # Chat: the template's rendering, tokenized, equals Tokenize(chat),
        # and the chat stream equals cinfer-run on the rendered text.
        try:
            import jinja2
        except ImportError:
            jinja2 = None
        if jinja2 is None:
            log("chat comparison skipped: jinja2 not installed")
            return
        import gguf
        r = gguf.GGUFReader(model)
        f = r.fields["tokenizer.chat_template"]
        tmpl = bytes(f.parts[f.data[0]]).decode()
        msgs = [{"role": "user", "content": "What is 2+2?"}]
        rendered = jinja2.Environment().from_string(tmpl).render(
            messages=msgs, add_generation_prompt=True)
        tok_chat = srv.stub().Tokenize(pb.TokenizeRequest(
            chat=pb.Chat(messages=[pb.ChatMessage(**m) for m in msgs])),
            timeout=60).token_ids
        tok_text = srv.stub().Tokenize(pb.TokenizeRequest(text=rendered),
                                       timeout=60).token_ids
        check_eq(list(tok_chat), list(tok_text), "chat ids vs Jinja render")
        want = expected(rendered, n)
        rc, out, err = cli(srv, "generate", "--chat", "-p", "What is 2+2?",
                           "-n", str(n), "--temperature", "0")
        check_eq(rc, 0, "chat generate exit (%s)" % err)
        check_eq(out, want, "chat generate text")
        log("ok: chat input renders like the model's Jinja template")


def case_run_chat():
    """cinfer-run --chat renders the prompt with the chat template as the
    server does (server/chat.c): the default model's ChatML with its
    default system turn, and Gemma 3's turn markers (--chat-template: the
    270M file carries none), each giving what the Jinja rendering given
    as plain text gives; a template it does not render is refused by
    name, a model without one as such."""
    import re
    try:
        import jinja2
    except ImportError:
        jinja2 = None

    def run(model, args, stdin=None):
        r = subprocess.run([ARGS.run_bin, "-m", model, "-n", "8",
                            "--temperature", "0", "-t", "2"] + args,
                           capture_output=True, timeout=600, input=stdin)
        return (r.returncode, r.stdout.decode(errors="replace"),
                r.stderr.decode(errors="replace"))

    def n_prompt(err):
        m = re.search(r"prompt (\d+) tokens", err)
        check(m is not None, "cinfer-run stats line in: " + err[-500:])
        return int(m.group(1))

    q = "What is 2+2?"
    msgs = [{"role": "user", "content": q}]
    pairs = []  # (model, extra args, the Jinja rendering as text)
    if jinja2 is None:
        log("rendering comparison skipped: jinja2 not installed")
    if jinja2 and ARGS.model and os.path.isfile(ARGS.model):
        import gguf
        f = gguf.GGUFReader(ARGS.model).fields["tokenizer.chat_template"]
        tmpl = bytes(f.parts[f.data[0]]).decode()
        pairs.append((ARGS.model, [], jinja2.Environment().from_string(
            tmpl).render(messages=msgs, add_generation_prompt=True)))
    gemma = subprocess.run(["sh", os.path.join(ROOT, "scripts",
                                               "gemma-model.sh")],
                           capture_output=True).stdout.decode().strip()
    if jinja2 and gemma and os.path.isfile(gemma):
        path = os.path.join(ROOT, "tests", "data", "chat", "gemma3.jinja")
        with open(path) as fh:
            tmpl = fh.read()
        text = jinja2.Environment().from_string(tmpl).render(
            messages=msgs, add_generation_prompt=True, bos_token="<bos>")
        # cinfer-run puts the tokenizer's BOS before plain text itself
        check(text.startswith("<bos>"), "gemma3 rendering starts with BOS")
        pairs.append((gemma, ["--chat-template", path], text[len("<bos>"):]))
    for model, extra, text in pairs:
        rc, out, err = run(model, ["--chat", "-p", q] + extra)
        check_eq(rc, 0, "cinfer-run --chat exit (%s)" % err[-500:])
        rc2, out2, err2 = run(model, ["-p", "-"], stdin=text.encode())
        check_eq(rc2, 0, "cinfer-run on the rendering (%s)" % err2[-500:])
        check_eq(n_prompt(err), n_prompt(err2),
                 "prompt tokens, --chat vs the rendering of %s" % model)
        check_eq(out, out2, "text, --chat vs the rendering of %s" % model)
        log("ok: --chat on %s renders like its Jinja template (%d tokens)"
            % (os.path.basename(model), n_prompt(err)))

    tiny = tiny_model()
    bare = tiny_model("bare", chat_template=False)
    mistral = os.path.join(ROOT, "tests", "data", "chat",
                           "mistral-nemo.jinja")
    rc, _, err = run(tiny, ["--chat", "-p", q, "--chat-template", mistral])
    check_eq(rc, 1, "a Mistral template refused")
    check("Mistral [INST]" in err, "the refusal names the family: " + err)
    rc, _, err = run(bare, ["--chat", "-p", q])
    check_eq(rc, 1, "a model without a template refused")
    check("no chat template" in err, "the refusal says why: " + err)
    rc, _, err = run(tiny, ["-p", q, "--chat-template", mistral])
    check_eq(rc, 2, "--chat-template without --chat")


def case_concurrent():
    """32 concurrent streams all complete with the text cinfer-run gives.
    Load management is off (--resilience off): this case checks batching,
    and on a slow machine (a sanitizer build on two shared cores) the
    shedder may rightly predict that 32 streams miss even a 900 s deadline;
    the rejection cases check shedding."""
    model = need_model()
    n = ARGS.tokens
    pb, _, _, _ = stubs()
    want = {p: expected(p, n) for p in PROMPTS}
    with Server(model, ["--max-seqs", "32", "--resilience", "off"]) as srv:
        stub = srv.stub()
        results = [None] * 32
        errors = []

        def one(i):
            prompt = PROMPTS[i % len(PROMPTS)]
            try:
                text, final, chunks = collect(stub.Generate(
                    greedy_request(pb, prompt, n, request_id="c-%d" % i),
                    timeout=900))
                results[i] = (prompt, text, final, chunks)
            except Exception as e:  # noqa: BLE001
                errors.append("stream %d: %r" % (i, e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check(not errors, "; ".join(errors))
        for i, (prompt, text, final, chunks) in enumerate(results):
            check_eq(text + "\n", want[prompt], "stream %d (%r)" % (i, prompt))
            check(chunks >= 1, "stream %d has chunks" % i)
        log("ok: 32 streams in %.1fs, all equal to cinfer-run" %
            (time.time() - t0))
        info = wait_engine_idle(srv, 30)
        check(info.stats.requests_finished >= 32, "32 requests finished")
        # The log names each request id once at its end.
        done = [l for l in srv.log_lines() if l.get("msg") == "generate done"]
        ids = sorted(l.get("request_id") for l in done)
        check_eq(ids, sorted("c-%d" % i for i in range(32)),
                 "request ids in the log")

        # A reader that reads nothing does not hold the engine back: its
        # request finishes in the engine while no message has been read,
        # another stream completes meanwhile, and the unread stream still
        # delivers the whole text afterwards.
        before = info.stats
        slow = stub.Generate(greedy_request(pb, PROMPTS[0], n,
                                            request_id="slow"), timeout=900)
        text, final, _ = collect(stub.Generate(
            greedy_request(pb, PROMPTS[1], n), timeout=900))
        check_eq(text + "\n", want[PROMPTS[1]], "stream next to a slow one")
        wait_engine_idle(srv, 120, since=before, want_gone=2)
        text, final, chunks = collect(slow)
        check_eq(text + "\n", want[PROMPTS[0]], "the slow reader's text")
        log("ok: an unread stream finished in the engine; %d chunks read "
            "late" % chunks)


def long_request(pb, prompt="Tell me a very long story"):
    req = pb.GenerateRequest(text=prompt)
    req.sampling.temperature = 0
    req.stopping.max_tokens = 4000
    req.stopping.ignore_eos = True
    return req


def case_cancel():
    """A client that disconnects mid-stream frees its engine request."""
    model = need_model()
    pb, _, _, _ = stubs()
    with Server(model) as srv:
        stub = srv.stub()
        before = srv.info().stats
        # grpcio: cancel after two chunks.
        call = stub.Generate(long_request(pb), timeout=600)
        got = 0
        for resp in call:
            if resp.HasField("chunk"):
                got += 1
                if got == 2:
                    call.cancel()
                    break
        check_eq(got, 2, "chunks before cancel")
        info = wait_engine_idle(srv, 30, since=before, want_gone=1)
        check_eq(info.stats.requests_cancelled - before.requests_cancelled, 1,
                 "engine requests cancelled after a client cancel")
        log("ok: grpcio cancel freed the engine request")

        # cinfer-cli killed mid-stream (the connection drops).
        before = info.stats
        p = subprocess.Popen([ARGS.cli_bin, "--server", srv.addr, "generate",
                              "-p", "Tell me a story", "-n", "4000",
                              "--temperature", "0", "--ignore-eos"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = p.stdout.read(1)
        check(len(first) == 1, "cinfer-cli streamed nothing")
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()
        info = wait_engine_idle(srv, 30, since=before, want_gone=1)
        check_eq(info.stats.requests_cancelled - before.requests_cancelled, 1,
                 "engine requests cancelled after a killed client")
        # The call's context is freed when its last completion-queue event
        # arrives, which may come just after the engine let go of it.
        deadline = time.time() + 10
        while info.server.calls_open != 0 and time.time() < deadline:
            time.sleep(0.05)
            info = srv.info()
        check_eq(info.server.calls_open, 0, "no call left open")
        log("ok: a killed cinfer-cli freed the engine request")


def case_deadline():
    """A call whose deadline passes gets DEADLINE_EXCEEDED and frees its
    engine request; partial output already sent stays sent."""
    import grpc
    model = need_model()
    pb, _, _, _ = stubs()
    with Server(model) as srv:
        stub = srv.stub()
        before = srv.info().stats
        chunks = 0
        code = None
        t0 = time.time()
        try:
            for resp in stub.Generate(long_request(pb), timeout=5.0):
                if resp.HasField("chunk"):
                    chunks += 1
        except grpc.RpcError as e:
            code = e.code()
        check_eq(code, grpc.StatusCode.DEADLINE_EXCEEDED, "status")
        check(time.time() - t0 < 30, "deadline honoured")
        check(chunks >= 1, "partial output before the deadline")
        wait_engine_idle(srv, 30, since=before, want_gone=1)
        log("ok: grpcio deadline freed the engine request (%d chunks)" %
            chunks)

        before = srv.info().stats
        rc, out, err = cli(srv, "--timeout", "3", "generate", "-p",
                           "Tell me a story", "-n", "4000", "--temperature",
                           "0", "--ignore-eos")
        check_eq(rc, 4, "cinfer-cli exit code = DEADLINE_EXCEEDED (%s)" % err)
        check("DEADLINE_EXCEEDED" in err, "cinfer-cli names the status")
        wait_engine_idle(srv, 30, since=before, want_gone=1)
        log("ok: cinfer-cli --timeout freed the engine request")

        # A request time limit (not the call's deadline) ends the stream
        # normally with FINISH_REASON_TIME_LIMIT.
        req = long_request(pb)
        req.stopping.time_limit_ms = 1500
        text, final, _ = collect(stub.Generate(req, timeout=120))
        check_eq(pb.FinishReason.Name(final.finish_reason),
                 "FINISH_REASON_TIME_LIMIT", "time limit finish")
        wait_engine_idle(srv, 30)
        log("ok: time_limit_ms ends with FINISH_REASON_TIME_LIMIT")


def case_validation():
    """Every invalid field gets INVALID_ARGUMENT naming it; unknown methods
    UNIMPLEMENTED; oversized messages RESOURCE_EXHAUSTED."""
    import grpc
    pb, _, hpb, hrpc = stubs()
    model = tiny_model(ctx=256)
    G = pb.GenerateRequest

    def gen(**kw):
        r = G(**kw)
        return r

    def with_sampling(**kw):
        r = G(text="hello")
        for k, v in kw.items():
            setattr(r.sampling, k, v)
        return r

    def with_stopping(**kw):
        r = G(text="hello")
        for k, v in kw.items():
            if isinstance(v, list):
                getattr(r.stopping, k).extend(v)
            else:
                setattr(r.stopping, k, v)
        return r

    long_text = " ".join("w%d" % i for i in range(400))
    cases = [
        (gen(), "input"),
        (gen(text=""), "text"),
        (gen(token_ids=pb.TokenIds()), "token_ids.ids"),
        (gen(token_ids=pb.TokenIds(ids=[5, 512])), "token_ids.ids[1]"),
        (gen(token_ids=pb.TokenIds(ids=[-1])), "token_ids.ids[0]"),
        (gen(token_ids=pb.TokenIds(ids=[1] * 256)), "token_ids.ids"),
        (gen(text=long_text), "text: the prompt is"),
        (gen(chat=pb.Chat()), "chat.messages"),
        (gen(chat=pb.Chat(messages=[pb.ChatMessage(role="", content="x")])),
         "chat.messages[0].role"),
        (gen(chat=pb.Chat(messages=[pb.ChatMessage(role="us er",
                                                   content="x")])),
         "chat.messages[0].role"),
        (with_sampling(temperature=-0.5), "sampling.temperature"),
        (with_sampling(temperature=float("nan")), "sampling.temperature"),
        (with_sampling(temperature=1000), "sampling.temperature"),
        (with_sampling(top_k=-1), "sampling.top_k"),
        (with_sampling(top_p=0.0), "sampling.top_p"),
        (with_sampling(top_p=1.5), "sampling.top_p"),
        (with_sampling(min_p=1.5), "sampling.min_p"),
        (with_sampling(repetition_penalty=0.0), "sampling.repetition_penalty"),
        (with_sampling(presence_penalty=2.5), "sampling.presence_penalty"),
        (with_sampling(frequency_penalty=-3), "sampling.frequency_penalty"),
        (with_stopping(max_tokens=0), "stopping.max_tokens"),
        (with_stopping(max_tokens=257), "stopping.max_tokens"),
        (with_stopping(max_tokens=-5), "stopping.max_tokens"),
        (with_stopping(max_tokens=4, min_tokens=5), "stopping.min_tokens"),
        (with_stopping(min_tokens=-1), "stopping.min_tokens"),
        (with_stopping(stop=["x"] * 17), "stopping.stop"),
        (with_stopping(stop=["ok", ""]), "stopping.stop[1]"),
        (with_stopping(stop=["y" * 300]), "stopping.stop[0]"),
        (with_stopping(stop_token_ids=[512]), "stopping.stop_token_ids[0]"),
        (with_stopping(stop_token_ids=list(range(65))),
         "stopping.stop_token_ids"),
        (with_stopping(time_limit_ms=0), "stopping.time_limit_ms"),
        (gen(text="hi", logprobs=21), "logprobs"),
        (gen(text="hi", logprobs=-1), "logprobs"),
        (gen(text="hi", priority=101), "priority"),
        (gen(text="hi", request_id="has space"), "request_id"),
        (gen(text="hi", request_id="x" * 129), "request_id"),
    ]
    with Server(model, name="tiny") as srv:
        stub = srv.stub()
        for req, field in cases:
            try:
                for _ in stub.Generate(req, timeout=30):
                    pass
                raise AssertionError("accepted: %s" % field)
            except grpc.RpcError as e:
                check_eq(e.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         "code for %s (%s)" % (field, e.details()))
                check(field in e.details(),
                      "message %r names %s" % (e.details(), field))
        log("ok: %d Generate validation cases" % len(cases))

        # A request with every field set and valid works.
        req = G(text="hello world", request_id="all-fields", logprobs=2,
                priority=5)
        s = req.sampling
        s.temperature, s.top_k, s.top_p, s.min_p = 0.8, 40, 0.9, 0.05
        s.repetition_penalty, s.presence_penalty = 1.1, 0.5
        s.frequency_penalty, s.seed = 0.5, 7
        st = req.stopping
        st.max_tokens, st.min_tokens, st.time_limit_ms = 8, 2, 60000
        st.stop.append("zzzz")
        st.stop_token_ids.append(3)
        st.ignore_eos = False
        text, final, _ = collect(stub.Generate(req, timeout=60))
        check(final.usage.completion_tokens >= 1, "tokens generated")
        for resp in stub.Generate(req, timeout=60):
            check_eq(resp.request_id, "all-fields", "request id echoed")
        # The same seed gives the same text.
        text2, _, _ = collect(stub.Generate(req, timeout=60))
        check_eq(text2, text, "seeded sampling reproducible")

        tcases = [
            (pb.TokenizeRequest(), "input"),
            (pb.TokenizeRequest(chat=pb.Chat()), "chat.messages"),
        ]
        for req, field in tcases:
            try:
                stub.Tokenize(req, timeout=30)
                raise AssertionError("Tokenize accepted: %s" % field)
            except grpc.RpcError as e:
                check_eq(e.code(), grpc.StatusCode.INVALID_ARGUMENT, field)
                check(field in e.details(), "%r names %s" % (e.details(),
                                                             field))
        for ids, field in (([1, 600], "token_ids[1]"),
                           ([0] * 257, "token_ids")):
            try:
                stub.Detokenize(pb.DetokenizeRequest(token_ids=ids),
                                timeout=30)
                raise AssertionError("Detokenize accepted: %s" % field)
            except grpc.RpcError as e:
                check_eq(e.code(), grpc.StatusCode.INVALID_ARGUMENT, field)
                check(field in e.details(), "%r names %s" % (e.details(),
                                                             field))
        # Tokenize / Detokenize round trip.
        ids = stub.Tokenize(pb.TokenizeRequest(text="hello world",
                                               return_pieces=True),
                            timeout=30)
        check(len(ids.token_ids) > 0, "tokenized")
        check_eq(b"".join(ids.pieces), b"hello world", "pieces")
        back = stub.Detokenize(pb.DetokenizeRequest(token_ids=ids.token_ids),
                               timeout=30)
        check_eq(back.text, "hello world", "round trip")

        # Unknown methods, unknown services.
        ch = srv.grpc_channel()
        for path in ("/cinfer.v1.Inference/Nope", "/no.such.Service/Call"):
            try:
                ch.unary_unary(path)(b"", timeout=10)
                raise AssertionError("%s answered" % path)
            except grpc.RpcError as e:
                check_eq(e.code(), grpc.StatusCode.UNIMPLEMENTED, path)
        # A message that does not decode.
        try:
            ch.unary_unary("/cinfer.v1.Inference/Tokenize")(b"\xff\xff\xff",
                                                            timeout=10)
            raise AssertionError("garbage accepted")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.INVALID_ARGUMENT, "garbage")
        try:
            srv.health("no.such.Service")
            raise AssertionError("unknown health service answered")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.NOT_FOUND, "health service")
        check_eq(srv.health("cinfer.v1.Inference"), "SERVING", "health")

        # cinfer-cli exit codes follow the status.
        rc, out, err = cli(srv, "generate", "-p", "hi", "--top-p", "2")
        check_eq(rc, 3, "cinfer-cli INVALID_ARGUMENT exit (%s)" % err)
        check("sampling.top_p" in err, "cinfer-cli prints the message")
        rc, out, err = cli(srv, "health")
        check_eq((rc, out.strip()), (0, "SERVING"), "cinfer-cli health")
        rc, out, err = cli(srv, "--json", "info")
        check_eq(rc, 0, "cinfer-cli info")
        info = json.loads(out)
        check_eq(info["vocabSize"], 512, "info vocab")
        check_eq(info["contextLength"], 256, "info context")
        check_eq(info["chatTemplateFormat"], "chatml", "info template")
        log("ok: Tokenize/Detokenize, UNIMPLEMENTED, NOT_FOUND, exit codes")

    # The receive limit.
    with Server(model, ["--max-receive-message-bytes", "65536"],
                name="tiny-small") as srv:
        try:
            srv.stub().Tokenize(pb.TokenizeRequest(text="a" * 100000),
                                timeout=30)
            raise AssertionError("oversized message accepted")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, "size")
        ok = srv.stub().Tokenize(pb.TokenizeRequest(text="a" * 1000),
                                 timeout=30)
        check(len(ok.token_ids) > 0, "small message fine")
        log("ok: --max-receive-message-bytes enforced")

    # A model whose template the server does not know refuses chat.
    with Server(tiny_model("tiny-notmpl", chat_template=False),
                name="tiny-notmpl") as srv:
        try:
            for _ in srv.stub().Generate(G(chat=pb.Chat(messages=[
                    pb.ChatMessage(role="user", content="hi")])), timeout=30):
                pass
            raise AssertionError("chat accepted without a template")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.INVALID_ARGUMENT, "no template")
            check("chat" in e.details() and "ChatML" in e.details(),
                  "message %r" % e.details())
        check_eq(srv.info().chat_template_format, "", "no format reported")
        log("ok: chat refused without a recognised template")


def case_reflection():
    """grpcurl list/describe through reflection (v1alpha), and v1 queried
    with stubs generated from the repository's reflection.proto."""
    import grpc
    from google.protobuf import descriptor_pb2
    model = tiny_model()
    with Server(model, name="tiny") as srv:
        services = ["cinfer.v1.Inference", "grpc.health.v1.Health",
                    "grpc.reflection.v1.ServerReflection",
                    "grpc.reflection.v1alpha.ServerReflection"]
        try:
            g = grpcurl_bin()
        except Skip as e:
            g = None
            log("grpcurl part skipped:", e)
        if g:
            rc, out, err = grpcurl(srv, "list")
            check_eq(rc, 0, "grpcurl list (%s)" % err)
            check_eq(sorted(out.split()), sorted(services), "grpcurl list")
            rc, out, err = grpcurl(srv, "list", "cinfer.v1.Inference")
            check_eq(sorted(out.split()), sorted(
                "cinfer.v1.Inference." + m for m in
                ("Generate", "Tokenize", "Detokenize", "GetModelInfo")),
                "grpcurl list methods")
            rc, out, err = grpcurl(srv, "describe", "cinfer.v1.Inference")
            check_eq(rc, 0, "grpcurl describe")
            check("returns ( stream .cinfer.v1.GenerateResponse )" in out,
                  "describe shows the streaming Generate:\n" + out)
            rc, out, err = grpcurl(srv, "describe",
                                   "cinfer.v1.SamplingParams")
            check("optional float temperature = 1;" in out,
                  "describe shows proto3 optional:\n" + out)
            rc, out, err = grpcurl(srv, "describe", "cinfer.v1.FinishReason")
            check("FINISH_REASON_TIME_LIMIT" in out, "describe enum")
            rc, out, err = grpcurl(srv, "cinfer.v1.Inference/GetModelInfo")
            check_eq(rc, 0, "grpcurl unary call (%s)" % err)
            check_eq(json.loads(out)["vocabSize"], 512, "grpcurl info")
            rc, out, err = grpcurl(srv, "grpc.health.v1.Health/Check")
            check_eq(json.loads(out)["status"], "SERVING", "grpcurl health")
            log("ok: grpcurl list, describe and calls via reflection")

        # v1 with generated stubs.
        d = os.path.join(ARGS.work, "refl-stubs")
        os.makedirs(d, exist_ok=True)
        from grpc_tools import protoc
        check_eq(protoc.main(["protoc", "-I" + os.path.join(ROOT, "proto"),
                              "--python_out=" + d, "--grpc_python_out=" + d,
                              "grpc/reflection/v1/reflection.proto"]), 0,
                 "protoc reflection")
        import importlib.util
        import types
        for pkg in ("grpc.reflection", "grpc.reflection.v1"):
            if pkg not in sys.modules:
                sys.modules[pkg] = types.ModuleType(pkg)
        sys.modules["grpc"].reflection = sys.modules["grpc.reflection"]
        sys.modules["grpc.reflection"].v1 = sys.modules["grpc.reflection.v1"]
        mods = {}
        for name in ("reflection_pb2", "reflection_pb2_grpc"):
            full = "grpc.reflection.v1." + name
            spec = importlib.util.spec_from_file_location(
                full, os.path.join(d, "grpc", "reflection", "v1",
                                   name + ".py"))
            mod = importlib.util.module_from_spec(spec)
            sys.modules[full] = mod
            setattr(sys.modules["grpc.reflection.v1"], name, mod)
            spec.loader.exec_module(mod)
            mods[name] = mod
        rpb = mods["reflection_pb2"]
        rstub = mods["reflection_pb2_grpc"].ServerReflectionStub(
            srv.grpc_channel())
        reqs = [
            rpb.ServerReflectionRequest(list_services=""),
            rpb.ServerReflectionRequest(
                file_containing_symbol="cinfer.v1.Inference"),
            rpb.ServerReflectionRequest(
                file_containing_symbol="cinfer.v1.Inference.Generate"),
            rpb.ServerReflectionRequest(
                file_containing_symbol="cinfer.v1.GenerateRequest.sampling"),
            rpb.ServerReflectionRequest(
                file_by_filename="grpc/health/v1/health.proto"),
            rpb.ServerReflectionRequest(file_containing_symbol="no.Such"),
        ]
        resps = list(rstub.ServerReflectionInfo(iter(reqs), timeout=30))
        check_eq(len(resps), len(reqs), "one answer per request")
        check_eq(sorted(s.name for s in
                        resps[0].list_services_response.service),
                 sorted(services), "v1 list_services")
        for r in resps[1:4]:
            fds = r.file_descriptor_response.file_descriptor_proto
            check(len(fds) >= 1, "descriptor returned")
            fd = descriptor_pb2.FileDescriptorProto.FromString(fds[0])
            check_eq(fd.name, "cinfer/v1/cinfer.proto", "file name")
            check("Inference" in [s.name for s in fd.service], "service")
        fd = descriptor_pb2.FileDescriptorProto.FromString(
            resps[4].file_descriptor_response.file_descriptor_proto[0])
        check_eq(fd.package, "grpc.health.v1", "file_by_filename")
        check_eq(resps[5].error_response.error_code, 5, "unknown symbol")
        check_eq(resps[0].original_request.list_services, "",
                 "original request echoed")
        log("ok: reflection v1 list, symbols, files, errors")


def case_health():
    """NOT_SERVING (and Inference UNAVAILABLE) while the model loads; a
    model that fails to load ends the process with an error."""
    import grpc
    pb, _, _, _ = stubs()
    fifo = os.path.join(ARGS.work, "slow-model.gguf")
    if os.path.exists(fifo):
        os.unlink(fifo)
    os.mkfifo(fifo)
    # Opening the FIFO blocks the load until a writer comes: the server is
    # listening and "loading" for as long as the test wants.
    srv = Server(fifo, name="loading", wait_serving=False)
    with srv:
        check_eq(srv.health(), "NOT_SERVING", "health while loading")
        try:
            srv.stub().GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
            raise AssertionError("GetModelInfo answered while loading")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.UNAVAILABLE, "loading code")
            check("loading" in e.details(), "loading message")
            md = dict(e.trailing_metadata())
            check_eq(md.get("grpc-retry-pushback-ms"), "1000",
                     "loading pushback (%r)" % md)
        rc, out, err = cli(srv, "health")
        check_eq((rc, out.strip()), (20, "NOT_SERVING"), "cinfer-cli health")
        # Let the load fail: feed "not a model" to every open of the FIFO
        # until the server gives up.
        stop = threading.Event()

        def feed():
            while not stop.is_set():
                try:
                    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:
                    time.sleep(0.02)  # no reader yet
                    continue
                try:
                    os.write(fd, b"this is not a model")
                except OSError:
                    pass
                os.close(fd)
                time.sleep(0.02)

        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            code = srv.wait_exit(60)
        finally:
            stop.set()
            feeder.join()
        check_eq(code, 1, "a failed load exits 1 (not a crash)")
        check(any(l.get("msg") == "model load failed" for l in
                  srv.log_lines()), "the log says why")
    log("ok: NOT_SERVING/UNAVAILABLE while loading; failed load exits %d"
        % code)

    # Logs are JSON lines with request ids.
    with Server(tiny_model(), name="tiny") as srv:
        req = pb.GenerateRequest(text="hello", request_id="log-me")
        req.stopping.max_tokens = 3
        collect(srv.stub().Generate(req, timeout=30))
        time.sleep(0.2)
        lines = srv.log_text().splitlines()
        for line in lines:
            json.loads(line)  # every line is JSON
        check(any(json.loads(l).get("request_id") == "log-me" and
                  json.loads(l).get("msg") == "generate done"
                  for l in lines), "request id in the log")
    log("ok: JSON-lines log with request ids")


def case_drain():
    """SIGTERM: health NOT_SERVING (Watch told), new calls UNAVAILABLE,
    running streams finish with their full text, exit 0; past
    --drain-timeout, streams still running end with UNAVAILABLE."""
    import grpc
    model = need_model()
    pb, _, hpb, hrpc = stubs()
    n = max(ARGS.tokens * 3, 24)
    want = {p: expected(p, n) for p in PROMPTS[:3]}
    # --resilience off: the streams must all start however slow the
    # machine (the drain, not load management, is what this case checks)
    with Server(model, ["--drain-timeout", "600", "--resilience", "off"]) \
            as srv:
        stub = srv.stub()
        watch = hrpc.HealthStub(srv.grpc_channel()).Watch(
            hpb.HealthCheckRequest(), timeout=600)
        first = next(watch)
        check_eq(hpb.HealthCheckResponse.ServingStatus.Name(first.status),
                 "SERVING", "watch first status")
        started = threading.Barrier(4)
        results, errors = {}, []

        def one(prompt):
            try:
                text, final, chunks = [], None, 0
                for resp in stub.Generate(greedy_request(pb, prompt, n),
                                          timeout=900):
                    if resp.HasField("chunk"):
                        text.append(resp.chunk.text)
                        chunks += 1
                        if chunks == 1:
                            started.wait(timeout=300)
                    else:
                        final = resp.final
                check(final is not None, "final message")
                results[prompt] = ("".join(text), final)
            except Exception as e:  # noqa: BLE001
                errors.append("%r: %r" % (prompt, e))
                try:
                    started.abort()
                except Exception:  # noqa: BLE001
                    pass

        threads = [threading.Thread(target=one, args=(p,)) for p in want]
        for t in threads:
            t.start()
        started.wait(timeout=300)
        srv.sigterm()
        # Health goes NOT_SERVING, the Watch stream hears it.
        second = next(watch)
        check_eq(hpb.HealthCheckResponse.ServingStatus.Name(second.status),
                 "NOT_SERVING", "watch after SIGTERM")
        check_eq(srv.health(), "NOT_SERVING", "health while draining")
        # New calls are refused while the streams still run.
        try:
            for _ in stub.Generate(greedy_request(pb, "late", 2), timeout=30):
                pass
            raise AssertionError("a new call was accepted while draining")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.UNAVAILABLE, "draining code")
            # Retry at once, elsewhere: pushback 0 in the trailers.
            md = dict(e.trailing_metadata())
            check_eq(md.get("grpc-retry-pushback-ms"), "0",
                     "draining pushback (%r)" % md)
            code, _, retry_ms, _ = rich_status(md["grpc-status-details-bin"])
            check_eq((code, retry_ms), (14, 0), "draining rich status")
        still_running = any(t.is_alive() for t in threads)
        for t in threads:
            t.join()
        check(not errors, "; ".join(errors))
        check(still_running, "streams were still running when refused")
        for prompt, (text, final) in results.items():
            check_eq(text + "\n", want[prompt], "drained stream %r" % prompt)
        code = srv.wait_exit(120)
        check_eq(code, 0, "exit code after drain")
        log("ok: drain finished 3 streams, refused new calls, exit 0")

    # A stream longer than the drain timeout is cut with UNAVAILABLE.
    with Server(model, ["--drain-timeout", "1"], name="drain-short") as srv:
        call = srv.stub().Generate(long_request(pb), timeout=600)
        it = iter(call)
        next(it)
        t0 = time.time()
        srv.sigterm()
        code = None
        try:
            for _ in it:
                pass
        except grpc.RpcError as e:
            code = e.code()
        check_eq(code, grpc.StatusCode.UNAVAILABLE, "cut stream status")
        check_eq(srv.wait_exit(120), 0, "exit code after a cut drain")
        log("ok: drain timeout cut a long stream (%.1fs), exit 0" %
            (time.time() - t0))


# ---------------------------------------------------------------------------
# Resilience: raw HTTP/2, rich status, faults
# ---------------------------------------------------------------------------

GRPC_CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3,
              "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5, "RESOURCE_EXHAUSTED": 8,
              "UNAVAILABLE": 14, "INTERNAL": 13}


def need_faulty():
    if not ARGS.faulty_bin or not os.path.isfile(ARGS.faulty_bin):
        raise Skip("cinfer-server-faulty not built (--faulty-bin)")
    return ARGS.faulty_bin


def need_h2():
    try:
        import h2.connection  # noqa: F401
    except ImportError:
        raise Skip("the h2 package is not installed (pip install h2)")


class Faults:
    """The control file of cinfer-server-faulty."""

    def __init__(self, name):
        self.path = os.path.join(ARGS.work, name + ".faults")
        self.set()

    def set(self, fail=0.0, hang_ms=0, sticky=False):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write("fail=%g hang_ms=%d sticky=%d\n" %
                    (fail, hang_ms, 1 if sticky else 0))
        os.replace(tmp, self.path)
        time.sleep(0.08)  # the backend re-reads it every 20 ms

    def env(self):
        return {"CINFER_FAULT_FILE": self.path}


def faulty_server(name, extra=(), fail=0.0, hang_ms=0, model=None):
    """(Server, Faults) for cinfer-server-faulty on the tiny model."""
    binary = need_faulty()
    faults = Faults(name)
    faults.set(fail, hang_ms)
    srv = Server(model or tiny_model(), list(extra), name=name,
                 binary=binary, env=faults.env(), threads=1)
    return srv, faults


class H2Result:
    def __init__(self):
        self.frames = []          # ("headers", end_stream) / ("data", n) ...
        self.headers = {}         # the first HEADERS block
        self.trailers = {}
        self.messages = 0
        self.elapsed = 0.0

    @property
    def status(self):
        v = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return int(v) if v is not None else None

    @property
    def trailers_only(self):
        """One HEADERS frame with END_STREAM, no DATA, no second HEADERS."""
        return (len(self.frames) >= 1 and self.frames[0] == ("headers", True)
                and not any(f[0] in ("data", "headers")
                            for f in self.frames[1:]))

    def md(self, key):
        return self.headers.get(key, self.trailers.get(key))


def h2_call(addr, path, msg, metadata=(), timeout=30):
    """One gRPC call over a raw HTTP/2 connection (the h2 package): every
    frame of the response as it came."""
    import socket
    import struct
    import h2.config
    import h2.connection
    import h2.events
    host, port = addr.rsplit(":", 1)
    res = H2Result()
    t0 = time.time()
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        hdrs = [(":method", "POST"), (":scheme", "http"), (":path", path),
                (":authority", addr), ("content-type", "application/grpc"),
                ("te", "trailers")] + list(metadata)
        conn.send_headers(1, hdrs)
        conn.send_data(1, b"\0" + struct.pack(">I", len(msg)) + msg,
                       end_stream=True)
        sock.sendall(conn.data_to_send())
        ended = False
        deadline = time.time() + timeout
        buf = b""
        while not ended and time.time() < deadline:
            data = sock.recv(65536)
            if not data:
                break
            # Frame by frame, so that a frame h2 refuses (gRPC core may
            # write to a stream it already ended, e.g. its own
            # DEADLINE_EXCEEDED twice) loses nothing before it.
            buf += data
            events = []
            while len(buf) >= 9:
                n = 9 + int.from_bytes(buf[:3], "big")
                if len(buf) < n:
                    break
                frame, buf = buf[:n], buf[n:]
                try:
                    events += conn.receive_data(frame)
                except Exception as e:  # noqa: BLE001
                    res.frames.append(("h2-error", type(e).__name__))
                    ended = True
                    break
            for ev in events:
                if isinstance(ev, h2.events.ResponseReceived):
                    res.headers = dict(ev.headers)
                    res.frames.append(("headers",
                                       ev.stream_ended is not None))
                elif isinstance(ev, h2.events.DataReceived):
                    res.frames.append(("data", len(ev.data)))
                    conn.acknowledge_received_data(
                        ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.TrailersReceived):
                    res.trailers = dict(ev.headers)
                    res.frames.append(("headers", True))
                elif isinstance(ev, h2.events.StreamEnded):
                    ended = True
                elif isinstance(ev, h2.events.StreamReset):
                    res.frames.append(("reset", ev.error_code))
                    ended = True
            out = conn.data_to_send()
            if out:
                sock.sendall(out)
    finally:
        sock.close()
    res.elapsed = time.time() - t0
    return res


_rpc_mods = None


def rpc_status_modules():
    """(status_pb2, error_details_pb2) generated from proto/google/rpc."""
    global _rpc_mods
    if _rpc_mods is None:
        import importlib.util
        import types
        from grpc_tools import protoc
        import grpc_tools
        d = os.path.join(ARGS.work, "rpc-stubs")
        os.makedirs(d, exist_ok=True)
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__),
                                  "_proto")
        check_eq(protoc.main(["protoc", "-I" + os.path.join(ROOT, "proto"),
                              "-I" + well_known, "--python_out=" + d,
                              "google/rpc/status.proto",
                              "google/rpc/error_details.proto"]), 0,
                 "protoc google.rpc")
        import google.protobuf
        google = sys.modules["google"]
        if "google.rpc" not in sys.modules:
            sys.modules["google.rpc"] = types.ModuleType("google.rpc")
            google.rpc = sys.modules["google.rpc"]
        mods = []
        for name in ("status_pb2", "error_details_pb2"):
            full = "google.rpc." + name
            if full not in sys.modules:
                spec = importlib.util.spec_from_file_location(
                    full, os.path.join(d, "google", "rpc", name + ".py"))
                mod = importlib.util.module_from_spec(spec)
                sys.modules[full] = mod
                spec.loader.exec_module(mod)
            mods.append(sys.modules[full])
        _rpc_mods = tuple(mods)
    return _rpc_mods


def rich_status(details_bin):
    """Decodes grpc-status-details-bin (raw bytes or base64 text): (code,
    message, retry delay in ms or None, [quota subjects])."""
    import base64
    spb, epb = rpc_status_modules()
    if isinstance(details_bin, str):
        pad = "=" * (-len(details_bin) % 4)
        details_bin = base64.b64decode(details_bin + pad)
    st = spb.Status.FromString(details_bin)
    retry_ms, subjects = None, []
    for d in st.details:
        if d.type_url == "type.googleapis.com/google.rpc.RetryInfo":
            ri = epb.RetryInfo.FromString(d.value)
            retry_ms = (ri.retry_delay.seconds * 1000 +
                        ri.retry_delay.nanos // 1000000)
        elif d.type_url == "type.googleapis.com/google.rpc.QuotaFailure":
            qf = epb.QuotaFailure.FromString(d.value)
            subjects += [v.subject for v in qf.violations]
    return st.code, st.message, retry_ms, subjects


def gen_bytes(prompt="hello", n=4, request_id="", ignore_eos=False, **kw):
    pb, _, _, _ = stubs()
    req = pb.GenerateRequest(text=prompt, request_id=request_id, **kw)
    req.stopping.max_tokens = n
    if ignore_eos:
        req.stopping.ignore_eos = True
    return req


GENERATE = "/cinfer.v1.Inference/Generate"


def timed_stream(srv):
    """A 200-token stream, returned once it has 12 tokens: the engine's
    step-time model needs a few steps before it predicts anything."""
    running = Streamer(srv, gen_bytes(n=200, ignore_eos=True))
    check(running.first.wait(30), "the long request started")
    t_end = time.time() + 30
    while running.tokens < 12 and time.time() < t_end:
        time.sleep(0.02)
    return running


def expect_rejection(srv, req, code, reason, pushback=(0, 30000),
                     quota=None, metadata=(), what=""):
    """Sends req over raw HTTP/2 and checks a Trailers-Only rejection:
    status `code`, grpc-retry-pushback-ms within `pushback`, a
    google.rpc.Status with the same code and a RetryInfo of the same delay
    (and a QuotaFailure naming `quota`), and the server's log line naming
    `reason` with the request id. Returns the H2Result."""
    what = what or reason
    r = h2_call(srv.addr, GENERATE, req.SerializeToString(), metadata)
    check(r.trailers_only, "%s: not Trailers-Only: %r" % (what, r.frames))
    check_eq(r.status, GRPC_CODES[code], "%s: grpc-status (%s)" %
             (what, r.md("grpc-message")))
    pb_ms = r.md("grpc-retry-pushback-ms")
    check(pb_ms is not None, "%s: no grpc-retry-pushback-ms" % what)
    pb_ms = int(pb_ms)
    check(pushback[0] <= pb_ms <= pushback[1],
          "%s: pushback %d ms outside %r" % (what, pb_ms, pushback))
    details = r.md("grpc-status-details-bin")
    check(details is not None, "%s: no grpc-status-details-bin" % what)
    scode, smsg, retry_ms, subjects = rich_status(details)
    check_eq(scode, GRPC_CODES[code], "%s: google.rpc.Status code" % what)
    check_eq(retry_ms, pb_ms, "%s: RetryInfo delay = pushback" % what)
    if quota is not None:
        check_eq(subjects, [quota], "%s: QuotaFailure subjects" % what)
    if req.request_id:
        deadline = time.time() + 5
        while True:
            lines = [l for l in srv.log_lines()
                     if l.get("msg") == "call rejected" and
                     l.get("request_id") == req.request_id]
            if lines or time.time() > deadline:
                break
            time.sleep(0.02)
        check(lines, "%s: no 'call rejected' log line for %s" %
              (what, req.request_id))
        check_eq(lines[-1].get("reason"), reason, "%s: logged reason" % what)
        check_eq(lines[-1].get("retry_after_ms"), pb_ms,
                 "%s: logged pushback" % what)
    log("ok: %s: Trailers-Only %s, pushback %d ms, %.1f ms" %
        (what, code, pb_ms, r.elapsed * 1000))
    return r


def refused_at_once(srv, request_id, reason, word):
    """A call with a 60 s deadline that the engine refuses for its load:
    Trailers-Only UNAVAILABLE (expect_rejection) within a second, the
    message naming `word`. Returns the H2Result."""
    r = expect_rejection(srv, gen_bytes(n=4, request_id=request_id),
                         "UNAVAILABLE", reason,
                         metadata=(("grpc-timeout", "60S"),))
    check(r.elapsed < 1.0, "refused at once (%.0f ms)" % (r.elapsed * 1000))
    check(word in (r.md("grpc-message") or ""),
          "message names the %s: %r" % (word, r.md("grpc-message")))
    return r


def scrape(srv):
    """The server's /metrics as {(name, labels tuple): value}, parsed with
    prometheus_client's parser; None when it is not installed."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        log("metrics checks skipped: prometheus_client not installed")
        return None
    import urllib.request
    check(srv.metrics_port, "the server logged no metrics port")
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" %
                                  srv.metrics_port, timeout=10).read()
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def metric(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


class Streamer:
    """A Generate call read on its own thread: chunks, tokens, code."""

    def __init__(self, srv, req, timeout=None, metadata=None):
        self.chunks = 0
        self.tokens = 0
        self.code = None
        self.details = ""
        self.final = None
        self.first = threading.Event()
        self.done = threading.Event()
        self.call = srv.stub().Generate(req, timeout=timeout,
                                        metadata=metadata)
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        import grpc
        try:
            for resp in self.call:
                if resp.HasField("chunk"):
                    self.chunks += 1
                    self.tokens += len(resp.chunk.token_ids)
                    self.first.set()
                else:
                    self.final = resp.final
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code = e.code()
            self.details = e.details() or ""
        finally:
            self.first.set()
            self.done.set()

    def cancel(self):
        self.call.cancel()

    def join(self, timeout=120):
        self.thread.join(timeout)
        check(not self.thread.is_alive(), "a stream did not end")
        return self


def wait_stats(srv, pred, timeout, what):
    deadline = time.time() + timeout
    while True:
        info = srv.info()
        if pred(info):
            return info
        if time.time() > deadline:
            raise AssertionError("%s never happened (stats %s)" %
                                 (what, str(info.stats).replace("\n", " ")))
        time.sleep(0.02)


# ---------------------------------------------------------------------------
# Resilience cases
# ---------------------------------------------------------------------------

def case_rejections():
    """Every kind of rejection arrives Trailers-Only with its pushback and
    a google.rpc.Status: global and per-client rate limits (with
    QuotaFailure), a full queue, too many queued tokens, KV-cache pressure,
    CoDel; grpcio sees the trailers and no message; /metrics counts them."""
    import grpc
    need_h2()
    pb, _, _, _ = stubs()
    model = tiny_model()

    # Global bucket: 0.5/s, burst 1 -> the second call waits ~2 s.
    with Server(model, ["--rate-limit-qps", "0.5", "--rate-limit-burst",
                        "1"], name="rl-global", threads=1) as srv:
        collect(srv.stub().Generate(gen_bytes(request_id="g-1"), timeout=30))
        expect_rejection(srv, gen_bytes(request_id="g-2"),
                         "RESOURCE_EXHAUSTED", "rate_limited_global",
                         pushback=(1000, 2000), quota="server")
        # grpcio: the trailers, no initial metadata, no message.
        call = srv.stub().Generate(gen_bytes(request_id="g-3"), timeout=30)
        got = []
        try:
            for resp in call:
                got.append(resp)
            raise AssertionError("g-3 was admitted")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, "g-3")
            md = dict(e.trailing_metadata())
            check("grpc-retry-pushback-ms" in md, "grpcio trailers: %r" % md)
            code, msg, retry_ms, subj = rich_status(
                md["grpc-status-details-bin"])
            check_eq((code, retry_ms, subj),
                     (8, int(md["grpc-retry-pushback-ms"]), ["server"]),
                     "grpcio rich status")
            check_eq(tuple(call.initial_metadata()), (), "initial metadata")
            check_eq(got, [], "messages")
        log("ok: grpcio sees the pushback trailers, no metadata, no message")
        # Tokenize and health are not limited.
        for _ in range(3):
            srv.stub().Tokenize(pb.TokenizeRequest(text="hi"), timeout=10)
            check_eq(srv.health(), "SERVING", "health while limited")
        m = scrape(srv)
        if m is not None:
            check_eq(metric(m, "cinfer:rejected_requests_total",
                            frontend="grpc",
                            reason="rate_limited_global"), 2.0,
                     "rejected_requests_total{rate_limited_global}")
            check_eq(metric(m, "cinfer:request_total", frontend="grpc",
                            method="Generate",
                            code="RESOURCE_EXHAUSTED"), 2.0,
                     "request_total{Generate,RESOURCE_EXHAUSTED}")
            check_eq(metric(m, "cinfer:request_total", frontend="grpc",
                            method="Generate",
                            code="OK"), 1.0, "request_total{Generate,OK}")
            check_eq(metric(m, "cinfer:rejection_latency_seconds_count",
                            frontend="grpc"),
                     2.0, "rejection latency observations")
            log("ok: /metrics counts the rejections")

    # --resilience off: the same limit is not applied.
    with Server(model, ["--resilience", "off", "--rate-limit-qps", "0.5",
                        "--rate-limit-burst", "1"], name="rl-off",
                threads=1) as srv:
        for i in range(3):
            collect(srv.stub().Generate(gen_bytes(), timeout=30))
        log("ok: --resilience off admits everything")

    # Per-client buckets: by x-client-id, else by the peer's address.
    with Server(model, ["--client-rate-limit-qps", "0.5",
                        "--client-rate-limit-burst", "1"],
                name="rl-client", threads=1) as srv:
        stub = srv.stub()
        collect(stub.Generate(gen_bytes(), timeout=30,
                              metadata=[("x-client-id", "alice")]))
        expect_rejection(srv, gen_bytes(request_id="alice-2"),
                         "RESOURCE_EXHAUSTED", "rate_limited_client",
                         pushback=(1000, 2000), quota="client:alice",
                         metadata=[("x-client-id", "alice")])
        collect(stub.Generate(gen_bytes(), timeout=30,
                              metadata=[("x-client-id", "bob")]))
        log("ok: another client id has its own bucket")
        collect(stub.Generate(gen_bytes(), timeout=30))
        expect_rejection(srv, gen_bytes(request_id="peer-2"),
                         "RESOURCE_EXHAUSTED", "rate_limited_client",
                         pushback=(1000, 2000), quota="client:ipv4:127.0.0.1")

    # The queue: requests waiting for their first token. One runs (slow
    # steps), one waits; bounds of 2 requests and 300 tokens.
    srv, faults = faulty_server("shed-queue", [
        "--max-seqs", "1", "--max-queued-requests", "2",
        "--max-queued-tokens", "300", "--codel-target-ms", "0"],
        hang_ms=20)
    with srv:
        running = Streamer(srv, gen_bytes(n=200, ignore_eos=True))
        check(running.first.wait(30), "the long request started")
        waiting = Streamer(srv, gen_bytes(n=240, ignore_eos=True))
        wait_stats(srv, lambda i: i.stats.waiting == 1, 30, "one waiting")
        expect_rejection(srv, gen_bytes(n=100, request_id="tok-1"),
                         "UNAVAILABLE", "shed_tokens")
        small = Streamer(srv, gen_bytes(n=4))
        wait_stats(srv, lambda i: i.stats.waiting == 2, 30, "two waiting")
        expect_rejection(srv, gen_bytes(n=4, request_id="full-1"),
                         "UNAVAILABLE", "shed_queue_full")
        for st in (running, waiting, small):
            st.cancel()
            st.join()
        wait_engine_idle(srv, 30)

    # KV pressure: 40 blocks of 16 tokens, shed at 5 % while one waits.
    srv, faults = faulty_server("shed-kv", [
        "--max-seqs", "1", "--kv-cache-mem", "160K", "--kv-shed-percent",
        "5", "--codel-target-ms", "0"], hang_ms=10)
    with srv:
        running = Streamer(srv, gen_bytes(n=200, ignore_eos=True))
        wait_stats(srv, lambda i: i.stats.kv_blocks_used >= 3, 30,
                   "3 KV blocks in use")
        waiting = Streamer(srv, gen_bytes(n=4))
        wait_stats(srv, lambda i: i.stats.waiting == 1, 30, "one waiting")
        time.sleep(0.05)  # the watchdog feeds the usage every 10 ms
        expect_rejection(srv, gen_bytes(n=4, request_id="kv-1"),
                         "UNAVAILABLE", "shed_kv_pressure")
        for st in (running, waiting):
            st.cancel()
            st.join()
        wait_engine_idle(srv, 30)

    # CoDel on the wait for a turn: a standing queue of short requests
    # behind slow steps on one slot; once an interval's fastest wait exceeds
    # 20 ms, waits over 40 ms are shed (while queued, or at their first
    # token), each told to retry no sooner than the 200 ms interval.
    srv, faults = faulty_server("shed-codel", [
        "--max-seqs", "1", "--codel-target-ms", "20", "--codel-interval-ms",
        "200", "--max-queued-requests", "100",
        # the engine's own bound on queue waits would refuse them first
        "--max-queue-wait-ms", "0"], hang_ms=30)
    with srv:
        results = []

        def one(i):
            # CoDel sheds only calls with a deadline (grpc-timeout)
            results.append(h2_call(srv.addr, GENERATE, gen_bytes(
                n=2, request_id="codel-%d" % i).SerializeToString(),
                metadata=(("grpc-timeout", "60S"),)))

        threads = []
        for i in range(16):
            t = threading.Thread(target=one, args=(i,))
            t.start()
            threads.append(t)
            time.sleep(0.03)
        for t in threads:
            t.join(120)
        shed = [r for r in results if r.status == GRPC_CODES["UNAVAILABLE"]]
        ok = [r for r in results if r.status == 0]
        check_eq(len(shed) + len(ok), 16, "every call OK or UNAVAILABLE")
        check(len(shed) >= 1 and len(ok) >= 1,
              "CoDel shed some and ran some (%d shed)" % len(shed))
        for r in shed:
            check(r.trailers_only, "CoDel shed not Trailers-Only: %r" %
                  (r.frames,))
            pb = r.md("grpc-retry-pushback-ms")
            check(pb is not None and int(pb) >= 200,
                  "pushback %r below the CoDel interval" % pb)
        reasons = [l.get("reason") for l in srv.log_lines()
                   if l.get("msg") == "call rejected"]
        check(reasons and all(x == "shed_codel" for x in reasons),
              "logged reasons %r" % reasons)
        log("ok: CoDel shed %d of 16 queued calls, Trailers-Only with "
            "pushback" % len(shed))
        wait_engine_idle(srv, 30)

    # The engine's bound on queue waits: with the only slot busy for about
    # 6 s, a call whose deadline leaves time enough (60 s) but that would
    # wait its turn longer than --max-queue-wait-ms is refused at once;
    # one without a deadline still queues.
    srv, faults = faulty_server("queue-wait", [
        "--max-seqs", "1", "--max-queue-wait-ms", "200",
        "--codel-target-ms", "0"], hang_ms=30)
    with srv:
        import grpc
        running = timed_stream(srv)
        r = refused_at_once(srv, "qwait-1", "shed_queue_wait", "wait")
        plain = Streamer(srv, gen_bytes(n=4))
        wait_stats(srv, lambda i: i.stats.waiting == 1, 30,
                   "a call without a deadline queued")
        running.cancel()
        running.join()
        plain.join()
        check_eq(plain.code, grpc.StatusCode.OK, "the queued call ran")
        wait_engine_idle(srv, 30)
        log("ok: a predicted queue wait over the bound refused in %.1f ms" %
            (r.elapsed * 1000))

    # The engine's first-token bound: beside a running decode, a prompt's
    # step carries one more row than on an idle engine, so with a 1 ms
    # bound a call with a deadline is refused at once (shed_first_token,
    # Trailers-Only with its pushback); one without a deadline runs.
    srv, faults = faulty_server("first-token", [
        "--max-seqs", "4", "--max-ttft-ms", "1",
        "--codel-target-ms", "0"], hang_ms=30)
    with srv:
        import grpc
        running = timed_stream(srv)
        r = refused_at_once(srv, "ttft-1", "shed_first_token", "first token")
        plain = Streamer(srv, gen_bytes(n=4))
        plain.join()
        check_eq(plain.code, grpc.StatusCode.OK, "the call without a "
                 "deadline ran")
        running.cancel()
        running.join()
        wait_engine_idle(srv, 30)
        log("ok: a first token predicted past the bound refused in %.1f ms"
            % (r.elapsed * 1000))


def case_retry():
    """A grpcio channel whose service config retries UNAVAILABLE and
    RESOURCE_EXHAUSTED waits the server's pushback between attempts, not
    its own 10 ms backoff."""
    import grpc
    pb, rpc, _, _ = stubs()
    config = json.dumps({"methodConfig": [{
        "name": [{"service": "cinfer.v1.Inference"}],
        "retryPolicy": {
            "maxAttempts": 5, "initialBackoff": "0.01s",
            "maxBackoff": "0.01s", "backoffMultiplier": 1,
            "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]},
    }]})
    with Server(tiny_model(), ["--rate-limit-qps", "2",
                               "--rate-limit-burst", "1"],
                name="retry", threads=1) as srv:
        ch = grpc.insecure_channel(srv.addr, options=[
            ("grpc.enable_retries", 1), ("grpc.service_config", config)])
        stub = rpc.InferenceStub(ch)
        for k in range(3):
            collect(stub.Generate(gen_bytes(request_id="r-%d-a" % k),
                                  timeout=30))
            t0 = time.time()
            text, final, _ = collect(stub.Generate(
                gen_bytes(request_id="r-%d-b" % k), timeout=30))
            took = time.time() - t0
            lines = srv.log_lines()
            rej = [l for l in lines if l.get("msg") == "call rejected" and
                   l.get("request_id") == "r-%d-b" % k]
            check_eq(len(rej), 1, "one rejected attempt (then a retry "
                     "after the pushback), got %d" % len(rej))
            pushback = rej[0]["retry_after_ms"]
            check(50 <= pushback <= 500, "pushback %d ms" % pushback)
            check(took * 1000 >= pushback - 5,
                  "the retry came after %.0f ms < pushback %d ms" %
                  (took * 1000, pushback))
            log("ok: retried after %.0f ms (pushback %d ms)" %
                (took * 1000, pushback))
            time.sleep(0.6)
        ch.close()


def case_timeouts():
    """grpc-timeout values sent raw: 1n and 0S end DEADLINE_EXCEEDED; an
    8-digit one is honoured; 9 digits and garbage are whatever gRPC core
    makes of them, a sane status, and the server stays up."""
    need_h2()
    # Steps of 20 ms: the tiny model would otherwise finish within the
    # millisecond gRPC core rounds a 1n timeout up to.
    srv, faults = faulty_server("timeouts", hang_ms=20)
    with srv:
        msg = gen_bytes(n=4).SerializeToString()
        seen = {}
        for t in ["1n", "0S", "99999999S", "999999999S", "123456789m",
                  "abc", "-5S", "1x", "S", "5", "1.5S", ""]:
            r = h2_call(srv.addr, GENERATE, msg, [("grpc-timeout", t)])
            seen[t] = r.status
            check(r.status is not None, "grpc-timeout %r: no status (%r)" %
                  (t, r.frames))
            check(r.status in (0, 4), "grpc-timeout %r: status %r (%s)" %
                  (t, r.status, r.md("grpc-message")))
            if t in ("1n", "0S"):
                check_eq(r.status, 4, "grpc-timeout %r" % t)
            if t == "99999999S":
                check_eq(r.status, 0, "grpc-timeout %r" % t)
            check(srv.proc.poll() is None, "the server died on %r" % t)
        log("ok: grpc-timeout statuses %r" % seen)
        # Through grpcio: tiny deadlines.
        import grpc
        for timeout in (1e-9, 1e-6, 1e-3):
            try:
                collect(srv.stub().Generate(gen_bytes(n=4), timeout=timeout))
            except grpc.RpcError as e:
                check_eq(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED,
                         "timeout %g" % timeout)
        check_eq(srv.health(), "SERVING", "health after the timeouts")
        text, final, _ = collect(srv.stub().Generate(gen_bytes(n=4),
                                                     timeout=30))
        check(final.usage.completion_tokens >= 1, "a normal call works")
        wait_engine_idle(srv, 30)


def case_deadline_free():
    """Deadlines that pass while queued, during prefill and mid-stream, and
    --max-request-time, end DEADLINE_EXCEEDED and free the KV blocks; a
    deadline the server can not meet even idle is refused at once."""
    import grpc
    need_h2()
    pb, _, _, _ = stubs()
    # --max-prefill-tokens 16: a prompt alone goes in 16-row chunks too,
    # so that a deadline can pass between them
    srv, faults = faulty_server("deadlines", [
        "--max-seqs", "1", "--max-batched-tokens", "16",
        "--max-prefill-tokens", "16",
        "--max-request-time", "3", "--prefix-cache", "0"], hang_ms=200)
    with srv:
        # Idle refusal: steps take >= 200 ms, so a 100 ms deadline can not
        # be met; the refusal is immediate and carries the rich status.
        collect(srv.stub().Generate(gen_bytes(n=3), timeout=60))
        r = h2_call(srv.addr, GENERATE, gen_bytes(
            n=3, request_id="idle-1").SerializeToString(),
            [("grpc-timeout", "100m")])
        check_eq(r.status, 4, "idle refusal status (%s)" %
                 r.md("grpc-message"))
        check(r.trailers_only, "idle refusal Trailers-Only: %r" % r.frames)
        check(r.md("grpc-status-details-bin") is not None and
              "at least" in (r.md("grpc-message") or ""),
              "refused by the server, not by gRPC's timer: %r" %
              r.md("grpc-message"))
        check(r.elapsed < 1.0, "refused at once (%.0f ms)" %
              (r.elapsed * 1000))
        log("ok: an unmeetable deadline refused in %.1f ms" %
            (r.elapsed * 1000))

        faults.set(hang_ms=20)
        # Queued: one long request runs; the next waits past its deadline.
        before = srv.info().stats
        running = Streamer(srv, gen_bytes(n=240, ignore_eos=True))
        check(running.first.wait(30), "the long request started")
        queued = Streamer(srv, gen_bytes(n=4), timeout=0.5).join()
        check_eq(queued.code, grpc.StatusCode.DEADLINE_EXCEEDED, "queued")
        check_eq(queued.chunks, 0, "queued: no output")
        running.cancel()
        running.join()
        wait_engine_idle(srv, 30, since=before, want_gone=2)
        log("ok: a deadline passed in the queue; KV blocks freed")

        # Prefill: 200 prompt tokens in 16-token chunks of 150 ms steps.
        faults.set(hang_ms=150)
        before = srv.info().stats
        req = pb.GenerateRequest(token_ids=pb.TokenIds(
            ids=[5 + (i % 400) for i in range(200)]))
        req.stopping.max_tokens = 4
        pre = Streamer(srv, req, timeout=1.0)
        info = wait_stats(srv, lambda i: i.stats.kv_blocks_used > 0 and
                          i.stats.running == 1, 5, "prefill under way")
        check(info.stats.generated_tokens == before.generated_tokens,
              "still in prefill")
        pre.join()
        check_eq(pre.code, grpc.StatusCode.DEADLINE_EXCEEDED, "prefill")
        check_eq(pre.chunks, 0, "prefill: no output")
        wait_engine_idle(srv, 30, since=before, want_gone=1)
        log("ok: a deadline passed during prefill; KV blocks freed")

        # Mid-stream: partial output stays delivered.
        faults.set(hang_ms=20)
        before = srv.info().stats
        mid = Streamer(srv, gen_bytes(n=240, ignore_eos=True),
                       timeout=1.0).join()
        check_eq(mid.code, grpc.StatusCode.DEADLINE_EXCEEDED, "mid-stream")
        check(mid.chunks >= 1, "mid-stream: partial output delivered")
        wait_engine_idle(srv, 30, since=before, want_gone=1)
        log("ok: a deadline passed mid-stream after %d tokens; KV blocks "
            "freed" % mid.tokens)

        # --max-request-time 3: no client deadline, the server's cap.
        before = srv.info().stats
        t0 = time.time()
        cap = Streamer(srv, gen_bytes(n=250, ignore_eos=True)).join()
        took = time.time() - t0
        check_eq(cap.code, grpc.StatusCode.DEADLINE_EXCEEDED, "max time")
        check("deadline exceeded after" in cap.details, cap.details)
        check(cap.chunks >= 1 and 2.5 < took < 10,
              "cut at ~3 s (%.1f s, %d chunks)" % (took, cap.chunks))
        wait_engine_idle(srv, 30, since=before, want_gone=1)
        log("ok: --max-request-time cut a stream at %.1f s" % took)


def case_breaker():
    """Device faults open the breaker (UNAVAILABLE at once, Trailers-Only,
    with pushback), it half-opens after the wait, reopens on a failed
    probe with a longer wait, and closes when the probes succeed; health
    goes NOT_SERVING after faults in a row and back when the engine serves
    again; a cancelled probe gives its permit back."""
    import grpc
    need_h2()
    srv, faults = faulty_server("breaker", [
        "--breaker-failure-rate", "50", "--breaker-min-calls", "4",
        "--breaker-window-ms", "60000", "--breaker-wait-ms", "1000",
        "--breaker-max-wait-ms", "8000", "--breaker-half-open-probes", "2",
        "--unhealthy-after-faults", "2"])
    internal = 0
    opened = 0
    with srv:
        stub = srv.stub()
        for i in range(2):
            collect(stub.Generate(gen_bytes(request_id="ok-%d" % i),
                                  timeout=30))
        faults.set(fail=1)
        for i in range(2):
            try:
                collect(stub.Generate(gen_bytes(request_id="bad-%d" % i),
                                      timeout=30))
                raise AssertionError("a faulty step succeeded")
            except grpc.RpcError as e:
                check_eq(e.code(), grpc.StatusCode.INTERNAL, "engine fault")
                check("injected device fault" in e.details(), e.details())
                internal += 1
        # 2 failures of 4 calls = 50 %: open.
        t0 = time.time()
        r = expect_rejection(srv, gen_bytes(request_id="open-1"),
                             "UNAVAILABLE", "breaker_open",
                             pushback=(1, 1000), what="breaker open")
        opened += 1
        check("circuit breaker open" in r.md("grpc-message"),
              r.md("grpc-message"))
        srv.wait_health("NOT_SERVING", 10)
        log("ok: health NOT_SERVING after device faults in a row")

        # Half-open with the fault still there: the probe fails and the
        # breaker reopens for twice as long.
        time.sleep(max(0, int(r.md("grpc-retry-pushback-ms")) / 1000.0 -
                       (time.time() - t0)) + 0.05)
        try:
            collect(stub.Generate(gen_bytes(request_id="probe-bad"),
                                  timeout=30))
            raise AssertionError("the failing probe succeeded")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.INTERNAL, "failed probe")
            internal += 1
        r = expect_rejection(srv, gen_bytes(request_id="open-2"),
                             "UNAVAILABLE", "breaker_open",
                             pushback=(1001, 2000), what="breaker reopened")
        opened += 1
        t0 = time.time()

        # Faults stop: health comes back through the watchdog's probe.
        faults.set(fail=0, hang_ms=300)
        srv.wait_health("SERVING", 15)
        log("ok: health SERVING again once the engine serves")
        time.sleep(max(0, int(r.md("grpc-retry-pushback-ms")) / 1000.0 -
                       (time.time() - t0)) + 0.05)

        # Half-open: a probe the client cancels counts for nothing and
        # gives its permit back...
        before = srv.info().stats
        p1 = Streamer(srv, gen_bytes(n=3, request_id="probe-cancel"))
        time.sleep(0.1)
        p1.cancel()
        p1.join()
        check_eq(p1.code, grpc.StatusCode.CANCELLED, "cancelled probe")
        wait_engine_idle(srv, 30, since=before, want_gone=1)
        # ...so both probes still pass, succeed, and close the breaker.
        faults.set(hang_ms=0)
        probes = [Streamer(srv, gen_bytes(n=3, request_id="probe-%d" % i))
                  for i in range(2)]
        for p in probes:
            p.join()
            check_eq(p.code, grpc.StatusCode.OK, "probe (%s)" % p.details)
        for i in range(5):
            collect(stub.Generate(gen_bytes(request_id="after-%d" % i),
                                  timeout=30))
        log("ok: probes closed the breaker; calls pass again")
        check_eq(srv.health(), "SERVING", "health")

        m = scrape(srv)
        if m is not None:
            check_eq(metric(m, "cinfer:breaker_state"), 0.0, "breaker_state")
            # closed->open, ->half, ->open, ->half, ->closed
            check_eq(metric(m, "cinfer:breaker_transitions_total"), 5.0,
                     "breaker transitions")
            check_eq(metric(m, "cinfer:rejected_requests_total",
                            frontend="grpc",
                            reason="breaker_open"), float(opened),
                     "breaker rejections")
            check_eq(metric(m, "cinfer:request_total", frontend="grpc",
                            method="Generate",
                            code="INTERNAL"), float(internal),
                     "INTERNAL count")
            check_eq(metric(m, "cinfer:health_serving"), 1.0, "health gauge")
            log("ok: /metrics: breaker state, transitions, rejections")

    # A stuck engine: a step that hangs past --watchdog-timeout turns
    # health NOT_SERVING (Watch streams hear it) until steps move again.
    _, _, hpb, hrpc = stubs()
    srv, faults = faulty_server("stuck", ["--watchdog-timeout", "0.5"],
                                hang_ms=2500)
    with srv:
        watch = hrpc.HealthStub(srv.grpc_channel()).Watch(
            hpb.HealthCheckRequest(), timeout=60)
        name = hpb.HealthCheckResponse.ServingStatus.Name
        check_eq(name(next(watch).status), "SERVING", "watch first")
        st = Streamer(srv, gen_bytes(n=2))
        check_eq(name(next(watch).status), "NOT_SERVING", "watch: stuck")
        faults.set(hang_ms=0)
        check_eq(name(next(watch).status), "SERVING", "watch: moving again")
        st.join()
        check_eq(st.code, grpc.StatusCode.OK, "the slow request finished")
        watch.cancel()
        log("ok: health NOT_SERVING while a step hangs, SERVING after")


def case_device_lost():
    """A sticky device fault (the faulty backend's healthy slot turns 0)
    fails the step's request with INTERNAL, turns health NOT_SERVING for
    good (no probe brings it back), and the server keeps running: health,
    GetModelInfo and Tokenize still answer, later Generate calls fail
    INTERNAL without holding KV blocks, and SIGTERM still exits 0."""
    import grpc
    pb = stubs()[0]
    # A breaker that never judges: this case is about health alone.
    srv, faults = faulty_server("device_lost", [
        "--breaker-min-calls", "1000", "--unhealthy-after-faults", "0"])
    with srv:
        stub = srv.stub()
        collect(stub.Generate(gen_bytes(request_id="ok"), timeout=30))
        check_eq(srv.health(), "SERVING", "health before the fault")
        check(not srv.info().backend.device_lost, "device_lost before")
        faults.set(fail=1, sticky=True)
        try:
            collect(stub.Generate(gen_bytes(request_id="sticky"), timeout=30))
            raise AssertionError("the step with a sticky fault succeeded")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.INTERNAL, "sticky fault")
            check("sticky device fault" in e.details(), e.details())
        srv.wait_health("NOT_SERVING", 10)
        log("ok: health NOT_SERVING after a sticky fault")

        # The file no longer asks for faults, but the device stays lost:
        # later calls fail, and health does not come back (the watchdog
        # probes only faults that may pass; wait past its interval).
        faults.set(fail=0)
        for i in range(3):
            try:
                collect(stub.Generate(gen_bytes(request_id="after-%d" % i),
                                      timeout=30))
                raise AssertionError("a step on a lost device succeeded")
            except grpc.RpcError as e:
                check_eq(e.code(), grpc.StatusCode.INTERNAL, "lost device")
                check("device is lost" in e.details(), e.details())
        time.sleep(1.5)
        check_eq(srv.health(), "NOT_SERVING", "health stays NOT_SERVING")
        check(srv.proc.poll() is None, "the server is still running")
        # The failed requests left nothing behind in the engine.
        wait_engine_idle(srv, 30)
        info = srv.info()
        check(info.backend.device_lost, "GetModelInfo: device_lost")
        tok = stub.Tokenize(pb.TokenizeRequest(text="hello"), timeout=30)
        check(len(tok.token_ids) > 0, "Tokenize answers")
        if srv.metrics_port:
            m = scrape(srv)
            if m is not None:
                check_eq(metric(m, "cinfer:health_serving"), 0.0,
                         "health gauge")
        log("ok: the server keeps answering with the device lost")


def case_saturated():
    """With every sequence slot busy and the queue full, health checks,
    reflection and GetModelInfo still answer at once, and the overflow is
    refused at once."""
    import grpc
    pb, _, hpb, hrpc = stubs()
    srv, faults = faulty_server("saturated", [
        "--max-seqs", "2", "--max-queued-requests", "4",
        "--codel-target-ms", "0"], hang_ms=50)
    with srv:
        # Queued means "no first token yet": the two that will run first.
        streams = [Streamer(srv, gen_bytes(n=100, ignore_eos=True,
                                           request_id="sat-%d" % i))
                   for i in range(2)]
        for st in streams:
            check(st.first.wait(30), "a running stream started")
        streams += [Streamer(srv, gen_bytes(n=100, ignore_eos=True,
                                            request_id="sat-%d" % i))
                    for i in range(2, 6)]
        wait_stats(srv, lambda i: i.stats.running == 2 and
                   i.stats.waiting == 4, 30, "2 running, 4 waiting")
        over = []
        for i in range(6):
            t0 = time.time()
            st = Streamer(srv, gen_bytes(n=4, request_id="over-%d" % i),
                          timeout=30).join()
            over.append((st.code, time.time() - t0))
        for code, took in over:
            check_eq(code, grpc.StatusCode.UNAVAILABLE, "overflow")
            check(took < 2.0, "overflow refused in %.2f s" % took)
        health = hrpc.HealthStub(srv.grpc_channel())
        for _ in range(5):
            t0 = time.time()
            r = health.Check(hpb.HealthCheckRequest(), timeout=5)
            check_eq(hpb.HealthCheckResponse.ServingStatus.Name(r.status),
                     "SERVING", "health while saturated")
            check(time.time() - t0 < 2.0, "health answered in %.2f s" %
                  (time.time() - t0))
        # The counts hold steady from here on, even while the engine takes
        # requests in and runs a step: sample them several times.
        for _ in range(10):
            t0 = time.time()
            i = srv.info()
            check(time.time() - t0 < 2.0, "GetModelInfo while saturated")
            check_eq((i.stats.running, i.stats.waiting), (2, 4),
                     "still 2 running, 4 waiting")
            time.sleep(0.01)
        try:
            g = grpcurl_bin()
        except Skip:
            g = None
        if g:
            t0 = time.time()
            rc, out, err = grpcurl(srv, "list", timeout=30)
            check_eq(rc, 0, "grpcurl list while saturated (%s)" % err)
            check("cinfer.v1.Inference" in out, "reflection lists")
            check(time.time() - t0 < 5, "reflection answered")
        m = scrape(srv)
        if m is not None:
            check_eq(metric(m, "cinfer:num_requests_running"), 2.0, "running")
            check_eq(metric(m, "cinfer:num_requests_waiting"), 4.0, "waiting")
            check_eq(metric(m, "cinfer:rejected_requests_total",
                            frontend="grpc",
                            reason="shed_queue_full"), 6.0, "shed count")
        log("ok: health, GetModelInfo and reflection answer while saturated; "
            "the overflow is refused in < 1 s")
        for st in streams:
            st.cancel()
        for st in streams:
            st.join()
        wait_engine_idle(srv, 30)


# ---------------------------------------------------------------------------
# The CUDA backend under the CPU harness (cinfer-server-cudasim)
# ---------------------------------------------------------------------------

def need_cudasim():
    if not ARGS.cudasim_bin or not os.path.isfile(ARGS.cudasim_bin):
        raise Skip("cinfer-server-cudasim not built (--cudasim-bin)")
    return ARGS.cudasim_bin


def cudasim_server(name, extra=(), env=None):
    """cinfer-server-cudasim with --device cuda on the tiny model. The
    harness reports what it finds on stderr (the server's log) and its own
    memory is plenty for the tiny model."""
    e = {"CUDASIM_THREADS": "1"}
    e.update(env or {})
    return Server(tiny_model(), ["--device", "cuda"] + list(extra),
                  name=name, binary=need_cudasim(), env=e, threads=1)


def check_on_harness(srv):
    """The server really runs the CUDA backend on the harness's device (a
    link that picked the real CUDA backend would fail to open a device
    here, or name another one)."""
    info = srv.info()
    check_eq(info.backend.name, "cuda", "backend name")
    check(any("cudasim" in d for d in info.backend.devices),
          "device is the harness's: %r" % list(info.backend.devices))
    check(info.backend.memory_budget_bytes > 0, "a device memory budget")


def device_error_named(details, cuda_error):
    """The status names the failed call and its error: the planted CUDA
    error, or the status cuBLAS reports for it when the planted call was a
    cuBLAS one (the harness answers CUBLAS_STATUS_EXECUTION_FAILED)."""
    d = details or ""
    return "failed at" in d and (cuda_error in d or
                                 "CUBLAS_STATUS_EXECUTION_FAILED" in d)


def stream_greedy(srv, prompt, n):
    pb = stubs()[0]
    text, final, _ = collect(srv.stub().Generate(
        greedy_request(pb, prompt, n, request_id="greedy"), timeout=300))
    return text, final


def stream_drawn(srv, prompt, n, **sampling):
    pb = stubs()[0]
    req = greedy_request(pb, prompt, n, request_id="drawn")
    for k, v in sampling.items():
        setattr(req.stopping if k == "min_tokens" else req.sampling, k, v)
    text, final, _ = collect(srv.stub().Generate(req, timeout=300))
    return text, final


def stream_logprobs(srv, prompt, n, top, **sampling):
    """Every token's (id, logprob, [(id, logprob)] of its tops) of a
    Generate asking for `top` logprobs, in order."""
    pb = stubs()[0]
    req = greedy_request(pb, prompt, n, request_id="logprobs")
    req.logprobs = top
    for k, v in sampling.items():
        setattr(req.sampling, k, v)
    out = []
    for resp in srv.stub().Generate(req, timeout=300):
        if resp.HasField("chunk"):
            check_eq(len(resp.chunk.logprobs), len(resp.chunk.token_ids),
                     "a logprob per token")
            for lp in resp.chunk.logprobs:
                out.append((lp.token_id, lp.logprob,
                            [(t.token_id, t.logprob) for t in lp.top]))
    check(len(out) > 0, "tokens with logprobs")
    return out


def case_cudasim_generate():
    """A greedy Generate streamed through cinfer-server-cudasim (--device
    cuda: the CUDA backend's kernels on the CPU harness) gives the CPU
    server's text for the same tiny model and request, token for token, and
    so do seeded draws (temperature, min_p, top_k, top_p), which the CUDA backend
    draws on the device and the CPU server on the host, and greedy and drawn
    requests with the three penalties and min_tokens, which the CUDA backend
    applies to the logits on the device, and the logprobs of greedy and
    drawn tokens, bit for bit, which the CUDA backend finds on the device;
    health is SERVING; the engine ends idle."""
    model = tiny_model()
    n = ARGS.tokens
    prompts = ["Once upon a time", "The capital of France is"]
    want = {}
    drawn = [(prompts[0], dict(temperature=0.9, seed=11)),
             (prompts[1], dict(temperature=1.3, min_p=0.05, seed=12)),
             (prompts[0] + ",", dict(temperature=0.8, top_k=20, seed=13)),
             (prompts[1] + ",", dict(temperature=0.7, repetition_penalty=1.3,
                                     frequency_penalty=0.5,
                                     presence_penalty=0.4, seed=14)),
             (prompts[0] + " there", dict(temperature=0.0,
                                          repetition_penalty=1.2,
                                          frequency_penalty=0.3)),
             (prompts[1] + " not", dict(temperature=0.0, min_tokens=n)),
             (prompts[0] + " in", dict(temperature=0.9, top_p=0.9, seed=17)),
             (prompts[1] + " a", dict(temperature=1.2, top_k=300, top_p=0.8,
                                      frequency_penalty=0.6, seed=18))]
    want_drawn = {}
    with_lp = [(prompts[0], 5, dict(temperature=0.0)),
               (prompts[1], 20, dict(temperature=0.9, seed=15)),
               (prompts[0] + " and", 0, dict(temperature=1.1, top_k=8,
                                             seed=16)),
               (prompts[1] + " of", 3, dict(temperature=0.8, top_p=0.9,
                                            frequency_penalty=0.5,
                                            repetition_penalty=1.2,
                                            seed=19))]
    want_lp = {}
    with Server(model, ["--device", "cpu"], name="cpu", threads=1) as cpu:
        check_eq(cpu.info().backend.name, "cpu", "the CPU server's backend")
        for p in prompts:
            want[p] = stream_greedy(cpu, p, n)
        for p, kw in drawn:
            want_drawn[p] = stream_drawn(cpu, p, n, **kw)
        for p, top, kw in with_lp:
            want_lp[p] = stream_logprobs(cpu, p, n, top, **kw)
        st = cpu.info().stats
        check(st.greedy_steps > 0, "the CPU backend chose greedy tokens")
        check_eq(st.drawn_steps, 0, "the CPU backend draws on the host")
        check_eq(st.edited_steps, 0, "the CPU backend edits on the host")
        check_eq(st.logprob_steps, 0,
                 "the CPU backend's logprobs are the host's")
        check_eq(st.graph_steps, 0, "the CPU backend records no graphs")
        if not os.environ.get("CINFER_EMIT_THREAD"):
            check_eq(cpu.listening.get("emit_thread"), "off",
                     "the CPU server sends from the engine's thread")
    with cudasim_server("cudasim") as srv:
        check_eq(srv.health(), "SERVING", "health")
        if not os.environ.get("CINFER_EMIT_THREAD"):
            check_eq(srv.listening.get("emit_thread"), "on",
                     "a CUDA server sends from the emission thread")
        check_on_harness(srv)
        for p in prompts:
            text, final = stream_greedy(srv, p, n)
            check_eq(text, want[p][0], "streamed text for %r" % p)
            check_eq(final.usage.completion_tokens, want[p][1].usage.completion_tokens,
                     "completion tokens for %r" % p)
            check(final.usage.completion_tokens > 0, "tokens were generated")
        info = srv.info()
        check(info.stats.greedy_steps > 0,
              "greedy steps chose their tokens on the device")
        # seeded draws (temperature, min_p): the device draws the host
        # sampler's tokens, bit for bit
        for p, kw in drawn:
            text, final = stream_drawn(srv, p, n, **kw)
            check_eq(text, want_drawn[p][0], "drawn text for %r %r" % (p, kw))
        # the logits agree within the kernels' bounds, not bit for bit:
        # the same tokens, logprobs within 0.01 (the device's are the host
        # sampler's bits for its own logits: test_backend_ops)
        for p, top, kw in with_lp:
            got = stream_logprobs(srv, p, n, top, **kw)
            what = "logprobs for %r %r" % (p, kw)
            check_eq([g[0] for g in got], [w[0] for w in want_lp[p]],
                     "tokens of " + what)
            for g, w in zip(got, want_lp[p]):
                check(abs(g[1] - w[1]) < 0.01, "%s: %r vs %r" % (what, g, w))
                check_eq(len(g[2]), len(w[2]), "tops of " + what)
                gv = sorted(v for _, v in g[2])
                wv = sorted(v for _, v in w[2])
                check(all(abs(a - b) < 0.01 for a, b in zip(gv, wv)),
                      "%s: tops %r vs %r" % (what, g[2], w[2]))
                if g[2]:
                    check(g[2][0][1] >= max(gv) and
                          all(a[1] >= b[1] for a, b in zip(g[2], g[2][1:])),
                          "tops most likely first: %r" % (g[2],))
        st = srv.info().stats
        check(st.logprob_steps > 0,
              "the logprobs were found on the device")
        check(st.drawn_steps > 0,
              "sampled steps drew their tokens on the device")
        check(st.edited_steps > 0,
              "penalized steps had their logits edited on the device")
        check(0 < st.graph_recorded_steps < st.graph_steps,
              "decode steps replayed CUDA graphs (%d recorded, %d run)" %
              (st.graph_recorded_steps, st.graph_steps))
        wait_engine_idle(srv, 30)
        check_eq(srv.health(), "SERVING", "health after the requests")
    log("ok: cudasim server streams the CPU server's greedy and seeded "
        "text")


def case_cudasim_devbench():
    """cinfer-devbench (scripts/gpu-check.sh's benchmark) built on the CUDA
    harness runs the tiny model in each of its modes, logits to the host,
    greedy tokens on the device and sampled ones (draws, penalty edits,
    logprobs), and prints one JSON line a batch and rep with a decode rate
    (not a speed: the harness runs on the CPU)."""
    if not ARGS.devbench_bin or not os.path.isfile(ARGS.devbench_bin):
        raise Skip("cinfer-devbench-cudasim not built (--devbench-bin)")
    model = tiny_model()
    env = dict(os.environ, CUDASIM_THREADS="1")
    for mode, want in (([], "host"), (["--tokens-on-device"], "device"),
                       (["--sampled-on-device"], "sampled")):
        cmd = [ARGS.devbench_bin, "-m", model, "--device", "cuda",
               "--batch", "1,3", "--steps", "4", "-r", "1"] + mode
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env=env)
        check_eq(r.returncode, 0, "%s: exit (%s)" % (mode, r.stderr[-400:]))
        lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln]
        check_eq([ln["batch"] for ln in lines], [1, 3], "%s: batches" % mode)
        for ln in lines:
            check_eq(ln["tokens"], want, "%s: mode" % mode)
            check(ln["tg_tps"] > 0, "%s: a decode rate" % mode)
            check(ln["desc"].startswith("cuda:"), "%s: on the CUDA backend"
                  % mode)
    log("ok: cinfer-devbench's three modes on the harness")


def case_tensor_parallel():
    """The default model split over 3 CPU ranks (--tensor-parallel 3)
    streams the greedy text of the whole model (--tensor-parallel 1) for
    the same requests, 64 tokens each (end-of-generation ignored, so all 64
    steps run), one at a time and as 8 concurrent (batched) streams;
    --tensor-parallel 2 (3 KV heads) is refused at start with the head
    counts."""
    model = need_model()
    n = 64
    prompts = PROMPTS[:2]
    want = {}
    pb = stubs()[0]

    def request(p, rid="greedy"):
        req = greedy_request(pb, p, n, request_id=rid)
        req.stopping.ignore_eos = True
        return req

    def stream_64(srv, p):
        text, final, _ = collect(srv.stub().Generate(request(p),
                                                     timeout=600))
        check_eq(final.usage.completion_tokens, n, "tokens for %r" % p)
        return text, final

    with Server(model, ["--device", "cpu", "--tensor-parallel", "1"],
                name="tp1") as srv:
        for p in prompts:
            want[p] = stream_64(srv, p)
    with Server(model, ["--device", "cpu", "--tensor-parallel", "3"],
                name="tp3", threads=3) as srv:
        check_eq(srv.health(), "SERVING", "health at TP=3")
        check(any("rank 0 of 3" in d for d in srv.info().backend.devices),
              "the backend is rank 0 of 3: %r"
              % list(srv.info().backend.devices))
        for p in prompts:
            text, final = stream_64(srv, p)
            check_eq(text, want[p][0], "TP=3 text for %r" % p)
        # The same prompts as 8 concurrent streams, which the engine
        # batches: each still gets the text it got alone at TP=1.
        stub = srv.stub()
        results, errors = [None] * 8, []

        def one(i):
            p = prompts[i % len(prompts)]
            try:
                text, _, _ = collect(stub.Generate(
                    request(p, "tp-%d" % i), timeout=900))
                results[i] = (p, text)
            except Exception as e:  # noqa: BLE001
                errors.append("stream %d: %r" % (i, e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check(not errors, "; ".join(errors))
        for i, (p, text) in enumerate(results):
            check_eq(text, want[p][0], "TP=3 batched stream %d (%r)" % (i, p))
        wait_engine_idle(srv, 30)
        check_eq(srv.health(), "SERVING", "health after the requests")
    # Tiny random models whose heads divide by 2 and 3 (12 query heads;
    # 6 KV heads Q8_0, 12 KV heads qwen2 Q4_1): TP=2 and TP=3 through the
    # server give TP=1's 64 greedy tokens.
    pb = stubs()[0]
    for tag, extra in (("kv6", ["--kv-heads", "6", "--dtype", "q8_0",
                                "--embd-dtype", "q8_0"]),
                       ("kv12", ["--kv-heads", "12", "--arch", "qwen2",
                                 "--dtype", "q4_1", "--untied"])):
        path = os.path.join(ARGS.work, "tp-%s.gguf" % tag)
        subprocess.run([ARGS.mkmodel_bin, "-o", path, "--layers", "2",
                        "--embd", "192", "--heads", "12", "--ff", "384"] +
                       extra, check=True, stdout=subprocess.DEVNULL)
        texts = {}
        for tp in (1, 2, 3):
            with Server(path, ["--device", "cpu", "--tensor-parallel",
                               str(tp)], name="%s-tp%d" % (tag, tp),
                        threads=tp) as srv:
                req = greedy_request(pb, "Once upon a time", 64,
                                     request_id="tiny")
                req.stopping.ignore_eos = True
                text, final, _ = collect(srv.stub().Generate(req,
                                                             timeout=300))
                check_eq(final.usage.completion_tokens, 64,
                         "%s TP=%d tokens" % (tag, tp))
                texts[tp] = text
        check_eq(texts[2], texts[1], "%s TP=2 text" % tag)
        check_eq(texts[3], texts[1], "%s TP=3 text" % tag)
    log("ok: tiny 12/6 and 12/12 models: TP=2 and TP=3 stream TP=1's 64 "
        "greedy tokens")
    r = subprocess.run([ARGS.server_bin, "--listen", "127.0.0.1:0",
                        "--metrics-listen", "127.0.0.1:0",
                        "--model", model, "--device", "cpu",
                        "--tensor-parallel", "2"],
                       capture_output=True, timeout=120)
    err = r.stderr.decode(errors="replace")
    check(r.returncode != 0, "TP=2 server exits at start (rc %d)"
          % r.returncode)
    check("head_count 9, head_count_kv 3" in err,
          "TP=2 refusal names the head counts:\n" + err[-2000:])
    log("ok: TP=3 streams TP=1's greedy text, alone and batched; TP=2 "
        "refused")


def case_cudasim_tensor_parallel():
    """cinfer-server-cudasim with --device cuda --tensor-parallel 2 (two
    simulated GPUs, NCCL answered in-process) streams the CPU server's
    greedy text for the tiny model; the multi-node flags that cannot make a
    group are refused at start, naming the flags; a node 1 whose node 0
    never comes ends after --dist-timeout-ms saying so."""
    model = tiny_model()
    n = ARGS.tokens
    prompts = ["Once upon a time", "The capital of France is"]
    want = {}
    with Server(model, ["--device", "cpu"], name="cpu", threads=1) as cpu:
        for p in prompts:
            want[p] = stream_greedy(cpu, p, n)
    with cudasim_server("cudasim-tp2", ["--tensor-parallel", "2"],
                        env={"CUDASIM_DEVICES": "2",
                             "CUDASIM_NCCL_TIMEOUT_S": "60"}) as srv:
        check_eq(srv.health(), "SERVING", "health at TP=2")
        check_eq(srv.info().backend.name, "cuda", "backend name")
        for p in prompts:
            text, final = stream_greedy(srv, p, n)
            check_eq(text, want[p][0], "TP=2 CUDA text for %r" % p)
        wait_engine_idle(srv, 30)
    log("ok: TP=2 on two simulated GPUs streams the CPU server's text")

    def refused(extra, words):
        r = subprocess.run([need_cudasim(), "--listen", "127.0.0.1:0",
                            "--metrics-listen", "", "--model", model,
                            "--device", "cuda"] + extra,
                           capture_output=True, timeout=120,
                           env=dict(os.environ, CUDASIM_DEVICES="2"))
        err = r.stderr.decode(errors="replace")
        check(r.returncode != 0, "%r exits at start (rc %d)"
              % (extra, r.returncode))
        check(words in err, "%r: %r not in:\n%s" % (extra, words,
                                                    err[-2000:]))
        return err
    refused(["--tensor-parallel", "2", "--nnodes", "2"],
            "--nnodes above 1 needs --dist-init-addr")
    refused(["--tensor-parallel", "3", "--nnodes", "2",
             "--dist-init-addr", "127.0.0.1:1"],
            "--tensor-parallel must be a multiple of --nnodes")
    refused(["--tensor-parallel", "2", "--nnodes", "2", "--node-rank", "2",
             "--dist-init-addr", "127.0.0.1:1"],
            "--node-rank must be below --nnodes")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.time()
    err = refused(["--tensor-parallel", "2", "--nnodes", "2",
                   "--node-rank", "1", "--dist-timeout-ms", "1500",
                   "--dist-init-addr", "127.0.0.1:%d" % port],
                  "could not reach node 0 at 127.0.0.1:%d within 1500 ms"
                  % port)
    check(time.time() - t0 < 60, "node 1 gave up within its bound")
    log("ok: bad multi-node flags refused; a lone node 1 times out: %s"
        % [l for l in err.splitlines() if "could not reach" in l][0][-160:])


# The harness counts every runtime and cuBLAS call and every kernel launch
# from the start of the process; the fault fires at this one. Loading the
# tiny model takes a few hundred calls and a step about a hundred, so this
# lands in a step of the first few requests, after the server serves.
CUDASIM_FAULT_AT = 4000


def requests_until_failure(srv, limit, n=8):
    """Sends greedy requests one at a time until one fails; returns
    (successes before it, the RpcError)."""
    import grpc
    stub = srv.stub()
    for i in range(limit):
        try:
            collect(stub.Generate(gen_bytes(n=n, request_id="r-%d" % i,
                                            ignore_eos=True), timeout=120))
        except grpc.RpcError as e:
            return i, e
    raise AssertionError("no request failed in %d (the fault was never "
                         "reached: raise the requests or lower "
                         "CUDASIM_FAULT_AT)" % limit)


def case_cudasim_fault():
    """A transient device error (cudaErrorLaunchOutOfResources, not
    sticky) in one step, planted with CUDASIM_FAULT: that request ends
    INTERNAL and counts as a breaker failure (a breaker that opens on one
    failure opens: the next call is refused UNAVAILABLE, then it closes
    after its wait), the server keeps running, the next requests succeed,
    no KV block stays held, no stream stays open, health stays SERVING."""
    import grpc
    srv = cudasim_server("cudasim_fault", [
        "--breaker-failure-rate", "1", "--breaker-min-calls", "1",
        "--breaker-window-ms", "60000", "--breaker-wait-ms", "300",
        "--breaker-half-open-probes", "1"],
        env={"CUDASIM_FAULT": "%d:cudaErrorLaunchOutOfResources" %
             CUDASIM_FAULT_AT})
    with srv:
        check_on_harness(srv)
        ok, err = requests_until_failure(srv, 60)
        check(ok >= 1, "a request succeeded before the fault (%d)" % ok)
        check_eq(err.code(), grpc.StatusCode.INTERNAL, "faulted request")
        check(device_error_named(err.details(), "cudaErrorLaunchOutOfResources"),
              "the device error is named: %r" % err.details())
        log("ok: request %d failed INTERNAL: %s" % (ok, err.details()))
        stub = srv.stub()
        try:
            collect(stub.Generate(gen_bytes(n=4, request_id="open"),
                                  timeout=60))
            raise AssertionError("the breaker did not count the fault")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.UNAVAILABLE, "breaker open")
            check("circuit breaker open" in (e.details() or ""),
                  e.details())
        time.sleep(0.4)  # past --breaker-wait-ms: half-open, one probe
        check(srv.proc.poll() is None, "the server is still running")
        for i in range(3):
            text, final, _ = collect(stub.Generate(
                gen_bytes(n=4, request_id="after-%d" % i), timeout=120))
            check(final.usage.completion_tokens > 0, "a request after the fault")
        info = wait_engine_idle(srv, 30)
        check_eq(info.stats.kv_blocks_used, 0, "KV blocks held")
        check_eq(info.server.generate_open, 0, "Generate calls open")
        check(not info.backend.device_lost,
              "a transient fault loses no device")
        check_eq(srv.health(), "SERVING", "health after a transient fault")
        m = scrape(srv)
        if m is not None:
            check_eq(metric(m, "cinfer:request_total", frontend="grpc",
                            method="Generate",
                            code="INTERNAL"), 1.0, "INTERNAL count")
            check_eq(metric(m, "cinfer:rejected_requests_total",
                            frontend="grpc",
                            reason="breaker_open"), 1.0, "breaker refusals")
            # closed -> open -> half-open -> closed
            check_eq(metric(m, "cinfer:breaker_transitions_total"), 3.0,
                     "breaker transitions")
            check_eq(metric(m, "cinfer:breaker_state"), 0.0, "breaker closed")
            check_eq(metric(m, "cinfer:kv_cache_usage_perc"), 0.0,
                     "KV usage")
        log("ok: the fault counted for the breaker; the requests after it "
            "succeed; nothing leaked")


def case_cudasim_device_lost():
    """A sticky device error (cudaErrorIllegalAddress) in a step, planted
    with CUDASIM_FAULT: the request ends INTERNAL, the backend reports
    itself unhealthy and health turns NOT_SERVING, the process neither
    aborts nor stops answering health and GetModelInfo, later requests fail
    without holding KV blocks, and SIGTERM still exits 0."""
    import grpc
    srv = cudasim_server("cudasim_lost", [
        "--breaker-min-calls", "1000", "--unhealthy-after-faults", "0"],
        env={"CUDASIM_FAULT": "%d:cudaErrorIllegalAddress:sticky" %
             CUDASIM_FAULT_AT})
    with srv:
        check_on_harness(srv)
        ok, err = requests_until_failure(srv, 60)
        check(ok >= 1, "a request succeeded before the fault (%d)" % ok)
        check_eq(err.code(), grpc.StatusCode.INTERNAL, "faulted request")
        check(device_error_named(err.details(), "cudaErrorIllegalAddress"),
              "the device error is named: %r" % err.details())
        srv.wait_health("NOT_SERVING", 15)
        log("ok: health NOT_SERVING after a sticky fault")
        for i in range(2):
            try:
                collect(srv.stub().Generate(
                    gen_bytes(n=4, request_id="lost-%d" % i), timeout=60))
                raise AssertionError("a step on a lost device succeeded")
            except grpc.RpcError as e:
                check_eq(e.code(), grpc.StatusCode.INTERNAL, "lost device")
        time.sleep(1.0)
        check_eq(srv.health(), "NOT_SERVING", "health stays NOT_SERVING")
        check(srv.proc.poll() is None, "the server is still running")
        info = wait_engine_idle(srv, 30)
        check(info.backend.device_lost, "GetModelInfo: device_lost")
        check_eq(info.stats.kv_blocks_used, 0, "KV blocks held")
        log("ok: the server keeps answering with the device lost")


CASES = {
    "streams": case_streams,
    "run_chat": case_run_chat,
    "concurrent": case_concurrent,
    "cancel": case_cancel,
    "deadline": case_deadline,
    "validation": case_validation,
    "reflection": case_reflection,
    "health": case_health,
    "drain": case_drain,
    "rejections": case_rejections,
    "retry": case_retry,
    "timeouts": case_timeouts,
    "deadline_free": case_deadline_free,
    "breaker": case_breaker,
    "device_lost": case_device_lost,
    "saturated": case_saturated,
    "tensor_parallel": case_tensor_parallel,
    "cudasim_generate": case_cudasim_generate,
    "cudasim_devbench": case_cudasim_devbench,
    "cudasim_tensor_parallel": case_cudasim_tensor_parallel,
    "cudasim_fault": case_cudasim_fault,
    "cudasim_device_lost": case_cudasim_device_lost,
}



def case_main(module, cases, prefix, extra=(), stubs=False, prepare=None):
    """The case dispatch the integration scripts share: parses
    CASE --server-bin --cli-bin --run-bin --mkmodel-bin [--model]
    [--tokens] [--work] plus `extra` (option names defaulting to ""), sets
    ARGS here and in `module` (the caller's __name__), makes a work
    directory (removed after a pass unless --work was given), skips
    without grpcio / grpcio-tools, builds the stubs when `stubs`, calls
    `prepare` (which may raise Skip), runs cases[CASE] and returns the
    exit code (0, 1 or SKIP)."""
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(cases))
    for name in ("--server-bin", "--cli-bin", "--run-bin", "--mkmodel-bin"):
        ap.add_argument(name, required=True)
    for name in extra:
        ap.add_argument(name, default="")
    ap.add_argument("--model", default=os.environ.get("CINFER_MODEL", ""))
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--work", default=None)
    ARGS = ap.parse_args()
    sys.modules[module].ARGS = ARGS
    keep = ARGS.work is not None
    if not keep:
        ARGS.work = tempfile.mkdtemp(prefix="cinfer-it-%s-%s-" %
                                     (prefix, ARGS.case))
    os.makedirs(ARGS.work, exist_ok=True)
    try:
        try:
            import grpc  # noqa: F401
            import grpc_tools  # noqa: F401
        except ImportError:
            raise Skip("grpcio / grpcio-tools not installed "
                       "(scripts/install-deps.sh installs them)")
        if stubs:
            globals()["stubs"]()
        if prepare is not None:
            prepare()
        cases[ARGS.case]()
    except Skip as e:
        print("SKIP: %s" % e, file=sys.stderr)
        return SKIP
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        print("FAIL: %s (work dir %s)" % (ARGS.case, ARGS.work),
              file=sys.stderr)
        return 1
    if not keep:
        shutil.rmtree(ARGS.work, ignore_errors=True)
    print("PASS: %s" % ARGS.case, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(case_main(__name__, CASES, "run",
                       extra=("--faulty-bin", "--cudasim-bin",
                              "--devbench-bin")))
