"""dtype=auto on a CPU: bfloat16 where the CPU has bfloat16 matrix units, else float32, said at the start;
bfloat16 asked for on a CPU without them is emulated, and said to be."""

from __future__ import annotations

import pytest
import torch

from reasonrl import models
from reasonrl.models import cpu_dtype_note, resolve_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(("flags", "fast"), [("fpu avx2 fma", False), ("avx2 avx512f avx512_bf16", True),
                                             ("avx2 amx_bf16 amx_tile", True), ("avx512f avx512bw", False)])
def test_bfloat16_is_chosen_by_the_cpus_flags(monkeypatch, tmp_path, flags, fast):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    real_path = models.Path
    monkeypatch.setattr(models, "Path", lambda p: real_path(cpuinfo) if p == "/proc/cpuinfo" else real_path(p))
    assert models.has_fast_bf16(CPU) is fast
    assert resolve_dtype("auto", CPU) == (torch.bfloat16 if fast else torch.float32)
    assert resolve_dtype("float32", CPU) == torch.float32
    note = cpu_dtype_note(CPU, {"train.dtype": "auto", "rollout.dtype": "auto"})
    assert (note is None) is fast
    if note is not None:
        assert "float32" in note and "troubleshooting" in note


def note(device: torch.device, train: str, rollout: str) -> str | None:
    return cpu_dtype_note(device, {"train.dtype": train, "rollout.dtype": rollout})


def test_auto_is_noted_on_a_cpu_only(monkeypatch):
    monkeypatch.setattr(models, "has_fast_bf16", lambda device: False)
    assert "float32" in note(CPU, "auto", "float32")  # one of train.dtype / rollout.dtype
    assert note(CPU, "float32", "float32") is None  # float32 asked for: nothing to warn of
    assert note(CUDA, "auto", "auto") is None


def test_bfloat16_asked_for_on_a_cpu_without_its_units_is_named_as_emulated(monkeypatch):
    monkeypatch.setattr(models, "has_fast_bf16", lambda device: False)
    both = note(CPU, "bfloat16", "bfloat16")
    assert "train.dtype=bfloat16 and rollout.dtype=bfloat16 run emulated" in both
    assert "rollout.dtype=bfloat16 runs emulated" in note(CPU, "auto", "bfloat16")  # before auto's notice
    assert "train.dtype" not in note(CPU, "auto", "bfloat16")
    assert note(CUDA, "bfloat16", "bfloat16") is None
    monkeypatch.setattr(models, "has_fast_bf16", lambda device: True)
    assert note(CPU, "bfloat16", "bfloat16") is None  # native there
