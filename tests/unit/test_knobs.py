"""A knob set away from its default that the config does not use is refused, naming the knob, why it
does not apply and what would use it; the same knob where it applies loads. Checked for every knob a
registered function declares and every gate, so a new one cannot be left out."""

from __future__ import annotations

import dataclasses

import pytest

from reasonrl.commands.cli import main
from reasonrl.config import Config, ConfigError, load_config
from reasonrl.config.applicability import FAMILIES, GATES, inapplicable, unused_knobs

DEFAULTS = Config()
FIELDS = {f"{section.name}.{knob.name}": knob for section in dataclasses.fields(Config)
          for knob in dataclasses.fields(section.default_factory)}

# What switches each gate on (the rest of the config as the defaults).
ENABLE = {
    "algo.kl_coef > 0": ["algo.kl_coef=0.1"],
    "algo.kl_target > 0 (the adaptive KL coefficient)": ["algo.kl_coef=0.1", "algo.kl_target=0.1"],
    "truncated importance sampling is on (algo.tis=token or sequence, or auto with rollout.max_staleness > 0 or "
    "rollout.partial)":
        ["algo.tis=token"],
    "algo.mis is not off": ["algo.mis=token"],
    "the advantage estimator reads a critic (algo.advantage=gae)": ["algo.advantage=gae"],
    "guidance.mode is not off": ["guidance.mode=mixed", "guidance.weighting=shaped", "guidance.source=expert"],
    "guidance.mode=mixed": ["guidance.mode=mixed"],
    "guidance.mode=interleave": ["guidance.mode=interleave"],
    "guidance.weighting=shaped": ["guidance.mode=mixed", "guidance.weighting=shaped"],
    "guidance.source=expert": ["guidance.mode=mixed"],
    "prime.enabled=true": ["prime.enabled=true", "algo.advantage=rloo", "sampling.mask_truncated=false"],
    "distill.teacher is set (reasonrl distill --teacher MODEL)": ["distill.teacher=self"],
    "agent.environment is set": ["agent.environment=python_math"],
    "sampling.problems=band": ["sampling.problems=band"],
    "sampling.problems=competence or pass_rate": ["sampling.problems=competence"],
    "sampling.problems=competence": ["sampling.problems=competence"],
    "sampling.problems=pass_rate": ["sampling.problems=pass_rate"],
    "sampling.problems=band or pass_rate, or sampling.adaptive_budget": ["sampling.problems=band"],
    "sampling.dynamic=true": ["sampling.dynamic=true"],
    "sampling.adaptive_budget=true": ["sampling.adaptive_budget=true"],
    "rollout.tree is set": ["rollout.tree=2x4"],
    "rollout.partial=true": ["rollout.partial=true"],
    "reward.fn is not set (reward.fn is the whole reward; reward.custom adds to the configured components instead)":
        [],
    "reward.format_weight > 0": [],
    "reward.custom is set": ["reward.custom=reasonrl.rewards.format:has_boxed"],
    "reward.overlong_buffer > 0": ["reward.overlong_buffer=8"],
    "reward.repetition_ngram > 0": ["reward.repetition_ngram=3"],
    "reward.confidence is set": ["reward.confidence=sequence_logprob"],
    "reward.judge_model is set": ["reward.judge_model=judge"],
    "reward.reward_model is set": ["reward.reward_model=classifier"],
    "reward.process_model is set": ["reward.process_model=prm"],
    "train.lora_rank > 0": ["train.lora_rank=8"],
    "task.name=environment": ["task.name=environment", "task.environment=chain_sum"],
    "task.name=jsonl": ["task.name=jsonl", "task.train_path=train.jsonl"],
    "task.name=arithmetic": [],
    "agent.environment is set or task.name=openenv (episodes are played)":
        ["agent.environment=python_math"],
    "task.agent is set or task.name=verifiers or openenv (episodes that can fail)":
        ["task.name=openenv", "task.env_url=http://127.0.0.1:1"],
    "task.agent is set or task.name=verifiers (episodes an agent plays)": ["task.name=verifiers", "task.env=an-env"],
    "task.name=verifiers or openenv": ["task.name=verifiers", "task.env=an-environment"],
    "task.name=openenv": ["task.name=openenv", "task.env_url=http://127.0.0.1:1"],
    "task.name is not verifiers or openenv (their environment writes the prompts)": [],
    "model.chat_template=true and reasonrl opens the conversations (not with task.name=verifiers or openenv, "
    "task.agent or agent.environment, whose environment or agent writes them)": [],
    "task.name is not verifiers or openenv (the environment's own rewards are the reward)": [],
    "task.agent is not set (the float the agent returns is the whole reward)": [],
    "agent.environment is not set (an episode's reward is what its environment scores; reward.custom adds to it)":
        [],
    "agent.environment is not set, or is a built-in environment that checks answers with a verifier (python_math)":
        [],
    "reward.verifier is math or routed, and no agent.environment checks one answer at a time (not with "
    "task.name=environment either, whose environment checks its own answers)": [],
    "rollout.fused=true (the fused decoder's continuous batch bounds its rows)": [],
    "reward.verifier is math, routed or majority_vote (not with task.name=environment, whose environment checks its "
    "own answers)": [],
    "task.hub=false (task.hub=true reads the hub's copy)": [],
    "task.name has a training split of that size (not jsonl, which trains on all of task.train_path, humaneval, "
    "which trains on the problems it does not hold out, or a benchmark without a training split)": [],
    "the model decodes here: rollout.engine is not openai (reasonrl eval of a vllm run decodes with transformers), "
    "or reward.judge_model runs here (no reward.judge_url)": [],
    "run.alarms=true": [],
    "run.sync_check=true": [],
    "run.hang_factor > 0 (the hang watchdog is on)": [],
    "run.backend=ray": ["run.backend=ray"],
    "run.learner_workers > 0": ["run.backend=ray", "run.learner_workers=2"],
    "run.wandb=true": ["run.wandb=true"],
}
ENABLE_BENCHMARK = ["task.name=gsm8k"]


