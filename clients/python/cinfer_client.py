#!/usr/bin/env python3
"""cinfer_client.py - example Python client of cinfer-server.

Stubs are generated from the repository's protos with grpcio-tools at run
time (into --stubs-dir, or a temporary directory), so nothing generated is
committed:

    pip install grpcio grpcio-tools
    python3 clients/python/cinfer_client.py --server 127.0.0.1:50051 \\
        generate --prompt "Once upon a time" --max-tokens 32 --temperature 0

Commands: generate (text printed as it streams, then a newline), tokenize,
info, health. Exit status: 0 on success, else the gRPC status code.

Use as a library:

    from cinfer_client import load_stubs
    pb, rpc = load_stubs()
    stub = rpc.InferenceStub(grpc.insecure_channel("127.0.0.1:50051"))
    for resp in stub.Generate(pb.GenerateRequest(text="Hi")): ...
"""
import argparse
import importlib
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))


def generate_stubs(out_dir, proto_dir=PROTO_DIR):
    """Runs grpcio-tools' protoc on the service and health protos."""
    from grpc_tools import protoc
    import grpc_tools

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    files = ["cinfer/v1/cinfer.proto", "grpc/health/v1/health.proto"]
    args = ["protoc", "-I" + proto_dir, "-I" + well_known,
            "--python_out=" + out_dir, "--grpc_python_out=" + out_dir] + files
    if protoc.main(args) != 0:
        raise RuntimeError("grpc_tools.protoc failed on " + " ".join(files))
    # cinfer/ and cinfer/v1/ become packages. grpc/health/v1/ must not:
    # a package named "grpc" would shadow grpcio (load_health_stubs loads
    # those modules by path).
    for d in ("cinfer", os.path.join("cinfer", "v1")):
        init = os.path.join(out_dir, d, "__init__.py")
        if not os.path.exists(init):
            open(init, "w").close()


def load_stubs(stubs_dir=None):
    """Returns (cinfer_pb2, cinfer_pb2_grpc), generating them if needed.

    The health modules come from load_health_stubs(stubs_dir). The
    directory is put first on sys.path; generation happens once per
    directory.
    """
    if stubs_dir is None:
        stubs_dir = os.environ.get("CINFER_PY_STUBS") or tempfile.mkdtemp(
            prefix="cinfer-stubs-")
    os.makedirs(stubs_dir, exist_ok=True)
    marker = os.path.join(stubs_dir, "cinfer", "v1", "cinfer_pb2_grpc.py")
    if not os.path.exists(marker):
        generate_stubs(stubs_dir)
    # grpcio first, so the generated grpc/health/ directory can never be
    # mistaken for it.
    import grpc  # noqa: F401
    if stubs_dir not in sys.path:
        sys.path.insert(0, stubs_dir)
    pb = importlib.import_module("cinfer.v1.cinfer_pb2")
    rpc = importlib.import_module("cinfer.v1.cinfer_pb2_grpc")
    return pb, rpc


def load_health_stubs(stubs_dir):
    """(health_pb2, health_pb2_grpc) from a directory load_stubs filled.

    The generated modules are named grpc.health.v1.*, inside grpcio's own
    package name, so they are loaded by path and registered under that name
    (with stand-in parent modules) for their imports to resolve.
    """
    import importlib.util
    import types

    import grpc

    if not hasattr(grpc, "health"):
        grpc.health = types.ModuleType("grpc.health")
        sys.modules.setdefault("grpc.health", grpc.health)
    if not hasattr(grpc.health, "v1"):
        grpc.health.v1 = types.ModuleType("grpc.health.v1")
        sys.modules.setdefault("grpc.health.v1", grpc.health.v1)
    mods = []
    base = os.path.join(stubs_dir, "grpc", "health", "v1")
    for name in ("health_pb2", "health_pb2_grpc"):
        full = "grpc.health.v1." + name
        if full not in sys.modules:
            spec = importlib.util.spec_from_file_location(
                full, os.path.join(base, name + ".py"))
            mod = importlib.util.module_from_spec(spec)
            sys.modules[full] = mod
            setattr(grpc.health.v1, name, mod)
            spec.loader.exec_module(mod)
        mods.append(sys.modules[full])
    return mods[0], mods[1]


