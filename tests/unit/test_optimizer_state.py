"""train.optimizer_state: AdamW's moments in float32 or in bitsandbytes' block-wise 8 bits."""

from __future__ import annotations

import pytest
import torch
from helpers import group

from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.objectives import ppo_clip
from reasonrl.config.consistency import refuse_unsupported
from reasonrl.config.loading import load_config
from reasonrl.training import optimizers
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss, make_train_batch
from reasonrl.training.optimizers import OptimizerStateError, adamw, state_bytes

pytest.importorskip("bitsandbytes")


def linear_1024(seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(1024, 1024, bias=False)


def linear_1024_with_adamw(state: str, *, weight_decay: float) -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    layer = linear_1024()
    return layer, adamw(list(layer.parameters()), lr=1e-3, betas=(0.9, 0.999), weight_decay=weight_decay, state=state,
                        device=torch.device("cpu"))


def step_with_gradient(optimizer: torch.optim.Optimizer, weight: torch.nn.Parameter, grad: torch.Tensor) -> None:
    weight.grad = grad.clone()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_eight_bit_state_takes_a_quarter_of_the_memory_by_hand():
    # A 1024 x 1024 weight (1,048,576 values). float32: two moments of 4 bytes each, 8,388,608 bytes.
    # 8 bits: two moments of 1 byte (2,097,152), a float32 scale per block of 256 values for each
    # (2 x 4 x 4096 = 32,768) and each moment's 256-entry float32 map (2 x 1024 = 2048): 2,131,968,
    # 25.4% of float32's.
    sizes = {}
    for state in ("float32", "8bit"):
        layer, optimizer = linear_1024_with_adamw(state, weight_decay=0.0)
        step_with_gradient(optimizer, layer.weight, torch.randn(1024, 1024))
        sizes[state] = state_bytes(optimizer) - 4 * sum(  # the float32 `step` counter torch keeps per weight
            1 for per_param in optimizer.state.values() for key, value in per_param.items()
            if key == "step" and isinstance(value, torch.Tensor))
    assert sizes == {"float32": 8_388_608, "8bit": 2_131_968}


def test_small_tensors_keep_float32_state():
    bias = torch.nn.Parameter(torch.zeros(optimizers.MIN_8BIT_SIZE - 1))
    optimizer = adamw([bias], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, state="8bit", device=torch.device("cpu"))
    step_with_gradient(optimizer, bias, torch.ones_like(bias))
    kinds = {value.dtype for value in optimizer.state[bias].values() if isinstance(value, torch.Tensor)}
    assert torch.uint8 not in kinds and torch.float32 in kinds


def test_the_first_step_is_adamw_and_later_steps_stay_close():
    # From zero moments AdamW's first step is -lr g / (|g| + eps) after the decay (bias-corrected
    # moments g and g^2); the state is quantized only after it, so 8 bits and float32 agree there to
    # rounding. Later steps read the quantized moments: close (what the paper's 32-bit-level results
    # rest on), not equal.
    weights = {}
    for state in ("float32", "8bit"):
        layer, optimizer = linear_1024_with_adamw(state, weight_decay=0.01)
        generator = torch.Generator().manual_seed(1)
        trajectory = []
        for _ in range(20):
            step_with_gradient(optimizer, layer.weight, torch.randn(1024, 1024, generator=generator))
            trajectory.append(layer.weight.detach().clone())
        weights[state] = trajectory
    start = linear_1024().weight.detach()
    torch.testing.assert_close(weights["8bit"][0], weights["float32"][0], atol=1e-6, rtol=0)
    moved_float32 = weights["float32"][-1] - start
    moved_8bit = weights["8bit"][-1] - start
    relative = (moved_8bit - moved_float32).norm() / moved_float32.norm()
    cosine = torch.nn.functional.cosine_similarity(moved_8bit.flatten(), moved_float32.flatten(), dim=0)
    assert relative < 0.05 and cosine > 0.99


def policy_with_8bit_sized_weights() -> torch.nn.Module:
    """A 1-layer Llama over 128 token ids whose matrices (128 x 64, 64 x 128) are past MIN_8BIT_SIZE."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def rewarded_batch():
    """One prompt and two completions: [5, 6, 7] rewarded (+1), [9, 10, 11] penalised (-1)."""
    return make_train_batch([group([1, 2, 3], [5, 6, 7], [9, 10, 11])], [1.0, -1.0], pad_id=0)


def completion_logprobs(model: torch.nn.Module) -> tuple[float, float]:
    with torch.no_grad():
        logp = model(torch.tensor([[1, 2, 3, 5, 6, 7], [1, 2, 3, 9, 10, 11]])).logits.log_softmax(-1)
    good = sum(logp[0, 2 + i, token].item() for i, token in enumerate([5, 6, 7]))
    bad = sum(logp[1, 2 + i, token].item() for i, token in enumerate([9, 10, 11]))
    return good, bad


def test_a_policy_learns_with_8bit_state():
    # Policy-gradient steps raise the rewarded completion's log-probability and lower the penalised
    # one's; a sign error in the update (or a state that stopped moving) fails either check.
    model = policy_with_8bit_sized_weights()
    learner = Learner(model, OptimConfig(lr=1e-2, state="8bit"))
    assert not learner.optimizer.state  # made at the first step
    good_before, bad_before = completion_logprobs(model)
    for _ in range(10):
        learner.update(rewarded_batch(), PolicyLoss(objective=ppo_clip, aggregation=token_mean), micro_batch_size=2)
    good_after, bad_after = completion_logprobs(model)
    assert any(v.dtype == torch.uint8 for s in learner.optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))
    assert good_after > good_before + 1.0 and bad_after < bad_before - 1.0


def trained(state: str, updates: int, resume_at: int | None = None, tmp_path=None) -> torch.nn.Module:
    """The policy after `updates` updates, optionally saved and restored into a fresh learner after `resume_at`."""
    model = policy_with_8bit_sized_weights()
    learner = Learner(model, OptimConfig(lr=1e-2, state=state))
    loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean)
    for k in range(updates):
        if k == resume_at:
            torch.save({"learner": learner.state_dict(), "weights": model.state_dict()}, tmp_path / "state.pt")
            model = policy_with_8bit_sized_weights()
            saved = torch.load(tmp_path / "state.pt", weights_only=False)
            model.load_state_dict(saved["weights"])
            learner = Learner(model, OptimConfig(lr=1e-2, state=state))
            learner.load_state_dict(saved["learner"])
        learner.update(rewarded_batch(), loss, micro_batch_size=2)
    return model


def test_a_resumed_8bit_optimizer_continues_exactly(tmp_path):
    straight = trained("8bit", 6)
    resumed = trained("8bit", 6, resume_at=3, tmp_path=tmp_path)
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(b, a, atol=0, rtol=0, msg=name)


def test_a_checkpoint_resumes_only_with_the_state_it_was_saved_with():
    saved = Learner(policy_with_8bit_sized_weights(), OptimConfig(state="8bit")).state_dict()
    learner = Learner(policy_with_8bit_sized_weights(), OptimConfig(state="float32"))
    with pytest.raises(OptimizerStateError, match="resume with train.optimizer_state=8bit"):
        learner.load_state_dict(saved)
    older = {k: v for k, v in Learner(policy_with_8bit_sized_weights(), OptimConfig()).state_dict().items()
             if k != "optimizer_state"}  # written before the setting existed: float32
    learner.load_state_dict(older)
    with pytest.raises(OptimizerStateError, match="optimizer state is float32"):
        Learner(policy_with_8bit_sized_weights(), OptimConfig(state="8bit")).load_state_dict(older)


def test_a_missing_bitsandbytes_says_how_to_install_it(monkeypatch):
    import builtins

    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *args, **kwargs: (
        (_ for _ in ()).throw(ImportError("no bitsandbytes")) if name == "bitsandbytes" else
        real_import(name, *args, **kwargs)))
    with pytest.raises(OptimizerStateError, match=r"reasonrl\[memory\]"):
        adamw([torch.nn.Parameter(torch.zeros(8))], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, state="8bit",
              device=torch.device("cpu"))


def test_an_unknown_state_and_sharding_with_8bit_are_refused():
    with pytest.raises(OptimizerStateError, match="float32, 8bit"):
        adamw([torch.nn.Parameter(torch.zeros(8))], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, state="4bit",
              device=torch.device("cpu"))
    cfg = load_config(overrides=["train.optimizer_state=8bit", "run.backend=ray", "run.learner_workers=2",
                                 "run.learner_shard=true"])
    with pytest.raises(ValueError, match="does not take sharded weights"):
        refuse_unsupported(cfg)


def test_the_run_setting_reaches_the_learners_settings():
    cfg = load_config(overrides=["train.optimizer_state=8bit"])
    assert OptimConfig.of(cfg.train, lr=1e-5, weight_decay=0.0).state == "8bit"
    assert OptimConfig.of(load_config().train, lr=1e-5, weight_decay=0.0).state == "float32"
