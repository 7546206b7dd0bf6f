#!/usr/bin/env python3
"""The Tokenize unary rate with TLS and API keys on, against plaintext
without keys, measured with h2load (Debian nghttp2-client).

    bench/tokenize_rate.py [--build build/release] [--model PATH] \\
        [--rounds 25] [--seconds 2] [--clients 8] [--streams 32] \\
        [--key-header authorization|x-api-key] [--out bench/results]

Starts cinfer-server processes on the same model (the tiny random model
cinfer-mkmodel makes, unless --model): one plaintext without keys (the
baseline), one with --tls-cert/--tls-key (a CA and certificate made here
with the openssl CLI) and --api-keys, and (unless --no-split) one with
TLS only and one with keys only, to say which costs what. Then, round
after round, runs h2load against each in turn (the order turning each
round) with a prebuilt gRPC message body (a length-prefixed
TokenizeRequest), content-type application/grpc, te: trailers and, where
keys are on, authorization: Bearer KEY (which h2load, like nghttp2 for
every authorization header, sends never indexed: the server's HPACK
decoder decodes it on every call) or, with --key-header x-api-key,
x-api-key: KEY (which h2load's encoder indexes: later calls name it by
its index). Prints each run's requests/s and every call's status check;
the headline is the median over rounds of TLS+keys / plaintext in the
same round (runs seconds apart, where the machine's other load has
had little time to change), beside the ratio of the medians; writes
OUT/tokenize-rate.md, or OUT/tokenize-rate-x-api-key.md with x-api-key (an
older one moves to OUT/history/).

h2load runs on the same cores as the server: the figures are the
server's rate under a client that takes its share of the CPU, its TLS
work included, as a client on the same host would.
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

TOKENIZE = "/cinfer.v1.Inference/Tokenize"
BASE, BOTH = "plaintext, no keys", "TLS + API key"
KEY = "bench-key-0123456789abcdef"


def log(*a):
    print("[tokenize-rate]", *a, file=sys.stderr, flush=True)


def tokenize_body(text):
    """A gRPC message: flag 0, big-endian length, TokenizeRequest{text}."""
    data = text.encode()
    msg = b"\x0a" + varint(len(data)) + data
    return b"\0" + struct.pack(">I", len(msg)) + msg


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def openssl(*args):
    subprocess.run(["openssl"] + list(args), check=True,
                   capture_output=True, timeout=60)


def make_pki(d):
    """A CA and a server certificate for 127.0.0.1: (cert, key)."""
    ca_key, ca = os.path.join(d, "ca.key"), os.path.join(d, "ca.pem")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", ca_key,
            "-out", ca, "-days", "2", "-subj", "/CN=bench-ca")
    key, csr = os.path.join(d, "srv.key"), os.path.join(d, "srv.csr")
    crt, ext = os.path.join(d, "srv.pem"), os.path.join(d, "srv.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
            "-out", csr, "-subj", "/CN=bench")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key,
            "-CAcreateserial", "-out", crt, "-days", "2", "-extfile", ext)
    return crt, key


class Server:
    def __init__(self, binary, model, work, name, extra=()):
        self.log_path = os.path.join(work, name + ".log")
        self.logf = open(self.log_path, "w")
        cmd = [binary, "--listen", "127.0.0.1:0", "--model", model,
               "--metrics-listen", "off", "--log-level", "info"] + list(extra)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=self.logf)
        self.port = None
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError("%s did not start:\n%s" % (
                    name, open(self.log_path).read()[-3000:]))
            lines = []
            for ln in open(self.log_path):
                try:
                    lines.append(json.loads(ln))
                except ValueError:
                    pass
            for j in lines:
                if j.get("msg") == "listening":
                    self.port = j["port"]
            if self.port and any(j.get("msg") == "serving" for j in lines):
                break
            time.sleep(0.05)

    def cpu_s(self):
        """The process's user + system CPU time so far, in seconds."""
        with open("/proc/%d/stat" % self.proc.pid) as f:
            p = f.read().rsplit(")", 1)[1].split()
        return (int(p[11]) + int(p[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()


def h2load(url, body, seconds, clients, streams, headers):
    cmd = ["h2load", "-D", str(seconds), "-t", "1",
           "-c", str(clients), "-m", str(streams), "-d", body,
           "-H", "content-type: application/grpc", "-H", "te: trailers"]
    for h in headers:
        cmd += ["-H", h]
    out = subprocess.run(cmd + [url], capture_output=True, text=True,
                         timeout=seconds + 120).stdout
    m = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    r = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, "
                  r"(\d+) succeeded, (\d+) failed, (\d+) errored", out)
    if not m or not r:
        raise RuntimeError("h2load printed no rate:\n" + out)
    done, ok = int(r.group(3)), int(r.group(4))
    s2 = re.search(r"status codes: (\d+) 2xx", out)
    # Each answer is a message (DATA); a refusal would be Trailers-Only.
    d = re.search(r"\((\d+)\) data", out)
    data = int(d.group(1)) if d else 0
    return (float(m.group(1)), done, ok, int(s2.group(1)) if s2 else 0,
            data)


def grpcurl_check(port, tls, ca, key):
    """One Tokenize call with grpcurl (when installed), with the key
    header `key` (the one h2load sends; None: no keys) and without it:
    the configuration answers, and refuses a call without its key."""
    g = shutil.which("grpcurl")
    if not g:
        return "grpcurl missing: not checked"
    base = [g, "-format", "json"] + (["-cacert", ca] if tls else
                                     ["-plaintext"])
    call = ["-d", '{"text": "hello world"}', "127.0.0.1:%d" % port,
            "cinfer.v1.Inference/Tokenize"]
    auth = ["-H", key] if key else []
    r = subprocess.run(base + auth + call, capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0 or "tokenIds" not in r.stdout:
        raise RuntimeError("Tokenize failed: " + r.stdout + r.stderr)
    out = "OK"
    if key:
        r = subprocess.run(base + call, capture_output=True, text=True,
                           timeout=60)
        if "Unauthenticated" not in r.stderr:
            raise RuntimeError("a call without the key was not refused: " +
                               r.stdout + r.stderr)
        out += ", UNAUTHENTICATED without the key"
    return out


def quartiles(v):
    if len(v) < 4:
        return "-"
    q = statistics.quantiles(v, n=4)
    return "%.3f-%.3f" % (q[0], q[2])


def uptime():
    return subprocess.run(["uptime"], capture_output=True,
                          text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--model", default="")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--seconds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--no-split", dest="split", action="store_false",
                    help="leave out the TLS-only and key-only servers")
    ap.add_argument("--text", default="The quick brown fox jumps over the "
                    "lazy dog.")
    ap.add_argument("--key-header", choices=("authorization", "x-api-key"),
                    default="authorization",
                    help="the header that carries the key")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    if not shutil.which("h2load"):
        sys.exit("h2load not found (Debian: apt-get install nghttp2-client)")
    server_bin = os.path.join(args.build, "server", "cinfer-server")
    work = tempfile.mkdtemp(prefix="cinfer-tokenize-rate-")
    model = args.model
    if not model:
        model = os.path.join(work, "tiny.gguf")
        subprocess.run([os.path.join(args.build, "tools", "cinfer-mkmodel"),
                        "-o", model], check=True, stdout=subprocess.DEVNULL)
    crt, key = make_pki(work)
    ca = os.path.join(work, "ca.pem")
    keys = os.path.join(work, "keys.txt")
    with open(keys, "w") as f:
        f.write("%s bench\n" % hashlib.sha256(KEY.encode()).hexdigest())
    body = os.path.join(work, "tokenize.bin")
    with open(body, "wb") as f:
        f.write(tokenize_body(args.text))

    before = uptime()
    tls_flags = ["--tls-cert", crt, "--tls-key", key]
    key_flags = ["--api-keys", keys]
    auth = ["authorization: Bearer " + KEY
            if args.key_header == "authorization" else "x-api-key: " + KEY]
    # (name, TLS, key, flags): the baseline first, the measured one last.
    want = [("plaintext, no keys", False, False, []),
            ("TLS + API key", True, True, tls_flags + key_flags)]
    if args.split:
        want[1:1] = [("TLS only", True, False, tls_flags),
                     ("API key only", False, True, key_flags)]
    servers, configs, checks = [], [], {}
    try:
        for name, tls, k, flags in want:
            srv = Server(server_bin, model, work, "s%d" % len(servers), flags)
            servers.append(srv)
            url = "%s://127.0.0.1:%d%s" % ("https" if tls else "http",
                                            srv.port, TOKENIZE)
            configs.append((name, srv, url, auth if k else []))
            checks[name] = grpcurl_check(srv.port, tls, ca,
                                         auth[0] if k else None)
    except Exception:
        for srv in servers:
            srv.stop()
        raise
    rates = {c[0]: [] for c in configs}
    cpu_us = {c[0]: [] for c in configs}
    # Each run's rate (and CPU a call) over the plaintext run of the same
    # round: the machine's load drifts over minutes, and a ratio of runs
    # seconds apart is disturbed less than a ratio of medians.
    paired = {c[0]: [] for c in configs}
    paired_cpu = {c[0]: [] for c in configs}
    try:
        for name, srv, url, hdrs in configs:  # warm-up, not measured
            h2load(url, body, 1, args.clients, args.streams, hdrs)
        for rnd in range(args.rounds):
            # The order turns each round, so no configuration always
            # runs right after another.
            k = rnd % len(configs)
            order = configs[k:] + configs[:k]
            for name, srv, url, hdrs in order:
                c0 = srv.cpu_s()
                rate, done, ok, s2, data = h2load(
                    url, body, args.seconds, args.clients, args.streams, hdrs)
                cpu_us[name].append((srv.cpu_s() - c0) * 1e6 / max(done, 1))
                if done == 0 or ok != done or s2 != done or data < 5 * done:
                    raise RuntimeError("%s: %d done, %d succeeded, %d 2xx, "
                                       "%d data bytes" %
                                       (name, done, ok, s2, data))
                rates[name].append(rate)
                log("round %d %-20s %9.0f req/s (%d calls, %.1f us of "
                    "server CPU a call)" % (rnd + 1, name, rate, done,
                                            cpu_us[name][-1]))
            b, bc = rates[BASE][-1], cpu_us[BASE][-1]
            for name, _, _, _ in configs:
                paired[name].append(rates[name][-1] / b)
                paired_cpu[name].append(cpu_us[name][-1] / bc)
    finally:
        for srv in servers:
            srv.stop()
    after = uptime()

    med = {k: statistics.median(v) for k, v in rates.items()}
    pmed = {k: statistics.median(v) for k, v in paired.items()}
    ratio = pmed[BOTH]
    cpu = benchlib.cpu_info()
    lines = [
        "# Tokenize unary rate: TLS and API keys against plaintext",
        "",
        "`bench/tokenize_rate.py --rounds %d --seconds %d --clients %d "
        "--streams %d --key-header %s` at %s (commit %s)." % (
            args.rounds, args.seconds, args.clients, args.streams,
            args.key_header,
            datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%d %H:%M UTC"), git_commit()),
        "",
        "- machine: %s, %d CPUs (%s); %s" % (cpu["model"], cpu["cpus"],
                                              cpu["flags"],
                                              platform.platform()),
        "- load before: `%s`" % before,
        "- load after: `%s`" % after,
        "- OPENBLAS_CORETYPE: %s" % os.environ.get("OPENBLAS_CORETYPE",
                                                   "(unset)"),
        "- model: %s; text %r (%d bytes a message)" % (
            "the tiny random model" if not args.model else args.model,
            args.text, os.path.getsize(body)),
        "- h2load %s, one thread, %d connections x %d streams, %d s a run "
        "(a 1 s run first to warm each server up), on the same cores as "
        "the server; one run of "
        "each configuration a round, the order turning each round" % (
            h2load_version(), args.clients, args.streams, args.seconds),
        "- every call answered HTTP 200 with a message (DATA bytes >= 5 a "
        "call); one call each through grpcurl first: %s" % "; ".join(
            "%s %s" % (k, v) for k, v in checks.items()),
        "",
        "| configuration | runs (req/s) | median req/s | / plaintext, "
        "same round (median [quartiles]) | server CPU a call (median) | "
        "/ plaintext, same round |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    cmed = {k: statistics.median(v) for k, v in cpu_us.items()}
    for name, _, _, _ in configs:
        lines.append("| %s | %s | %.0f | %.3f [%s] | %.1f us | %.3f |" % (
            name, ", ".join("%.0f" % r for r in rates[name]), med[name],
            pmed[name], quartiles(paired[name]), cmed[name],
            statistics.median(paired_cpu[name])))
    lines += ["", "TLS + API key / plaintext: **%.3f** (%+.1f%%) in "
              "requests a second, the median of the %d rounds' ratios (the "
              "ratio of the medians: %.3f). The server's CPU time a call "
              "(from /proc) is the figure the other work on the machine "
              "disturbs least." %
              (ratio, (ratio - 1) * 100, args.rounds,
               med[BOTH] / med[BASE]), ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        path = benchlib.current_result(
            args.out, "tokenize-rate" + (
                "" if args.key_header == "authorization" else "-x-api-key"),
            [".md"])
        with open(path + ".md", "w") as f:
            f.write(text)
        log("wrote", path + ".md")
    shutil.rmtree(work, ignore_errors=True)


def h2load_version():
    r = subprocess.run(["h2load", "--version"], capture_output=True,
                       text=True)
    m = re.search(r"nghttp2/([\d.]+)", r.stdout + r.stderr)
    return m.group(1) if m else "?"


def git_commit():
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "?"


if __name__ == "__main__":
    main()