# Values chosen where the first allowed one would be refused for another reason (k1 in the loss, a
# reward that cannot be imported).
OTHER_VALUES = {"algo.kl_estimator": "k2", "reward.custom": "reasonrl.rewards.format:has_boxed",
                "reward.fn": "reasonrl.rewards.format:has_boxed",
                "task.env_args": '{"taskset": {"num_tasks": 4}}', "model.system_prompt": "Answer briefly.",
                "run.stop_on": '["no_gradient"]'}


def enabling(key: str) -> list[str]:
    """What switches on every gate of `key`, and chooses a function declaring it where one must."""
    overrides = [o for gate in GATES if key in gate.keys
                 for o in (ENABLE_BENCHMARK if gate.when.startswith("task.name is a benchmark") else ENABLE[gate.when])]
    for family in FAMILIES:
        if key in (owned := family.owned()):
            overrides.append(f"{family.choice}={owned[key][0]}")
    return overrides


def another_value(key: str) -> str:
    """A value of `key` other than its default that passes the knob's own checks, as an override."""
    knob, default = FIELDS[key], DEFAULTS.value(key)
    meta = knob.metadata
    if key in OTHER_VALUES:
        value = OTHER_VALUES[key]
    elif isinstance(default, bool):
        value = str(not default).lower()
    elif meta["choices"]:
        value = next(choice for choice in meta["choices"] if choice != default)
    elif isinstance(default, tuple):
        value = '["x"]'
    elif isinstance(default, str):
        value = "http://127.0.0.1:1/v1" if key.endswith("url") else "x"
    elif isinstance(default, int):
        value = str(default + 1 if meta["high"] is None or default + 1 <= meta["high"] else default - 1)
    else:
        candidate = default / 2 if default > 0 else 0.5
        value = str(candidate if meta["low"] is None or candidate >= meta["low"] else default + 0.05)
    return f"{key}={value}"


GATED = [(gate.when, key) for gate in GATES for key in gate.keys]


def test_every_gate_says_how_to_switch_it_on():
    whens = {gate.when for gate in GATES}
    assert whens - {w for w in whens if w.startswith("task.name is a benchmark")} == set(ENABLE)


