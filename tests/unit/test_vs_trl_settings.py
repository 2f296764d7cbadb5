"""benchmarks/vs_trl_settings.py sets both trainers alike on any transformers release: the checkpointing switch
by the name the installed TrainingArguments has, and reasonrl's own switch off to match."""

from dataclasses import dataclass

import transformers
from benchmarks import vs_trl_settings as vs_trl


def test_the_checkpointing_switch_is_named_as_the_installed_release_names_it():
    assert vs_trl.checkpointing_keyword() in transformers.TrainingArguments.__dataclass_fields__
    assert vs_trl.trl_config_kwargs(vs_trl.Settings(), "out")[vs_trl.checkpointing_keyword()] is False


def test_a_release_with_only_the_older_name_gets_the_older_name(monkeypatch):
    @dataclass
    class OlderTrainingArguments:  # as transformers 5.17: no activation_checkpointing field
        gradient_checkpointing: bool = False

    monkeypatch.setattr("transformers.TrainingArguments", OlderTrainingArguments)  # the module as imported now
    kwargs = vs_trl.trl_config_kwargs(vs_trl.Settings(), "out")
    assert kwargs["gradient_checkpointing"] is False and "activation_checkpointing" not in kwargs


def test_reasonrl_recomputes_nothing_as_trl_does(tmp_path):
    cfg = vs_trl.reasonrl_config(vs_trl.Settings(model="unused"), str(tmp_path))
    assert cfg.train.gradient_checkpointing == "off"
