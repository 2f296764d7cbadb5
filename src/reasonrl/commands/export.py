"""`reasonrl export CHECKPOINT --out DIR`: a checkpoint's policy (or a LoRA run's adapters) as a model
other tools load, in bfloat16 by default, optionally uploaded to the hub (reasonrl.training.export)."""

from __future__ import annotations

import argparse
import sys

from reasonrl.training.checkpoint import CheckpointError
from reasonrl.training.export import DTYPES, ExportError, export_checkpoint, push_to_hub


def add_export_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export", help="write a checkpoint's policy as a model for transformers / vLLM / peft, optionally to the hub",
        description="Write the policy of CHECKPOINT (RUN_DIR/checkpoints/step_N, or a run directory: its newest) "
                    "to --out in --dtype, with its tokenizer and a model card; a LoRA run's policy merged, or its "
                    "adapters alone with --adapter. --push-to-hub uploads the result (needs network and a token).")
    parser.add_argument("checkpoint", help="a checkpoint directory, or a run directory (its newest checkpoint)")
    parser.add_argument("--out", required=True, help="the directory to write (new or empty)")
    parser.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES), help="the weights' dtype (default bfloat16)")
    parser.add_argument("--adapter", action="store_true", help="a LoRA run: its adapters alone, not the merged policy")
    parser.add_argument("--push-to-hub", default="", metavar="REPO", help="then upload it to the hub repository REPO "
                                                                         "(user/name; created when missing)")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")


def run_export_command(args: argparse.Namespace) -> int:
    try:
        out = export_checkpoint(args.checkpoint, args.out, dtype=args.dtype, adapter=args.adapter)
    except (ExportError, CheckpointError) as exc:
        print(f"reasonrl export: {exc}", file=sys.stderr)
        return 2
    print(f"exported: {out}")
    if args.push_to_hub:
        try:
            url = push_to_hub(out, args.push_to_hub, private=args.private)
        # No network, no token, no rights (the hub's errors are OSErrors), a bad repository id (ValueError):
        # the export is kept either way.
        except (OSError, ValueError) as exc:
            print(f"reasonrl export: the upload to {args.push_to_hub} failed ({type(exc).__name__}: {exc}); the export "
                  f"is in {out}. Uploading needs network access and a token (huggingface-cli login, or HF_TOKEN)",
                  file=sys.stderr)
            return 1
        print(f"uploaded: {url}")
    return 0