def build_generate_request(pb, args, prompt):
    req = pb.GenerateRequest()
    if args.request_id:
        req.request_id = args.request_id
    if args.chat:
        if args.system:
            req.chat.messages.add(role="system", content=args.system)
        req.chat.messages.add(role="user", content=prompt)
    else:
        req.text = prompt
    s = req.sampling
    for field in ("temperature", "top_k", "top_p", "min_p",
                  "repetition_penalty", "presence_penalty",
                  "frequency_penalty", "seed"):
        v = getattr(args, field)
        if v is not None:
            setattr(s, field, v)
    if args.max_tokens is not None:
        req.stopping.max_tokens = args.max_tokens
    for stop in args.stop or []:
        req.stopping.stop.append(stop)
    if args.ignore_eos:
        req.stopping.ignore_eos = True
    if args.logprobs is not None:
        req.logprobs = args.logprobs
    return req


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=os.environ.get("CINFER_SERVER",
                                                       "127.0.0.1:50051"))
    ap.add_argument("--stubs-dir", default=None,
                    help="where to generate/find the stubs")
    ap.add_argument("--timeout", type=float, default=None,
                    help="call deadline in seconds")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("-p", "--prompt")
    g.add_argument("--chat", action="store_true")
    g.add_argument("--system")
    g.add_argument("-n", "--max-tokens", type=int)
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-k", type=int)
    g.add_argument("--top-p", type=float)
    g.add_argument("--min-p", type=float)
    g.add_argument("--repetition-penalty", type=float)
    g.add_argument("--presence-penalty", type=float)
    g.add_argument("--frequency-penalty", type=float)
    g.add_argument("--seed", type=int)
    g.add_argument("--stop", action="append")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--logprobs", type=int)
    g.add_argument("--request-id")
    g.add_argument("-v", "--verbose", action="store_true")
    t = sub.add_parser("tokenize")
    t.add_argument("-p", "--prompt")
    sub.add_parser("info")
    h = sub.add_parser("health")
    h.add_argument("--service", default="")
    args = ap.parse_args(argv)

    stubs_dir = args.stubs_dir or os.environ.get("CINFER_PY_STUBS") or \
        tempfile.mkdtemp(prefix="cinfer-stubs-")
    pb, rpc = load_stubs(stubs_dir)
    import grpc
    from google.protobuf import json_format

    channel = grpc.insecure_channel(args.server)
    stub = rpc.InferenceStub(channel)
    try:
        if args.cmd == "generate":
            prompt = args.prompt if args.prompt is not None \
                else sys.stdin.read()
            req = build_generate_request(pb, args, prompt)
            final = None
            for resp in stub.Generate(req, timeout=args.timeout):
                if resp.HasField("chunk"):
                    sys.stdout.write(resp.chunk.text)
                    sys.stdout.flush()
                elif resp.HasField("final"):
                    final = resp.final
            sys.stdout.write("\n")
            sys.stdout.flush()
            if final is None:
                print("cinfer_client: no final message", file=sys.stderr)
                return 13
            if args.verbose:
                print(json_format.MessageToJson(final, indent=None),
                      file=sys.stderr)
        elif args.cmd == "tokenize":
            prompt = args.prompt if args.prompt is not None \
                else sys.stdin.read()
            resp = stub.Tokenize(pb.TokenizeRequest(text=prompt),
                                 timeout=args.timeout)
            print(" ".join(str(i) for i in resp.token_ids))
        elif args.cmd == "info":
            resp = stub.GetModelInfo(pb.GetModelInfoRequest(),
                                     timeout=args.timeout)
            print(json_format.MessageToJson(resp))
        elif args.cmd == "health":
            hpb, hrpc = load_health_stubs(stubs_dir)
            resp = hrpc.HealthStub(channel).Check(
                hpb.HealthCheckRequest(service=args.service),
                timeout=args.timeout)
            print(hpb.HealthCheckResponse.ServingStatus.Name(resp.status))
            return 0 if resp.status == hpb.HealthCheckResponse.SERVING else 20
    except grpc.RpcError as e:
        sys.stdout.flush()
        print("cinfer_client: %s: %s" % (e.code().name, e.details()),
              file=sys.stderr)
        return e.code().value[0]
    finally:
        channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
