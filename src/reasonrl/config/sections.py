"""The config's schema: one frozen dataclass per section, each field a `knob` with its default,
its one-line doc and the values it accepts. What `reasonrl train --help` prints comes from here.
This module holds the run's own sections (eval, alarm, run) and `Config`, which holds them all; the
sections of sampling are in rollout_sections, those of the update in update_sections."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from reasonrl.config.knobs import ALARMS, knob
from reasonrl.config.rollout_sections import (
    AgentConfig,
    GuidanceConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    SamplingConfig,
    TaskConfig,
)
from reasonrl.config.update_sections import (
    AlgoConfig,
    CriticConfig,
    DistillConfig,
    DPOConfig,
    PrimeConfig,
    RFTConfig,
    SFTConfig,
    TrainConfig,
)


@dataclass(frozen=True)
class EvalConfig:
    every: int = knob(0, "evaluate every this many steps (0: only before and after training)", low=0)
    problems: int = knob(100, "held-out problems per evaluation (at most task.test_size)", low=0)
    samples: int = knob(4, "sampled completions per problem, at rollout.temperature (0: greedy only)", low=0)
    greedy: bool = knob(True, "also evaluate greedy decoding")
    before: bool = knob(True, "evaluate before the first step, to report the improvement")


@dataclass(frozen=True)
class AlarmConfig:
    window: int = knob(5, "steps averaged by the windowed alarms (each waits for two windows)", low=1)
    entropy_ratio: float = knob(0.1, "entropy_collapse: entropy/mean below this fraction of its first window's",
                                low=0.0, high=1.0)
    hacking_margin: float = knob(0.05, "reward_hacking: reward/mean rose by more than this over the last window "
                                 "while reward/correct fell by more than this", low=0.0)
    length_factor: float = knob(3.0, "length_explosion: rollout/len_mean above this many times its first window's",
                                low=1.0)
    truncation_rise: float = knob(0.3, "truncation_surge: rollout/truncated_frac more than this above its first "
                                  "window's", low=0.0, high=1.0)
    clip_frac_max: float = knob(0.3, "clip_outliers: a step's loss/clip_frac above this", low=0.0, high=1.0)
    ratio_max: float = knob(10.0, "clip_outliers: a step's largest importance ratio (loss/ratio_max) above this",
                            low=1.0)
    kl_max: float = knob(1.0, "kl_blowup: kl/mean (nats per token, mean of the last window) above this", low=0.0)
    zero_std_max: float = knob(0.9, "no_gradient: over the last window, more than this share of groups had one "
                               "reward for all their samples (rollout/zero_std_frac; with dynamic sampling, the share "
                               "of sampled groups it dropped, sampling/dropped_frac)", low=0.0, high=1.0)
    grad_norm_factor: float = knob(10.0, "grad_norm: train/grad_norm non-finite, or its median over the last "
                                   "window above this many times its median over the steps before", low=1.0)


@dataclass(frozen=True)
class RunConfig:
    dir: str = knob("runs/%Y%m%d-%H%M%S", "where the run writes config, metrics, rollouts and checkpoints "
                    "(strftime codes such as %Y%m%d-%H%M%S are filled in when the run starts)")
    seed: int = knob(0, "seed of every random choice (problems, sampling, init)")
    device: str = knob("auto", "auto = cuda when available, else cpu", choices=("auto", "cpu", "cuda"))
    threads: int = knob(0, "torch CPU threads of this run; 0 = an equal share of the cores this process may use "
                        "among the reasonrl runs on the machine, re-divided every step (OMP_NUM_THREADS, when set, "
                        "is taken as N); a warning says when the runs' threads exceed the cores", low=0)
    backend: str = knob("local", "where rollouts are generated: local = an engine in this process; ray = "
                        "run.ray_workers engines in Ray actors (docs/scaling.md)", choices=("local", "ray"))
    ray_address: str = knob("", "backend=ray: the cluster to join ('auto' = the one `ray start` runs here, or "
                            "ray://host:port); '': start Ray on this machine")
    ray_workers: int = knob(2, "backend=ray: rollout workers", low=1)
    ray_cpus_per_worker: float = knob(1.0, "backend=ray: CPUs reserved per worker", low=0.0)
    ray_gpus_per_worker: float = knob(0.0, "backend=ray: GPUs per worker (> 0: the engine runs on its GPU)", low=0.0)
    ray_threads_per_worker: int = knob(1, "backend=ray: torch threads per worker (rollout and learner)", low=1)
    learner_workers: int = knob(0, "backend=ray: data-parallel learner ranks in Ray actors (torch.distributed, gloo "
                                "on CPU, nccl on GPU; updates independent of their number); 0: the learner runs in "
                                "this process", low=0)
    learner_shard: bool = knob(False, "learner_workers > 0: shard weights, gradients and optimizer state over the "
                               "learner ranks with FSDP2 (each holds 1/learner_workers of them; full fine-tuning only)")
    ray_cpus_per_learner: float = knob(1.0, "backend=ray: CPUs reserved per learner rank", low=0.0)
    ray_gpus_per_learner: float = knob(0.0, "backend=ray: GPUs per learner rank (> 0: it trains on its GPU)",
                                       low=0.0)
    keep_freed_memory: bool = knob(True, "on CPU with glibc's malloc, let it keep freed memory for reuse: steps "
                                   "run faster (no page faults), peak memory is higher (given back after a step once "
                                   "what is kept has grown 1 GiB past its level after the first step, or the "
                                   "first step after the last release); under an allocator preloaded instead "
                                   "(tcmalloc or mimalloc, as make train does) it has nothing to do")
    resume: str = knob("off", "continue from the newest checkpoint in run.dir, with the config it was run with (a "
                       "changed key is refused, unless run.resume_override; train.steps, evaluation, logging and guard "
                       "keys may change): latest (or true) refuses a damaged checkpoint, naming the file; "
                       "latest_valid resumes from the newest intact one instead, with a warning",
                       choices=("off", "latest", "latest_valid"), aliases={True: "latest", False: "off"})
    resume_override: bool = knob(False, "resume even though the config differs from RUN_DIR/config.toml (or that file "
                                 "is missing) in keys that change training (the keys are printed; the optimizer "
                                 "settings take effect on the restored optimizer)")
    save_every: int = knob(10, "checkpoint every this many steps (and at the end; 0: only at the end)", low=0)
    keep_checkpoints: int = knob(2, "newest checkpoints kept on disk", low=1)
    save_optimizer: bool = knob(True, "checkpoints hold the optimizer's state (Adam's moments: twice the weights "
                                "in float32); false: weights and everything else, and a resume restarts the "
                                "optimizer's moments (`reasonrl export` makes a bfloat16 copy for other tools)")
    tensorboard: bool = knob(True, "also log to TensorBoard when it is installed")
    wandb: bool = knob(False, "also log to Weights & Biases (pip install wandb): the metrics, the config "
                       "and run.wandb_rollouts samples per step as a table")
    wandb_project: str = knob("reasonrl", "run.wandb: the W&B project")
    wandb_name: str = knob("", "run.wandb: the W&B run's name ('': the run directory's name)")
    wandb_tags: tuple[str, ...] = knob((), "run.wandb: tags of the W&B run, e.g. '[\"grpo\", \"gsm8k\"]'")
    wandb_mode: str = knob("", "run.wandb: online, offline (written under run.dir/wandb only; upload later with `wandb "
                           "sync`) or disabled; '': $WANDB_MODE, else online", choices=("", "online", "offline", "disabled"))
    wandb_rollouts: int = knob(8, "run.wandb: rollout samples (prompt, completion, reward, advantage) logged per step "
                               "in the 'rollouts' table (0: none)", low=0)
    progress: bool = knob(True, "show a live progress bar")
    log_every: int = knob(5, "print a line of metrics every this many steps (0: never)", low=0)
    alarms: bool = knob(True, "check the metrics after every step for signs of a run gone wrong (entropy collapse, "
                        "reward hacking, length or truncation surge, clipping outliers, KL blow-up, groups without "
                        "gradient, exploding gradient norm; thresholds in [alarm]): a warning and alarm/<name> = 1")
    stop_on: tuple[str, ...] = knob((), "alarms that stop the run instead of warning (names as in alarm/<name>, "
                                    f"e.g. [\"grad_norm\", \"kl_blowup\"]): {', '.join(ALARMS)}")
    hang_factor: float = knob(10.0, "hang watchdog: a phase (generate, reward, update, sync, checkpoint) running "
                              "longer than this many times its median duration prints which phase, for how long, "
                              "and the stacks of all threads, once (the run goes on); 0: off", low=0.0)
    hang_floor_s: float = knob(60.0, "hang watchdog: a phase is never reported before this many seconds (its first "
                               "run: before hang_factor times this)", low=0.0)
    sync_check: bool = knob(True, "after every weight sync, sample a small fixed probe with the engine and compare "
                            "its log-probs with the learner's; stop the run when the engine's output did not change "
                            "while the learner's did, or the gap is above sync_max_gap (docs/troubleshooting.md)")
    sync_max_gap: float = knob(0.0, "largest mean |engine - learner| log-prob gap per probe token allowed after a "
                               "sync; 0: automatic (1e-3 with a float32 engine and update, else 0.5: bfloat16 "
                               "rounding alone gives 0.02-0.15 on the default job)", low=0.0)
    sync_probe_prompts: int = knob(2, "sync check: training problems in the probe (the first ones; with Ray at least "
                                   "run.ray_workers, one for each worker)", low=1)
    sync_probe_tokens: int = knob(2, "sync check: tokens sampled per probe problem (each one more costs the engine "
                                  "a decode step)", low=1)


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    guidance: GuidanceConfig = field(default_factory=GuidanceConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    prime: PrimeConfig = field(default_factory=PrimeConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    rft: RFTConfig = field(default_factory=RFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    alarm: AlarmConfig = field(default_factory=AlarmConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {section.name: _section_dict(getattr(self, section.name)) for section in dataclasses.fields(self)}

    def value(self, key: str) -> Any:
        """The value of a dotted key, e.g. cfg.value("algo.clip_low")."""
        section, _, name = key.partition(".")
        try:
            return getattr(getattr(self, section), name)
        except AttributeError:
            raise KeyError(f"no config key {key!r}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(tomli_w.dumps(self.to_dict()))


def _section_dict(section: Any) -> dict[str, Any]:
    return {f.name: list(v) if isinstance(v := getattr(section, f.name), tuple) else v
            for f in dataclasses.fields(section)}
