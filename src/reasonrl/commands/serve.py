"""`reasonrl serve MODEL`: a model behind the OpenAI-compatible API of reasonrl.serve, on loopback."""

from __future__ import annotations

import argparse

from reasonrl.models import load_model, load_tokenizer, pick_device, resolve_dtype
from reasonrl.rollout.hf import HFEngine
from reasonrl.serve import Server


def add_serve_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("serve", help="serve a model over an OpenAI-compatible API (loopback)")
    parser.add_argument("model", help="a hub id or a local model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=512, help="default max_tokens of a request")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="weights' dtype (auto: bfloat16 where the hardware has it)")


def run_serve_command(args: argparse.Namespace) -> int:
    device = pick_device("auto")
    engine = HFEngine(load_model(args.model, dtype=resolve_dtype(args.dtype, device), device=device),
                      load_tokenizer(args.model))
    server = Server(engine, args.model, host=args.host, port=args.port, default_max_tokens=args.max_tokens)
    print(f"serving {args.model} at {server.url} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.close()
    return 0
