"""The `reasonrl` command: `reasonrl train [CONFIG.toml] [section.key=value ...]`."""

from __future__ import annotations

import argparse
import sys

from reasonrl.config import ConfigError, describe_knobs, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reasonrl", description="RL for language models on verifiable tasks.")
    commands = parser.add_subparsers(dest="command", required=True)
    train_parser = commands.add_parser(
        "train", help="train a policy (no arguments: SmolLM2-135M-Instruct on the arithmetic task, on CPU)",
        description="Train a policy. Settings come from the defaults below, then CONFIG.toml, then "
                    "section.key=value overrides, e.g. `reasonrl train recipes/grpo.toml algo.clip_high=0.28 train.lr=2e-6`.",
        epilog="knobs (section.key, type, default, allowed values):\n" + describe_knobs(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    train_parser.add_argument("args", nargs="*", metavar="CONFIG.toml | section.key=value")
    args = parser.parse_args(argv)

    config_files = [a for a in args.args if "=" not in a]
    overrides = [a for a in args.args if "=" in a]
    if len(config_files) > 1:
        parser.error(f"one config file at most, got {config_files}")
    try:
        cfg = load_config(config_files[0] if config_files else None, overrides)
    except ConfigError as exc:
        print(f"reasonrl: config error: {exc}", file=sys.stderr)
        return 2

    from reasonrl.trainer import train  # heavy imports only once the config is known to be good

    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
