"""Every place that starts Ray (the library's rollout engine, the tests' fixtures) leaves the dashboard
out: its web UI is not needed, its startup costs seconds and it listens on a port."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ray_init_calls() -> list[tuple[Path, ast.Call]]:
    calls = []
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "init"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "ray"):
                calls.append((path, node))
    return calls


def test_every_ray_init_leaves_the_dashboard_out():
    calls = ray_init_calls()
    places = {path.relative_to(ROOT).as_posix() for path, _ in calls}
    assert {"src/reasonrl/distributed/ray.py", "tests/integration/test_ray.py",
            "tests/integration/test_scale_train.py"} <= places  # not vacuous
    for path, call in calls:
        flags = {k.arg: k.value for k in call.keywords}
        value = flags.get("include_dashboard")
        assert isinstance(value, ast.Constant) and value.value is False, \
            f"{path.relative_to(ROOT)}:{call.lineno}: ray.init without include_dashboard=False"
