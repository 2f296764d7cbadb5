"""What identifies the model of an evaluation (reasonrl.eval.identity): a local directory by its
path and its files' sizes and modification times, a hub id by the commit of its cached copy; the
cache keys change with the model and with how it decodes, the refusal only with the model."""

from __future__ import annotations

import os

from reasonrl.eval.identity import ModelIdentity, hub_source, local_source


def test_a_local_model_is_its_path_and_its_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / ".cache").mkdir()
    source = local_source(tmp_path)
    assert source["path"] == str(tmp_path.resolve())
    assert sorted(source["files"]) == ["config.json", "model.safetensors"]
    assert source["files"]["model.safetensors"][0] == len(b"weights")
    os.utime(tmp_path / "model.safetensors", ns=(1, 1))  # rewritten: same size, another time
    assert local_source(tmp_path) != source


def test_a_hub_model_is_its_id_and_the_commit_of_its_cached_copy(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert hub_source("org/model") == {"hub_id": "org/model", "revision": None}
    repo = tmp_path / "models--org--model"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert hub_source("org/model") == {"hub_id": "org/model", "revision": "abc123"}


def test_the_keys_follow_the_model_how_it_decodes_and_the_prm():
    model = ModelIdentity("m", {"hub_id": "org/model", "revision": "abc"}, {"dtype": "bfloat16"})
    assert model.key() == ModelIdentity("other name", model.source, model.engine).key()
    assert model.key() != ModelIdentity("m", {"hub_id": "org/model", "revision": "def"}, model.engine).key()
    assert model.key() != ModelIdentity("m", model.source, {"dtype": "float32"}).key()
    with_prm = ModelIdentity("m", model.source, model.engine, prm={"path": "/prm", "files": {}})
    assert with_prm.key() == model.key() and with_prm.beam_key() != model.beam_key()