@pytest.mark.parametrize(("when", "key"), GATED, ids=[key for _, key in GATED])
def test_a_gated_knob_is_refused_when_off_and_loads_when_on(when, key):
    cfg = load_config(None, [*enabling(key), another_value(key)])
    assert key not in unused_knobs(cfg) and cfg.value(key) != DEFAULTS.value(key)
    if not any(gate.when == when and not gate.applies(DEFAULTS) for gate in GATES):
        pytest.skip(f"{when}: on by default")
    with pytest.raises(ConfigError, match=rf"{key}=.* has no effect: {key} "):
        load_config(None, [another_value(key)])


OWNED = [(family.choice, key, owners) for family in FAMILIES for key, owners in family.owned().items()]


@pytest.mark.parametrize(("choice", "key", "owners"), OWNED, ids=[f"{c}:{k}" for c, k, _ in OWNED])
def test_a_declared_knob_applies_only_when_a_function_declaring_it_is_chosen(choice, key, owners):
    family = next(f for f in FAMILIES if f.choice == choice)
    other = next((name for name in family.registry if name not in owners), None)
    extra = ["agent.environment=python_math"] if choice == "agent.environment" else []
    if choice == "algo.advantage":
        extra = ["algo.kl_coef=0"]
    owner_overrides = [*extra, f"{choice}={owners[0]}", another_value(key)]
    if choice == "agent.environment" and owners[0] == "retrieval_qa":
        owner_overrides = [o for o in owner_overrides if not o.startswith("agent.environment=python_math")]
    assert key not in unused_knobs(load_config(None, owner_overrides))
    if other is None:
        pytest.skip(f"every {choice} declares {key}")
    with pytest.raises(ConfigError) as refused:
        load_config(None, [*extra, f"{choice}={other}", another_value(key)])
    message = str(refused.value)
    assert f"{key}=" in message and "has no effect" in message and f"{choice}={'/'.join(owners)}" in message
    assert f"{choice} is {other}" in message


def test_the_examples_of_silent_knobs_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"algo.sapo_tau_pos=3.0 has no effect: algo.sapo_tau_pos is used by "
                                          r"algo.objective=sapo, and algo.objective is ppo_clip"):
        load_config(None, ["algo.sapo_tau_pos=3"])
    with pytest.raises(ConfigError, match=r"algo.clip_cov_ratio=0.01 has no effect: .* algo.objective=clip_cov"):
        load_config(None, ["algo.advantage=grpo", "algo.clip_cov_ratio=0.01"])
    assert load_config(None, ["algo.objective=sapo", "algo.sapo_tau_pos=3"]).algo.sapo_tau_pos == 3.0
    # a knob at its default is not "set": a saved config holding every key loads
    assert load_config(None, ["algo.sapo_tau_pos=1.0"]).algo.sapo_tau_pos == 1.0


def test_several_unused_knobs_are_named_together():
    with pytest.raises(ConfigError, match=r"algo.sapo_tau_pos=.*; critic.lr=.*\. Remove them"):
        load_config(None, ["algo.sapo_tau_pos=3", "critic.lr=1e-3"])


def test_group_relative_estimators_refuse_groups_of_one():
    for overrides in (["rollout.group_size=1"], ["sampling.stages=['0: group_size=1']"],
                      ["sampling.adaptive_budget=true", "sampling.min_samples=1"]):
        with pytest.raises(ConfigError, match="groups need at least 2 samples"):
            load_config(None, overrides)
    assert load_config(None, ["rollout.group_size=1", "algo.advantage=remax"]).rollout.group_size == 1
    assert load_config(None, ["rollout.group_size=1", "algo.advantage=reinforce_pp"]).rollout.group_size == 1


def test_inapplicable_lists_each_knob_with_why():
    skipped = inapplicable(DEFAULTS)
    assert skipped["algo.sapo_tau_pos"].endswith("algo.objective is ppo_clip")
    assert skipped["critic.lr"] == "critic.lr applies only when the advantage estimator reads a critic " \
                                  "(algo.advantage=gae)"
    assert "algo.clip_low" not in skipped and "rollout.group_size" not in skipped


