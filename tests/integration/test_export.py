"""`reasonrl export`: a checkpoint's policy as a bfloat16 model that transformers loads (a LoRA run's
merged, or its adapters for peft), with its tokenizer and a model card; weights-only checkpoints
(run.save_optimizer=false) that still resume; the hub upload through huggingface_hub's API,
replaced here by a recording stand-in (no network)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from helpers import TASK, share_of_a, tiny_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl import train
from reasonrl.commands.cli import main
from reasonrl.training.checkpoint import CheckpointError, latest_checkpoint
from reasonrl.training.export import ExportError, export_checkpoint


@pytest.fixture(scope="module")
def full_run(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("export") / "full"
    train(tiny_config(tiny_model_dir, run, "train.steps=1"), task=TASK, reward=share_of_a)
    return run


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("export") / "lora"
    train(tiny_config(tiny_model_dir, run, "train.steps=1", "train.lora_rank=4"), task=TASK, reward=share_of_a)
    return run


def weights(model) -> dict[str, torch.Tensor]:
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def test_a_full_checkpoint_exports_as_bfloat16_weights_transformers_loads(full_run, tmp_path):
    out = export_checkpoint(full_run, tmp_path / "model")  # a run directory: its newest checkpoint
    exported = AutoModelForCausalLM.from_pretrained(out)
    trained = AutoModelForCausalLM.from_pretrained(latest_checkpoint(full_run) / "policy", dtype=torch.float32)
    assert exported.dtype == torch.bfloat16
    expected = weights(trained)
    for name, tensor in weights(exported).items():
        assert torch.equal(tensor, expected[name].to(torch.bfloat16)), name
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("ab").input_ids == AutoTokenizer.from_pretrained(latest_checkpoint(full_run) / "policy")("ab").input_ids
    card = (out / "README.md").read_text()
    assert "library_name: transformers" in card and "bfloat16" in card and "Trained with reasonrl from" in card
    # Half the float32 policy's bytes (the tokenizer files aside).
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    float32 = sum(p.stat().st_size for p in (latest_checkpoint(full_run) / "policy").glob("*.safetensors"))
    assert size < 0.55 * float32


def test_a_lora_checkpoint_exports_merged_or_as_adapters_peft_loads(lora_run, tiny_model_dir, tmp_path):
    from peft import PeftModel

    merged = AutoModelForCausalLM.from_pretrained(export_checkpoint(lora_run, tmp_path / "merged", dtype="float32"))
    adapter_dir = export_checkpoint(lora_run, tmp_path / "adapter", adapter=True)
    assert sorted(p.name for p in adapter_dir.iterdir() if p.name.startswith("adapter")) == \
        ["adapter_config.json", "adapter_model.safetensors"]
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir)
    rebuilt, base = weights(with_adapter.merge_and_unload()), weights(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    trained = 0.0
    for name, tensor in weights(merged).items():
        # The adapters were stored in bfloat16: the rebuilt merge is within that rounding of the update
        # (a relative 2^-8 of an update far below 1), tighter than the update the training made.
        torch.testing.assert_close(rebuilt[name], tensor, atol=1e-3, rtol=0)
        trained = max(trained, (tensor - base[name]).abs().max().item())
    assert trained > 1e-2  # the adapters moved the merged weights well past the tolerance
    assert "library_name: peft" in (adapter_dir / "README.md").read_text()


def test_what_cannot_be_exported_is_refused_with_the_reason(full_run, tmp_path):
    with pytest.raises(ExportError, match="holds no adapters: it is a full fine-tuning checkpoint"):
        export_checkpoint(full_run, tmp_path / "a", adapter=True)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("mine")
    with pytest.raises(ExportError, match="exists and is not an empty directory"):
        export_checkpoint(full_run, tmp_path / "taken")
    with pytest.raises(ExportError, match="neither a checkpoint"):
        export_checkpoint(tmp_path, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_damaged_checkpoint_is_not_exported(full_run, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(full_run, copy)
    weights_file = next((latest_checkpoint(copy) / "policy").glob("*.safetensors"))
    weights_file.write_bytes(weights_file.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match="is damaged, not exported"):
        export_checkpoint(copy, tmp_path / "model")


def test_weights_only_checkpoints_are_smaller_and_resume(tiny_model_dir, tmp_path, capsys):
    full = tmp_path / "full"
    light = tmp_path / "light"
    train(tiny_config(tiny_model_dir, full, "train.steps=1"), task=TASK, reward=share_of_a)
    train(tiny_config(tiny_model_dir, light, "train.steps=1", "run.save_optimizer=false"), task=TASK,
          reward=share_of_a)
    state = torch.load(latest_checkpoint(light) / "trainer_state.pt", weights_only=False)
    assert "optimizer" not in state["learner"] and state["optimizer_saved"] is False
    assert "optimizer" in torch.load(latest_checkpoint(full) / "trainer_state.pt", weights_only=False)["learner"]
    capsys.readouterr()
    result = train(tiny_config(tiny_model_dir, light, "train.steps=2", "run.save_optimizer=false", "run.resume=true"),
                   task=TASK, reward=share_of_a)
    assert result.steps == 2
    assert "holds no optimizer state" in capsys.readouterr().out


class RecordingHub:
    """Stands in for huggingface_hub.HfApi: records what would be sent."""

    calls: ClassVar[list] = []

    def __init__(self, token=None):
        self.token = token

    def create_repo(self, repo_id, private=False, exist_ok=False):
        self.calls.append(("create_repo", repo_id, private, exist_ok))

    def upload_folder(self, folder_path, repo_id, commit_message):
        from pathlib import Path

        self.calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))


def test_push_to_hub_creates_the_repository_and_uploads_the_export(full_run, tmp_path, monkeypatch, capsys):
    import huggingface_hub

    RecordingHub.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingHub)
    out = tmp_path / "model"
    assert main(["export", str(full_run), "--out", str(out), "--push-to-hub", "me/tiny", "--private"]) == 0
    assert RecordingHub.calls[0] == ("create_repo", "me/tiny", True, True)
    kind, repo, files = RecordingHub.calls[1]
    assert (kind, repo) == ("upload_folder", "me/tiny") and "README.md" in files and "config.json" in files
    assert "uploaded: https://huggingface.co/me/tiny" in capsys.readouterr().out

    def offline(self, *args, **kwargs):
        raise huggingface_hub.errors.OfflineModeIsEnabled("HF_HUB_OFFLINE=1")

    monkeypatch.setattr(RecordingHub, "create_repo", offline)
    assert main(["export", str(full_run), "--out", str(tmp_path / "again"), "--push-to-hub", "me/tiny"]) == 1
    err = capsys.readouterr().err
    assert "the upload to me/tiny failed (OfflineModeIsEnabled" in err and "needs network access and a token" in err
    assert (tmp_path / "again" / "config.json").is_file()  # the export is kept
