"""The installable product: a wheel built with `python -m build` holds the recipes and the benchmark
data, and once installed into a fresh virtual environment `reasonrl recipes`, a one-step
`reasonrl train` of a recipe and `reasonrl eval MODEL --task gsm8k` work from a directory outside
the repository (nothing read from the source tree, nothing downloaded).

The fresh environment gets the wheel alone (`--no-deps`); its dependencies (torch, transformers,
...) are those of the environment running the tests, reached through a .pth file, so nothing big
is installed again."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("build")

REPO = Path(__file__).resolve().parents[2]


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def clean_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH into the source tree, no data directory."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REASONRL_DATA", "REASONRL_RECIPES")}
    return env | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "HOME": str(tmp_path / "home")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fresh environment's bin directory, the wheel), built from a copy of the project files."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env = clean_env(tmp)
    # --no-isolation: the build uses this environment's setuptools instead of downloading one.
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp / "dist")], source, env)
    (wheel,) = (tmp / "dist").glob("reasonrl-*.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp, env)
    bin_dir = venv / "bin"
    run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], tmp, env)
    # The dependencies: this environment's site-packages, after the fresh one's (a .pth line only
    # appends a directory; .pth files in it, such as an editable install of reasonrl, are not run).
    parents = [p for p in [*site.getsitepackages(), sysconfig.get_paths()["purelib"]] if Path(p).is_dir()]
    purelib = run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  tmp, env).strip()
    (Path(purelib) / "reasonrl_test_dependencies.pth").write_text("\n".join(dict.fromkeys(parents)) + "\n")
    return bin_dir, wheel


def test_the_wheel_holds_the_recipes_and_the_data(installed):
    _, wheel = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    recipes = {Path(n).name for n in names if n.startswith("reasonrl/recipes/") and n.endswith(".toml")}
    assert recipes == {p.name for p in (REPO / "src" / "reasonrl" / "recipes").glob("*.toml")} and "grpo.toml" in recipes
    data = {n for n in names if n.startswith("reasonrl/data/")}
    assert {"reasonrl/data/README.md", "reasonrl/data/gsm8k/LICENSE", "reasonrl/data/gsm8k/train.jsonl.gz",
            "reasonrl/data/gsm8k/test.jsonl.gz", "reasonrl/data/math500/test.jsonl.gz",
            "reasonrl/data/aime24/test.jsonl.gz", "reasonrl/data/amc23/test.jsonl.gz",
            "reasonrl/data/minerva_math/test.jsonl.gz"} <= data
    assert not any(n.startswith(("share/", "reasonrl-0.1.0.data/")) for n in names)  # no data files outside the package
    assert wheel.stat().st_size < 4_000_000
    # The data's terms travel in the metadata with the code's licence (PEP 639).
    metadata = zipfile.ZipFile(wheel).read("reasonrl-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0 AND MIT AND CC-BY-NC-SA-4.0" in metadata
    assert {"License-File: LICENSE", "License-File: src/reasonrl/data/README.md",
            "License-File: src/reasonrl/data/gsm8k/LICENSE"} <= set(metadata.splitlines())


def test_installed_wheel_lists_recipes_trains_and_evaluates_outside_the_repository(installed, tiny_model_dir,
                                                                                    tmp_path):
    bin_dir, _ = installed
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = clean_env(tmp_path)
    where = run([str(bin_dir / "python"), "-c", "import reasonrl; print(reasonrl.__file__)"], work, env)
    assert where.startswith(str(bin_dir.parent)) and not where.startswith(str(REPO))

    listing = run([str(bin_dir / "reasonrl"), "recipes"], work, env)
    assert "grpo" in listing and "dapo" in listing and str(bin_dir.parent) in listing

    run([str(bin_dir / "reasonrl"), "train", "grpo", f"model.name={tiny_model_dir}", "task.name=gsm8k",
         "train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
         "eval.problems=0", "run.dir=run", "run.progress=false", "run.tensorboard=false"], work, env)
    metrics = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and "reward/mean" in metrics[0]
    rollouts = [json.loads(line) for line in (work / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert all(r["problem_id"].startswith("gsm8k-train-") for r in rollouts)  # the packaged training split
    assert (work / "run" / "checkpoints").is_dir()

    run([str(bin_dir / "reasonrl"), "eval", str(tiny_model_dir), "--task", "gsm8k", "--limit", "2", "--n", "1",
         "--max-new-tokens", "4", "--out", "eval", "--no-progress"], work, env)
    results = json.loads((work / "eval" / "results.json").read_text())
    assert results["tasks"]["gsm8k"]["problems"] == 2
