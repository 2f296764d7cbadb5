"""The schema's sections of how the policy is updated: the objective and its estimates (algo),
the methods that add a teacher, an implicit PRM or a critic, the optimizer (train), and the
stages sft, rft and dpo."""

from __future__ import annotations

from dataclasses import dataclass

from reasonrl.algo.advantages import ADVANTAGES
from reasonrl.algo.aggregation import AGGREGATIONS
from reasonrl.algo.kl import KL_ESTIMATORS
from reasonrl.algo.objectives import OBJECTIVES
from reasonrl.algo.prime import PROCESS_BASELINES
from reasonrl.config.knobs import knob


@dataclass(frozen=True)
class AlgoConfig:
    advantage: str = knob("grpo", "advantage estimator (docs/algorithms.md)", choices=ADVANTAGES, extensible=True)
    objective: str = knob("ppo_clip", "per-token policy objective", choices=OBJECTIVES, extensible=True)
    aggregation: str = knob("token_mean", "how per-token losses become one scalar", choices=AGGREGATIONS, extensible=True)
    clip_low: float = knob(0.2, "ppo_clip/gspo/cispo/gmpo/clip_cov: lower clip range (ratio >= 1 - clip_low; "
                           "gmpo: log-ratio >= -clip_low); applies to every objective: the papers' own "
                           "ranges (gspo 3e-4/4e-4, gmpo 0.4, cispo 1/4) are set by their recipes", low=0.0)
    clip_high: float = knob(0.2, "upper clip range (ratio <= 1 + clip_high; DAPO uses 0.28; "
                            "gmpo: log-ratio <= clip_high)", low=0.0)
    dual_clip: float = knob(0.0, "ppo_clip: cap the loss of a negative-advantage token at -dual_clip * A "
                            "(dual-clip PPO, e.g. 3; 0: off)", low=0.0)
    adv_eps: float = knob(1e-6, "grpo/grpo_batch_std: added to the std before dividing", low=0.0)
    gamma: float = knob(1.0, "reinforce_pp/gae: discount per token", low=0.0, high=1.0)
    lam: float = knob(0.95, "gae: lambda", low=0.0, high=1.0)
    kl_coef: float = knob(0.0, "weight of the KL penalty to the frozen initial policy (0: no reference model)", low=0.0)
    kl_estimator: str = knob("k3", "per-token KL estimator", choices=KL_ESTIMATORS)
    kl_in: str = knob("loss", "where the KL penalty goes: 'loss' (a term of the loss) or 'reward' "
                      "(subtracted from the reward per token, before the advantages)", choices=("loss", "reward"))
    kl_target: float = knob(0.0, "adapt kl_coef towards this KL per token (Ziegler et al. 2019; 0: fixed)", low=0.0)
    kl_horizon: int = knob(10_000, "adaptive KL: horizon in sequences", low=1)
    ref_reset_every: int = knob(0, "copy the policy into the reference model every this many steps (0: never)", low=0)
    entropy_coef: float = knob(0.0, "weight of an entropy bonus (added to any objective)", low=0.0)
    tis: str = knob("auto", "truncated importance sampling between the learner's and the rollout engine's "
                    "log-probs: off, token or sequence; auto = token when rollout.max_staleness > 0, else off",
                    choices=("auto", "off", "token", "sequence"))
    tis_cap: float = knob(2.0, "truncated importance sampling: weight cap", low=1.0)
    mis: str = knob("off", "masked importance sampling: drop the samples whose learner/rollout-engine ratio lies "
                    "outside [mis_low, mis_high], per token, per sequence (product of the token ratios) or per "
                    "sequence by the geometric mean of its token ratios; dropped tokens leave the loss and its "
                    "normaliser", choices=("off", "token", "sequence", "geometric"))
    mis_low: float = knob(0.5, "masked importance sampling: lowest kept ratio", low=0.0, high=1.0)
    mis_high: float = knob(2.0, "masked importance sampling: highest kept ratio (IcePop: mis=token, 0.5 / 5 "
                           "with tis=token, tis_cap=5)", low=1.0)
    clip_cov_ratio: float = knob(2e-4, "clip_cov: share of tokens whose gradient is detached", low=0.0, high=1.0)
    cov_low: float = knob(1.0, "clip_cov: lower bound of the covariance band")
    cov_high: float = knob(5.0, "clip_cov: upper bound of the covariance band")
    kl_cov_ratio: float = knob(2e-3, "kl_cov: share of tokens (highest covariance) given the KL penalty",
                               low=0.0, high=1.0)
    kl_cov_coef: float = knob(1.0, "kl_cov: weight of |logp - old_logp| on those tokens", low=0.0)
    sapo_tau_pos: float = knob(1.0, "sapo: gate temperature for tokens with a positive advantage", low=1e-6)
    sapo_tau_neg: float = knob(1.05, "sapo: gate temperature for the others", low=1e-6)
    dppo_delta_low: float = knob(0.15, "dppo_tv/dppo_kl: trust-region size for tokens with a negative advantage "
                                 "(probability drop for tv; binary KL for kl, whose recipe sets 0.05)", low=0.0)
    dppo_delta_high: float = knob(0.15, "dppo_tv/dppo_kl: trust-region size for tokens with a positive advantage",
                                  low=0.0)
    dppo_ratio_cap: float = knob(10.0, "dppo_tv/dppo_kl: cap of the importance ratio weighing the kept tokens",
                                 low=1.0)


