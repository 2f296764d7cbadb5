"""dtype=auto on a CPU: bfloat16 where the CPU has bfloat16 matrix units, else float32, said at the start."""

from __future__ import annotations

import pytest
import torch

from reasonrl import models
from reasonrl.models import float32_cpu_note, resolve_dtype

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
    note = float32_cpu_note(CPU, "auto", "auto")
    assert (note is None) is fast
    if note is not None:
        assert "float32" in note and "troubleshooting" in note


def test_the_note_is_for_auto_on_a_cpu_only(monkeypatch):
    monkeypatch.setattr(models, "has_fast_bf16", lambda device: False)
    assert float32_cpu_note(CPU, "auto", "float32") is not None  # one of train.dtype / rollout.dtype
    assert float32_cpu_note(CPU, "float32", "float32") is None  # float32 asked for: nothing to warn of
    assert float32_cpu_note(CPU, "bfloat16", "bfloat16") is None  # asked for: the user chose it
    assert float32_cpu_note(CUDA, "auto", "auto") is None