def test_explain_lists_what_applies_with_its_source(capsys):
    assert main(["explain", "gspo", "algo.clip_high=5e-4"]) == 0
    out = capsys.readouterr().out
    assert "  objective = \"gspo\"  (recipe)" in out
    assert "  clip_high = 0.0005  (override)" in out
    assert "  clip_low = 0.0003  (recipe)" in out
    assert "  lr = " in out and "sapo_tau_pos" not in out and "critic" not in out.split("knobs do not apply")[0]
    assert main(["explain", "gspo", "--all"]) == 0
    assert "sapo_tau_pos = 1.0  (default)  not used: algo.sapo_tau_pos is used by algo.objective=sapo" in \
           capsys.readouterr().out
    assert main(["explain", "algo.sapo_tau_pos=3"]) == 2
    assert "has no effect" in capsys.readouterr().err


@pytest.mark.parametrize(("overrides", "refused"), [
    (["agent.environment=python_math", "reward.format_weight=0.5"], "reward.format_weight"),
    (["agent.environment=python_math", "reward.overlong_buffer=8"], "reward.overlong_buffer"),
    (["agent.environment=retrieval_qa", "agent.corpus=c.jsonl", "reward.math_timeout_s=9"], "reward.math_timeout_s"),
    (["reward.verifier=code", "reward.math_workers=2"], "reward.math_workers"),
    (["reward.verifier=majority_vote", "reward.math_workers=2"], "reward.math_workers"),
    (["reward.verifier=code", "reward.math_timeout_s=9"], "reward.math_timeout_s"),
    (["task.name=environment", "task.environment=chain_sum", "reward.math_workers=2"], "reward.math_workers"),
    (["agent.environment=python_math", "reward.math_timeout_s=9"], None),
    (["agent.environment=python_math", "reward.math_workers=2"], "reward.math_workers"),
    (["rollout.fused=false", "rollout.max_batch_rows=8"], "rollout.max_batch_rows"),
    (["agent.environment=python_math", "reward.custom=reasonrl.rewards.format:has_boxed"], None),
    (["reward.verifier=majority_vote", "reward.math_timeout_s=9"], None),
    (["reward.verifier=routed", "reward.math_workers=2"], None),
    (["task.name=environment", "task.environment=chain_sum", "reward.verifier=routed", "reward.math_workers=2"], None),
    (["task.name=gsm8k", "task.hub=true", "task.data_dir=data"], "task.data_dir"),
    (["task.name=gsm8k", "task.data_dir=data"], None),
    (["task.name=math500", "task.train_size=10"], "task.train_size"),
    (["task.name=jsonl", "task.train_path=t.jsonl", "task.train_size=10"], "task.train_size"),
    (["task.name=humaneval", "reward.verifier=code", "task.train_size=10"], "task.train_size"),
    (["task.name=gsm8k", "task.train_size=10"], None),
    (["rollout.engine=openai", "rollout.openai_url=http://127.0.0.1:1/v1", "rollout.fused=false"], "rollout.fused"),
    (["rollout.engine=openai", "rollout.openai_url=http://127.0.0.1:1/v1", "rollout.cuda_graphs=false"],
     "rollout.cuda_graphs"),
    (["rollout.engine=openai", "rollout.openai_url=http://127.0.0.1:1/v1", "rollout.fused=false",
      "reward.judge_model=judge"], None),
    (["run.alarms=false", "alarm.entropy_ratio=0.2"], "alarm.entropy_ratio"),
    (["run.alarms=false", "run.stop_on=[\"no_gradient\"]"], "run.stop_on"),
    (["run.sync_check=false", "run.sync_max_gap=0.5"], "run.sync_max_gap"),
    (["run.hang_factor=0", "run.hang_floor_s=5"], "run.hang_floor_s"),
    (["alarm.entropy_ratio=0.2", "run.stop_on=[\"no_gradient\"]", "run.sync_max_gap=0.5", "run.hang_floor_s=5"],
     None),
])
def test_reward_knobs_that_the_chosen_reward_does_not_build_are_refused(overrides, refused):
    if refused is None:
        assert not unused_knobs(load_config(None, overrides))
        return
    with pytest.raises(ConfigError, match=rf"{refused}=.* has no effect: {refused} applies only when"):
        load_config(None, overrides)