@dataclass(frozen=True)
class DistillConfig:
    teacher: str = knob("", "on-policy distillation (docs/distillation.md): the teacher that scores the student's "
                        "samples: a hub id or model directory (a checkpoint works), http(s)://HOST:PORT/v1 (an "
                        "OpenAI-compatible server returning prompt log-probs: reasonrl serve, vLLM), 'self' (the "
                        "policy's starting weights) or self:step_NNNNNN (that checkpoint in run.dir); '': off")
    weight: float = knob(1.0, "weight of the per-token reverse KL term in the advantage: A_t = reward_weight * "
                         "A_reward + weight * -(logp_student - logp_teacher)", low=0.0)
    reward_weight: float = knob(1.0, "weight of the reward's advantage beside the teacher's term (0: distillation "
                                "alone; the reward is still scored and logged)", low=0.0)
    served_model: str = knob("", "a served teacher: the request's 'model' field ('': the server's default)")
    request_size: int = knob(16, "a served teacher: sequences per request", low=1)
    dtype: str = knob("auto", "a local teacher's weights: auto = bfloat16 where the hardware has it",
                      choices=("auto", "float32", "bfloat16"))


@dataclass(frozen=True)
class PrimeConfig:
    enabled: bool = knob(False, "PRIME (Cui et al. 2025; docs/algorithms.md): an implicit process reward model, a "
                         "trainable copy of the start model updated every step on the outcome labels, whose "
                         "beta * (log pi_phi - log pi_ref) is a dense reward on every token; needs algo.advantage=rloo")
    beta: float = knob(0.05, "the implicit reward's scale beta (the paper's 0.05)", low=0.0)
    lr: float = knob(1e-6, "the implicit PRM's AdamW learning rate (the paper's 1e-6, twice its policy's 5e-7), "
                     "constant: train.warmup_steps and train.lr_schedule shape the policy's and the critic's only",
                     low=0.0)
    process_weight: float = knob(1.0, "weight of the process rewards' return in the advantage (verl: "
                                 "reward_dpo_coef)", low=0.0)
    outcome_weight: float = knob(1.0, "weight of the outcome reward's leave-one-out advantage (verl: "
                                 "reward_gt_coef)", low=0.0)
    process_baseline: str = knob("start", "what the process returns are measured against: start = the group's "
                                 "other implicit sequence rewards, at the first token only (an unbiased "
                                 "baseline); token_mean = the paper's Eq. 5, whose baseline is a bonus per token, "
                                 "a reward for length once the PRM's rewards are negative: docs/algorithms.md",
                                 choices=PROCESS_BASELINES)
    reward_last_token: bool = knob(False, "give the last completion token its process reward too (the paper's "
                                   "Eq. 5; verl's recipe/prime and the default do not: trained on mostly wrong "
                                   "answers, the PRM makes the end-of-sequence token's reward the most negative, "
                                   "which teaches the policy not to stop)")
    whiten: bool = knob(True, "whiten the advantages over the batch's tokens (verl's recipe/prime does)")


