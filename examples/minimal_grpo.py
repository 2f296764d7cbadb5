"""GRPO on arithmetic in one file: the loop of `reasonrl train`'s default job, written out.

`reasonrl train` with no arguments trains SmolLM2-135M-Instruct on generated sums ("What is
23 + 58?") with GRPO. This script is that training loop, top to bottom, built from the library's
parts only: the task and its sampler, the rollout engine, the reward, the advantage estimator,
the loss and the learner. At the same settings and seed it logs the same per-step metrics,
bit for bit (tests/integration/test_minimal_example.py checks this on a tiny model).

    python examples/minimal_grpo.py --steps 40
    python examples/minimal_grpo.py --model PATH/TO/MODEL --steps 20 --save runs/minimal

What `reasonrl train` does besides, and this script leaves out: evaluation before and after
(`reasonrl eval` does it on a saved model), checkpoints and resuming, metrics and rollouts
files, TensorBoard, the progress bar, the check of every weight sync, the alarms, the hang
watchdog, activation checkpointing (which the default job's micro-batches are too short to
engage), and every knob that the default job leaves off (KL, dynamic sampling, replay, a critic,
other estimators and objectives, asynchronous rollouts, Ray, ...). None of these changes what is
sampled or how the weights move.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from reasonrl.algo.advantages import grpo
from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.loss import PolicyLoss
from reasonrl.algo.objectives import ppo_clip
from reasonrl.models import inference_copy, load_model, load_tokenizer, pick_device, resolve_dtype
from reasonrl.rewards import FormatReward, MathReward, WeightedReward, score_groups
from reasonrl.rollout import HFEngine
from reasonrl.sampling import EpochSampler
from reasonrl.seeds import derive_seed
from reasonrl.tasks import arithmetic_task
from reasonrl.training.estimation import without_cut_off
from reasonrl.training.learner import Learner, OptimConfig, make_train_batch
from reasonrl.training.runtime import keep_freed_memory
from reasonrl.types import Group, SamplingParams

# The default job's settings that this script does not take from its command line.
PROMPT_TEMPLATE = "{prompt}\nPut the final answer in \\boxed{{}}."  # task.prompt_template
TRAIN_PROBLEMS, TEST_PROBLEMS = 5000, 200  # task.train_size, task.test_size: 2-digit sums of 2 numbers
TEMPERATURE = 0.7  # rollout.temperature; the learner's log-probs are taken at it too
FORMAT_WEIGHT = 0.1  # reward.format_weight
CLIP = 0.2  # algo.clip_low and clip_high
ADV_EPS = 1e-6  # algo.adv_eps
GRAD_CLIP = 1.0  # train.grad_clip
MICRO_BATCH_SIZE = 8  # train.micro_batch_size: sequences per forward/backward
MICRO_BATCH_POSITIONS = 2048  # train.micro_batch_positions: a packed micro-batch's token budget


def build_parser() -> argparse.ArgumentParser:
    """The command line: each option's help names the `reasonrl train` setting it stands for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                        help="hub id or local HF model directory (model.name)")
    parser.add_argument("--steps", type=int, default=40, help="training steps (train.steps)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task, the sampler and the sampling (run.seed)")
    parser.add_argument("--prompts-per-step", type=int, default=4, help="problems per step (rollout.prompts_per_step)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per problem, G (rollout.group_size)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="completion length limit (rollout.max_new_tokens)")
    parser.add_argument("--lr", type=float, default=5e-6, help="AdamW learning rate (train.lr)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="the engine's weights and the learner's autocast; auto = bfloat16 where the hardware "
                             "has it (rollout.dtype and train.dtype)")
    parser.add_argument("--save", default="", help="directory to save the trained policy and tokenizer in")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.group_size < 2:
        parser.error("--group-size must be at least 2: GRPO's baseline is the mean of the problem's own group")
    if args.steps < 1 or args.prompts_per_step < 1 or args.max_new_tokens < 1:
        parser.error("--steps, --prompts-per-step and --max-new-tokens must be at least 1")
    return args


def train(args: argparse.Namespace) -> list[dict[str, float]]:
    """GRPO as `reasonrl train` runs it by default; each step's metrics, printed one line a step.

    Deviations from the papers (Shao et al. 2024, "DeepSeekMath", section 4.1, and its Algorithm 1):

    1. No KL penalty and no reference model (algo.kl_coef = 0). DeepSeekMath puts beta * KL(pi || pi_ref),
       estimated by k3, in the loss with beta = 0.04; DAPO drops it for verifiable rewards.
    2. The loss is averaged over every completion token of the batch (DAPO's token mean), not over
       sequences of per-sequence token means (DeepSeekMath's eq. 3), so a long answer's tokens
       weigh as much as a short one's instead of less.
    3. One optimizer step per batch (mu = 1, no mini-batches): the update is strictly on-policy, the
       importance ratio pi / pi_old is exactly 1 and the clip (0.2 both ways) never binds. The
       objective's gradient is the plain policy gradient -A * grad log pi, token-averaged; the
       clipped form is kept so that more epochs or mini-batches would be PPO's.
    4. The reward is a rule, not a learned reward model: 1 when math-verify finds the gold sum
       in the completion (the boxed answer, else the most explicit answer found, down to the last
       number) plus 0.1 when the answer is written in \\boxed{}, that bonus counted for correct
       answers only, so that group normalisation cannot turn it into a reward for formatting wrong
       answers. The advantage is DeepSeekMath's outcome supervision, (r - mean) / (std + 1e-6) over
       the group with the unbiased std; a group whose rewards are all equal gets 0.
    5. The log-probs are those of the sampling distribution, logits / temperature (0.7), in the
       learner as in the engine. The engine samples with bfloat16 weights where the hardware has
       them while the learner keeps float32 weights under bfloat16 autocast: the small mismatch
       (rollout/logp_gap) is left uncorrected (no truncated importance sampling when synchronous).
    6. Completions cut off at the length limit get no loss (DAPO's overlong filtering, which the
       default job's study chose: sampling.mask_truncated); they are scored and count in their
       group's baseline like the others. No overlong penalty; no entropy bonus; AdamW at a constant learning rate, no warmup, no weight
       decay, the gradient clipped to norm 1.
    """
    torch.manual_seed(args.seed)
    device = pick_device("auto")
    if device.type == "cpu":
        keep_freed_memory()  # glibc keeps freed blocks: no page faults in every update
    dtype = resolve_dtype(args.dtype, device)

    # The task: distinct sums of two 2-digit numbers, visited in a fresh shuffled order every epoch.
    task = arithmetic_task(train_size=TRAIN_PROBLEMS, test_size=TEST_PROBLEMS, seed=args.seed,
                           prompt_template=PROMPT_TEMPLATE)
    sampler = EpochSampler(len(task.train), seed=args.seed)

    # The reward: correctness, and a small bonus for the boxed format on correct answers only.
    reward = WeightedReward({"correct": (MathReward(), 1.0), "format": (FormatReward("boxed"), FORMAT_WEIGHT)},
                            gates={"format": "correct"})

    # The policy, trained in float32, and the engine sampling from its own copy, its weights in `dtype`
    # (inference_copy keeps RoPE's frequencies in float32, as loading a model in that dtype does).
    tokenizer = load_tokenizer(args.model)
    policy = load_model(args.model, dtype=torch.float32, device=device)
    learner = Learner(policy, OptimConfig(lr=args.lr, grad_clip=GRAD_CLIP), temperature=TEMPERATURE,
                      autocast_dtype=None if dtype == torch.float32 else dtype, seed=args.seed,
                      pack=True, micro_batch_positions=MICRO_BATCH_POSITIONS)
    engine = HFEngine(inference_copy(policy, dtype), tokenizer)
    loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean,
                      objective_kwargs={"clip_low": CLIP, "clip_high": CLIP})
    sampling = SamplingParams(n=args.group_size, temperature=TEMPERATURE, max_new_tokens=args.max_new_tokens)

    history = []
    for step in range(args.steps):
        started = time.perf_counter()
        # Sample: the step's problems and G completions of each, seeded by (seed, step).
        problems = [task.train[index] for index in sampler.next(args.prompts_per_step)]
        groups = engine.generate(problems, replace(sampling, seed=derive_seed(args.seed, step)))
        # Score, then the advantages: each completion against its own group.
        groups = score_groups(groups, reward)
        advantages_BG = grpo(torch.tensor([group.rewards for group in groups]), eps=ADV_EPS)
        # Update: the loss on every token of the completions not cut off at the limit, one optimizer step.
        batch, _ = without_cut_off(make_train_batch(groups, advantages_BG.flatten().tolist(), engine.pad_id), groups)
        metrics = learner.update(batch, loss, micro_batch_size=MICRO_BATCH_SIZE, step=step)
        # Sync: the engine samples the next step from the updated weights.
        engine.load_weights(learner.named_weights())
        metrics |= rollout_metrics(groups)
        history.append(metrics)
        print(f"step {step + 1:>3}/{args.steps} | reward {metrics['reward/mean']:.3f} | correct "
              f"{metrics['reward/correct']:.3f} | loss {metrics['loss/policy']:+.4f} | grad norm "
              f"{metrics['train/grad_norm']:.3f} | entropy {metrics['entropy/mean']:.3f} | length "
              f"{metrics['rollout/len_mean']:.1f} | {time.perf_counter() - started:.1f} s", flush=True)

    if args.save:
        policy.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)
        print(f"saved to {args.save}; evaluate: reasonrl eval {args.save} --task arithmetic")
    return history


def rollout_metrics(groups: list[Group]) -> dict[str, float]:
    """Mean and std of the total reward, the mean of each component, the completions' length and
    truncation, under the names `reasonrl train` logs them."""
    rewards = [r for group in groups for r in group.rewards]
    completions = [c for group in groups for c in group.completions]
    metrics = {"reward/mean": sum(rewards) / len(rewards), "reward/std": torch.tensor(rewards).std().item(),
               "rollout/len_mean": sum(len(c.token_ids) for c in completions) / len(completions),
               "rollout/truncated_frac": sum(c.finish_reason == "length" for c in completions) / len(completions)}
    for name in groups[0].reward_components:
        metrics[f"reward/{name}"] = sum(v for group in groups for v in group.reward_components[name]) / len(rewards)
    return metrics


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    return train(parse_args(argv))


if __name__ == "__main__":
    main()
