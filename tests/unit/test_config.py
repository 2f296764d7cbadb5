"""Config: defaults, TOML file + `section.key=value` overrides, validation messages, save/load; a
config file that cannot be read (not UTF-8, nested deeper than tomllib can parse) is a ConfigError
naming the file, and `reasonrl eval --config` says so in one line."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from reasonrl.commands.cli import main
from reasonrl.config import (
    DEFAULT_MODEL,
    Config,
    ConfigError,
    build_config,
    describe_knobs,
    load_config,
)


def test_defaults():
    cfg = Config()
    assert cfg.model.name == DEFAULT_MODEL
    assert cfg.task.name == "arithmetic"
    assert (cfg.task.train_size, cfg.task.test_size, cfg.task.digits, cfg.task.operands) == (5000, 200, 2, 2)
    assert cfg.rollout.group_size == 8 and cfg.rollout.stop == ()
    assert (cfg.algo.advantage, cfg.algo.objective, cfg.algo.aggregation) == ("grpo", "ppo_clip", "token_mean")
    assert (cfg.algo.clip_low, cfg.algo.clip_high, cfg.algo.kl_coef, cfg.algo.kl_estimator) == (0.2, 0.2, 0.0, "k3")
    assert cfg.train.lr == 5e-6 and cfg.run.seed == 0
    # nothing given: exactly the defaults
    assert load_config() == cfg
    assert build_config({}) == cfg


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().train.lr = 1.0  # type: ignore[misc]


def test_toml_file_then_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[train]\nlr = 1e-4\nsteps = 5\n\n[rollout]\ngroup_size = 4\ntemperature = 1\n'
                    '\n[model]\nname = "from-file"\n')
    cfg = load_config(path)
    assert (cfg.train.lr, cfg.train.steps, cfg.rollout.group_size, cfg.model.name) == (1e-4, 5, 4, "from-file")
    assert isinstance(cfg.rollout.temperature, float) and cfg.rollout.temperature == 1.0  # int 1 -> float
    assert cfg.train.micro_batch_size == 8  # untouched keys keep their defaults

    cfg = load_config(str(path), ["train.lr=2e-6", "model.name=cli-model", "eval.every=3"])
    assert cfg.train.lr == 2e-6  # CLI wins over the file
    assert cfg.model.name == "cli-model"
    assert cfg.train.steps == 5 and cfg.rollout.group_size == 4  # the file's other keys survive
    assert cfg.eval.every == 3


def test_later_override_wins():
    assert load_config(None, ["train.steps=1", "train.steps=9"]).train.steps == 9


@pytest.mark.parametrize(
    ("override", "section", "key", "expected"),
    [
        ("train.lr=2e-6", "train", "lr", 2e-6),
        ("train.lr=1", "train", "lr", 1.0),
        ("train.steps=7", "train", "steps", 7),
        (" train.steps = 7 ", "train", "steps", 7),
        ("run.resume=true", "run", "resume", "latest"),
        ("eval.greedy=false", "eval", "greedy", False),
        ('rollout.stop=["</answer>"]', "rollout", "stop", ("</answer>",)),
        ('rollout.stop=["a", "b"]', "rollout", "stop", ("a", "b")),
        ("rollout.stop=</answer>", "rollout", "stop", ("</answer>",)),
        ("rollout.stop=[]", "rollout", "stop", ()),
        ("model.name=Qwen/Qwen2.5-0.5B-Instruct", "model", "name", "Qwen/Qwen2.5-0.5B-Instruct"),
        ('model.name="quoted name"', "model", "name", "quoted name"),
        ("run.dir=runs/exp 1", "run", "dir", "runs/exp 1"),
        ("task.prompt_template={prompt}?", "task", "prompt_template", "{prompt}?"),
        ("reward.custom=reasonrl.rewards.format:has_boxed", "reward", "custom", "reasonrl.rewards.format:has_boxed"),
    ],
)
def test_override_parsing(override, section, key, expected):
    value = getattr(getattr(load_config(None, [override]), section), key)
    assert value == expected
    assert type(value) is type(expected)


def test_unknown_section():
    with pytest.raises(ConfigError, match="unknown config section 'trainer'") as info:
        load_config(None, ["trainer.lr=1"])
    assert "train" in str(info.value) and "rollout" in str(info.value)  # lists the sections


def test_unknown_section_in_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[optim]\nlr = 1\n")
    with pytest.raises(ConfigError, match="optim"):
        load_config(path)


def test_unknown_key_names_it_and_lists_the_section_keys():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["train.learning_rate=1e-5"])
    message = str(info.value)
    assert "train.learning_rate" in message
    for key in ("steps", "lr", "grad_clip", "micro_batch_size"):
        assert key in message
    assert "group_size" not in message  # only [train]'s keys


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.steps=abc", "train.steps"),
        ("train.steps=1.5", "train.steps"),
        ("train.steps=true", "train.steps"),  # a bool is not an int
        ("train.lr=fast", "train.lr"),
        ("train.lr=false", "train.lr"),
        ("run.tensorboard=yes", "run.tensorboard"),
        ("run.resume=1", "run.resume"),
        ("model.name=3", "model.name"),
        ("rollout.stop=[1, 2]", "rollout.stop"),
    ],
)
def test_wrong_type_names_the_key(override, key):
    with pytest.raises(ConfigError, match=f"^{key}: expected"):
        load_config(None, [override])


def test_wrong_type_in_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[rollout]\ngroup_size = "eight"\n')
    with pytest.raises(ConfigError, match="rollout.group_size: expected int"):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.steps=-1", "train.steps: -1 is below its minimum 0"),
        ("rollout.group_size=0", "rollout.group_size: 0 is below its minimum 1"),
        ("rollout.top_p=1.5", "rollout.top_p: 1.5 is above its maximum 1.0"),
        ("task.digits=13", "task.digits: 13 is above its maximum 12"),
        ("algo.clip_low=-0.1", "algo.clip_low: -0.1 is below its minimum 0.0"),
    ],
)
def test_out_of_range(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value) == message


@pytest.mark.parametrize("override", ["rollout.top_p=1.0", "rollout.top_p=0", "task.digits=12", "train.steps=0"])
def test_range_bounds_are_inclusive(override):
    load_config(None, [override])


@pytest.mark.parametrize("override", ["train.lr=nan", "rollout.top_p=nan"])
def test_nan_is_rejected(override):
    with pytest.raises(ConfigError):
        load_config(None, [override])


def test_choice_not_allowed_lists_the_choices():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["algo.kl_estimator=k4"])
    message = str(info.value)
    assert message.startswith("algo.kl_estimator: 'k4' is not allowed")
    assert "k1, k2, k3" in message
    assert "package.module" not in message  # kl_estimator is not extensible

    with pytest.raises(ConfigError, match=r"rollout.dtype: 'fp8'.*auto, float32, bfloat16, float16"):
        load_config(None, ["rollout.dtype=fp8"])


def test_extensible_choices_accept_an_import_path():
    paths = ("reasonrl.algo.advantages:rloo", "reasonrl.algo.objectives:cispo", "reasonrl.algo.aggregation:token_mean")
    cfg = load_config(None, [f"algo.advantage={paths[0]}", f"algo.objective={paths[1]}",
                             f"algo.aggregation={paths[2]}"])
    assert (cfg.algo.advantage, cfg.algo.objective, cfg.algo.aggregation) == paths
    # the path is imported when the config loads: a missing module stops it before anything is built
    with pytest.raises(ConfigError, match="algo.advantage='my_pkg.adv:rloo': cannot import module 'my_pkg.adv'"):
        load_config(None, ["algo.advantage=my_pkg.adv:rloo"])
    # a plain unknown name is still refused, and the message says an import path would do
    with pytest.raises(ConfigError, match=r"algo.advantage: 'rlooo' is not allowed; allowed: grpo.*package.module"):
        load_config(None, ["algo.advantage=rlooo"])
    # a non-extensible choice refuses import paths
    with pytest.raises(ConfigError, match="algo.kl_estimator"):
        load_config(None, ["algo.kl_estimator=my_pkg.kl:k9"])


def test_gradient_checkpointing_takes_its_modes_and_the_booleans_it_used_to(tmp_path):
    assert load_config(None, []).train.gradient_checkpointing == "auto"
    assert load_config(None, ["train.gradient_checkpointing=selective"]).train.gradient_checkpointing == "selective"
    # A run directory saved before the modes existed holds a boolean: true meant full, false off.
    assert load_config(None, ["train.gradient_checkpointing=true"]).train.gradient_checkpointing == "full"
    old = tmp_path / "old.toml"
    old.write_text("[train]\ngradient_checkpointing = false\n")
    assert load_config(old, []).train.gradient_checkpointing == "off"
    with pytest.raises(ConfigError, match="expected str, got 1"):  # 1 is not taken for true
        load_config(None, ["train.gradient_checkpointing=1"])
    with pytest.raises(ConfigError, match="'partial' is not allowed; allowed: auto, off, selective, full"):
        load_config(None, ["train.gradient_checkpointing=partial"])


@pytest.mark.parametrize("override", ["sampling.dynamic=true", "sampling.replay=2", "sampling.problems=band",
                                      "sampling.problems=pass_rate", "sampling.adaptive_budget=true",
                                      "guidance.mode=mixed", "prime.enabled=true"])
def test_a_label_free_reward_refuses_what_selects_by_the_gold_answers(override):
    # majority_vote logs the gold check as "correct" (weight 0); these would read it to choose or label samples.
    label_free = ["reward.verifier=majority_vote", "reward.format_weight=0", "sampling.mask_truncated=false"]
    with pytest.raises(ConfigError, match="majority_vote learns without gold answers"):
        load_config(None, [*label_free, override])
    assert load_config(None, [*label_free, "sampling.dynamic=true", "sampling.dynamic_keep=reward"]).sampling.dynamic


def test_k1_in_the_loss_is_refused_with_the_reason():
    # d/dtheta (logp - ref_logp) = grad logp, whose expectation under the policy's samples is 0.
    with pytest.raises(ConfigError, match="k1 in the loss has zero expected gradient"):
        load_config(None, ["algo.kl_coef=0.1", "algo.kl_estimator=k1"])
    assert load_config(None, ["algo.kl_coef=0.1", "algo.kl_estimator=k1", "algo.kl_in=reward"]).algo.kl_estimator == "k1"
    # no penalty: the estimator has no effect, which is refused as any knob that does nothing
    with pytest.raises(ConfigError, match="algo.kl_estimator='k1' has no effect: .* only when algo.kl_coef > 0"):
        load_config(None, ["algo.kl_estimator=k1"])


def test_every_reward_extract_choice_is_a_registered_extractor():
    # the config must never accept a name the reward then refuses
    from reasonrl.rewards import EXTRACTORS

    spec = {f.name: f for f in dataclasses.fields(Config().reward)}["extract"]
    assert set(spec.metadata["choices"]) <= set(EXTRACTORS)
    for name in spec.metadata["choices"]:
        assert load_config(None, [f"reward.extract={name}"]).reward.extract == name


def test_reward_extract_choices_match_the_extractor_registry():
    from reasonrl.rewards import EXTRACTORS

    assert load_config(None, ["reward.extract=answer_phrase"]).reward.extract == "answer_phrase"
    spec = {f.name: f for f in dataclasses.fields(Config().reward)}["extract"]
    assert set(spec.metadata["choices"]) == set(EXTRACTORS)


def test_reward_format_style_choices_match_the_format_registry():
    from reasonrl.rewards.format import FORMAT_CHECKS

    spec = {f.name: f for f in dataclasses.fields(Config().reward)}["format_style"]
    assert set(spec.metadata["choices"]) == set(FORMAT_CHECKS)


@pytest.mark.parametrize("override", ["train.lr", "lr=1e-5", "train.=1", "=1", ""])
def test_malformed_override(override):
    with pytest.raises(ConfigError, match="bad override.*expected section.key=value"):
        load_config(None, [override])


def test_override_with_empty_section():
    with pytest.raises(ConfigError, match="unknown config section ''"):
        load_config(None, [".lr=1"])


def test_config_file_not_found(tmp_path):
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_config(tmp_path / "missing.toml")
    assert "missing.toml" in str(info.value)


def test_config_path_is_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path)


def test_invalid_toml(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[train\nlr = \n")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        load_config(path)


def test_section_that_is_not_a_table(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('model = "x"\n')
    with pytest.raises(ConfigError, match="model: expected a table"):
        load_config(path)


def test_save_then_load_round_trips(tmp_path):
    cfg = load_config(None, [
        "train.lr=3e-6", 'rollout.stop=["</answer>", "\\n\\n"]', "run.resume=true", "algo.clip_high=0.28",
        "algo.advantage=reasonrl.algo.advantages:rloo", "task.prompt_template={prompt} -- box it: \\boxed{{}}",
        "rollout.temperature=0", "model.name=Qwen/Qwen2.5-0.5B-Instruct",
    ])
    assert cfg.rollout.stop == ("</answer>", "\n\n")
    path = tmp_path / "saved.toml"
    cfg.save(path)
    assert load_config(path) == cfg
    # the saved file is plain TOML holding every section and key
    data = tomllib.loads(path.read_text())
    assert set(data) == {f.name for f in dataclasses.fields(Config)}
    assert set(data["train"]) == {f.name for f in dataclasses.fields(cfg.train)}
    assert data["rollout"]["stop"] == ["</answer>", "\n\n"]


def test_default_config_round_trips(tmp_path):
    Config().save(tmp_path / "c.toml")
    assert load_config(tmp_path / "c.toml") == Config()


def test_to_dict_is_plain_data():
    data = Config().to_dict()
    assert data["rollout"]["stop"] == []
    assert data["algo"]["clip_low"] == 0.2
    assert build_config(data) == Config()


def test_describe_knobs_mentions_every_field_with_its_doc():
    text = describe_knobs()
    for section in dataclasses.fields(Config):
        assert f"[{section.name}]" in text
        for spec in dataclasses.fields(section.default_factory):
            assert f"{section.name}.{spec.name} (" in text
            assert spec.metadata["doc"] in text
    assert "{k1|k2|k3}" in text  # choices are shown


def test_jsonl_task_needs_a_train_path():
    with pytest.raises(ConfigError, match="task.train_path"):
        load_config(None, ["task.name=jsonl"])
    cfg = load_config(None, ["task.name=jsonl", "task.train_path=data/train.jsonl"])
    assert cfg.task.train_path == "data/train.jsonl"


def test_humaneval_task_needs_the_code_verifier():
    with pytest.raises(ConfigError, match="reward.verifier=code"):
        load_config(overrides=["task.name=humaneval"])
    assert load_config(overrides=["task.name=humaneval", "reward.verifier=code"]).task.name == "humaneval"


def test_sampling_stages_are_checked_when_the_config_loads():
    with pytest.raises(ConfigError, match="sampling.stages: stage '3 max_new_tokens=4'"):
        load_config(overrides=["sampling.stages=['3 max_new_tokens=4']"])
    # the length rewards measure each stage's groups against that stage's budget: they may be combined
    assert load_config(overrides=["sampling.stages=['3: max_new_tokens=4']", "reward.overlong_buffer=2"])
    with pytest.raises(ConfigError, match="reward.overlong_buffer=8 is longer than the generation budget of the "
                                          "stage at step 3 .4."):
        load_config(overrides=["sampling.stages=['3: max_new_tokens=4']", "reward.overlong_buffer=8"])
    with pytest.raises(ConfigError, match="band_low"):
        load_config(overrides=["sampling.band_low=0.9", "sampling.band_high=0.5"])


def test_the_overlong_buffer_must_fit_in_the_length_limit():
    with pytest.raises(ConfigError, match=r"reward.overlong_buffer=16 is longer than the generation budget of "
                                          r"rollout.max_new_tokens \(8\)"):
        load_config(overrides=["reward.overlong_buffer=16", "rollout.max_new_tokens=8"])
    assert load_config(overrides=["reward.overlong_buffer=8", "rollout.max_new_tokens=8"]).reward.overlong_buffer == 8


def test_mini_batches_larger_than_rollout_batch():
    # 1 prompt x 2 samples = 2 sequences cannot be split into 3 mini-batches
    with pytest.raises(ConfigError, match="train.mini_batches"):
        load_config(None, ["rollout.prompts_per_step=1", "rollout.group_size=2", "train.mini_batches=3"])
    load_config(None, ["rollout.prompts_per_step=1", "rollout.group_size=2", "train.mini_batches=2"])


def test_a_boolean_takes_pythons_spelling_on_the_command_line_and_nothing_looser():
    from reasonrl.config import ConfigError, load_config

    assert load_config(overrides=["eval.before=False"]).eval.before is False
    assert load_config(overrides=["eval.before=True"]).eval.before is True
    assert load_config(overrides=["eval.before=false"]).eval.before is False
    for loose in ("no", "0", "FALSE"):
        with pytest.raises(ConfigError, match="eval.before: expected bool"):
            load_config(overrides=[f"eval.before={loose}"])


UNREADABLE = [
    (b"[train]\nsteps = 3\n# r\xe9sum\xe9 in Latin-1\n", "not UTF-8 text (line 3)"),
    (b"[task]\nname = " + b"[" * 5000 + b"]" * 5000 + b"\n", "arrays or inline tables nested too deep to read"),
    (b"[task]\nname = " + b"{a = " * 5000 + b"1" + b"}" * 5000 + b"\n", "nested too deep"),
]


@pytest.mark.parametrize(("content", "named"), UNREADABLE)
def test_an_unreadable_config_file_is_a_config_error_naming_it(tmp_path, content, named):
    path = tmp_path / "run.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="nested too deep|not UTF-8") as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: ") and named in str(raised.value)


def test_a_deeply_nested_override_is_a_wrong_value_not_a_crash():
    with pytest.raises(ConfigError, match="train.steps: expected int"):
        load_config(overrides=["train.steps=" + "[" * 5000 + "]" * 5000])


@pytest.mark.parametrize(("content", "named"), UNREADABLE[:2])
def test_eval_names_an_unreadable_config_in_one_line(tmp_path, capsys, content, named):
    path = tmp_path / "run.toml"
    path.write_bytes(content)
    assert main(["eval", str(tmp_path / "no-model"), "--config", str(path), "--out", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"reasonrl eval: {path}: ") and named in err