@dataclass(frozen=True)
class CriticConfig:
    model: str = knob("", "value model for advantage=gae (hub id or local directory; empty: model.name)")
    lr: float = knob(1e-5, "critic AdamW learning rate", low=0.0)
    value_clip: float = knob(0.2, "clipped value loss: how far one update may move a value", low=0.0)
    weight_decay: float = knob(0.0, "critic AdamW weight decay", low=0.0)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = knob(40, "training steps (one rollout batch each)", low=0)
    max_minutes: float = knob(0.0, "stop after the step during which this many minutes of training (this process's, "
                              "from the first step) have passed, checkpoint and evaluate as at the end (sft, dpo, rft: "
                              "checkpoint and stop); 0: no limit",
                              low=0.0)
    max_generated_tokens: int = knob(0, "stop after the step during which the run's generated tokens (all steps, "
                                     "resumes included; a tree's shared segments once) reach this many, checkpoint "
                                     "and evaluate as at the end: runs compared at equal generation cost (reasonrl train only); "
                                     "0: no limit",
                                     low=0)
    lr: float = knob(5e-6, "AdamW learning rate (5e-6: chosen for the default job by a tuning study and confirmed on "
                           "ten seeds, docs/benchmarks.md; the recipes that leave it unset were measured at 2e-5)",
                     low=0.0)
    warmup_steps: int = knob(0, "linear learning-rate warm-up, in optimizer steps", low=0)
    lr_schedule: str = knob("constant", "the learning rate after the warm-up: constant, or decaying to 0 at the "
                            "last of train.steps, linearly or along half a cosine (a run stopped early by "
                            "max_minutes or max_generated_tokens ends above 0)",
                            choices=("constant", "linear", "cosine"))
    weight_decay: float = knob(0.0, "AdamW weight decay", low=0.0)
    beta1: float = knob(0.9, "AdamW beta1", low=0.0, high=1.0)
    beta2: float = knob(0.999, "AdamW beta2", low=0.0, high=1.0)
    optimizer_state: str = knob("float32", "how AdamW stores its two moments (policy, critic, implicit PRM): float32, "
                                "or 8bit (bitsandbytes' block-wise 8-bit AdamW: a quarter of the memory, 1.00 -> 0.25 "
                                "GiB at 135M parameters, 56 -> 14 GB at 7B; slower per step on a CPU, docs/"
                                "configuration.md); needs reasonrl[memory]",
                                choices=("float32", "8bit"))
    grad_clip: float = knob(1.0, "clip the gradient's global norm to this (0: off)", low=0.0)
    ppo_epochs: int = knob(1, "passes over each rollout batch", low=1)
    mini_batches: int = knob(1, "optimizer steps per pass (the rollout batch is split into this many)", low=1)
    micro_batch_size: int = knob(8, "sequences per forward/backward (gradient accumulation); with "
                                 "micro_batch_positions > 0, only for micro-batches that are not packed", low=1)
    micro_batch_positions: int = knob(2048, "packed micro-batches (pack_sequences) take as many sequences as fit in "
                                      "this many positions, a shared prompt counted once (a longer sequence goes "
                                      "alone); 0: micro_batch_size sequences each", low=0)
    lora_rank: int = knob(0, "0: train every weight; > 0: train LoRA adapters of this rank on every linear layer "
                          "(peft) and sync only the adapters to the rollout engine", low=0)
    lora_alpha: float = knob(32.0, "LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)", low=0.0)
    pack_sequences: bool = knob(True, "on CPU, lay each micro-batch's sequences end to end in one row (no padding; "
                                "attention stays within each sequence; a prompt shared by several samples is computed "
                                "once), for Llama/Mistral/Qwen2/Qwen3 decoders without a sliding window")
    gradient_checkpointing: str = knob("auto", "activations the backward pass recomputes instead of keeping: off; "
                                       "selective (keep matmul outputs, recompute the elementwise work between "
                                       "them: about half the memory for a few percent more time); full (keep "
                                       "layer inputs only: least memory, about a third more compute); auto = "
                                       "selective for micro-batches longer than micro_batch_positions only "
                                       "(true/false mean full/off)", choices=("auto", "off", "selective", "full"),
                                       aliases={True: "full", False: "off"})
    dtype: str = knob("auto", "compute dtype of the update (weights and optimizer stay float32): "
                      "auto = bfloat16 autocast where the hardware has it", choices=("auto", "float32", "bfloat16"))


@dataclass(frozen=True)
class SFTConfig:
    batch_size: int = knob(16, "reasonrl sft: examples per optimizer step (train.steps steps; task.answer_field names "
                           "the solution)", low=1)
    max_tokens: int = knob(1024, "reasonrl sft: solutions are cut at this many tokens", low=1)


@dataclass(frozen=True)
class RFTConfig:
    problems_per_round: int = knob(32, "reasonrl rft: training problems sampled per round (rollout.group_size "
                                   "completions each; train.steps counts rounds)", low=1)
    steps_per_round: int = knob(4, "reasonrl rft: SFT steps of sft.batch_size kept samples per round", low=1)


@dataclass(frozen=True)
class DPOConfig:
    beta: float = knob(0.1, "reasonrl dpo: strength of the implicit KL to the reference (DPO's beta)", low=0.0)
    pairs_per_step: int = knob(8, "reasonrl dpo: preference pairs per optimizer step (online: problems sampled)",
                               low=1)
    online: bool = knob(False, "reasonrl dpo: build pairs from the best and worst of rollout.group_size fresh "
                        "samples per problem, scored by the reward (else: offline pairs from the task)")
    rejected_field: str = knob("rejected", "reasonrl dpo, offline: the data field holding the rejected response "
                               "(task.answer_field holds the chosen one)")

