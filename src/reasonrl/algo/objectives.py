"""Per-token policy objectives: log-probs and advantages in, a per-token loss to minimise out.

Every objective has the signature
    fn(logp_NT, old_logp_NT, adv_NT, mask_NT, **hyper) -> (loss_NT, metrics)
with `metrics` a dict of scalar tensors averaged over the masked tokens (e.g. clip fraction).
Turning the per-token loss into a scalar is the job of aggregation.py. rho = exp(logp - old_logp)
is the importance ratio to the policy that sampled (or last scored) the tokens.

- `reinforce`: Williams 1992, vanilla policy gradient: loss = -A * logp (no ratio).
- `ppo_clip`: Schulman et al. 2017, "PPO", eq. 7, with separate lower and upper ranges (Yu et al.
  2025, "DAPO", clip-higher): loss = -min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A).
  With `dual_clip` c > 1 (Ye et al. 2020, "Mastering Complex Control in MOBA Games", dual-clip
  PPO): for A < 0 the loss is capped at -c A, so a huge ratio on a bad token cannot blow it up.
- `gspo`: Zheng et al. 2025, "Group Sequence Policy Optimization": the sequence ratio
  s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean_t (logp - old_logp)) replaces rho and is
  clipped per sequence; written per token as GSPO-token (s_i,t = sg[s_i] pi(y_t) / sg[pi(y_t)]),
  which has the same value and, for a per-sequence A, the same gradient. Pair with a sequence-mean
  aggregation, as in the paper.
- `cispo`: MiniMax 2025, "MiniMax-M1", eq. 4: loss = -sg(clip(rho, 1 - clip_low, 1 + clip_high)) A logp:
  the clipped ratio only weighs the gradient, so clipped tokens still contribute one.
- `gmpo`: Zhao et al. 2025, "Geometric-Mean Policy Optimization": per sequence,
  loss_i = -A_i exp(mean_t s_i min(s_i log rho_t, s_i clip(log rho_t, -clip_low, clip_high))),
  s_i = sign(A_i), i.e. the geometric mean of the token ratios, each clipped in log space to [e^-clip_low, e^clip_high]
  (paper: 0.4). The sequence loss is written on every token of the sequence: pair with
  `seq_mean_token_mean`. A_i is the sequence's mean token advantage.
- `clip_cov`, `kl_cov`: Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", sec. 4.
  Token covariance cov_t = (logp_t - mean logp)(A_t - mean A), means over the masked tokens.
  Clip-Cov detaches (zero loss and gradient) a random `clip_cov_ratio` share of the tokens whose
  covariance lies in (cov_low, cov_high), among those PPO-clip has not clipped already; KL-Cov
  adds kl_cov_coef |logp - old_logp| to the top `kl_cov_ratio` share of tokens by covariance, on
  the unclipped surrogate -rho A. Which tokens are chosen is a statistic of the whole optimizer
  step's batch, as in the paper, not of a micro-batch (verl's per-micro-batch choice makes the loss
  depend on the micro-batch size): `clip_cov_selection` / `kl_cov_selection` choose them over the
  tensors they are given, and the learner calls them once per optimizer step over all of its
  sequences (TOKEN_SELECTIONS) and passes the choice to the objective as `selected_NT`. Called
  without `selected_NT`, the objective chooses over its own tensors. The count is
  max(int(ratio * tokens), 1): at least one token per optimizer step, so on small batches the
  share is larger than the ratio.

- `sapo`: Gao et al. 2025, "Soft Adaptive Policy Optimization": a smooth gate instead of a hard
  clip, loss = -(4/tau) sigmoid(tau (rho - 1)) A with tau = sapo_tau_pos for A > 0, sapo_tau_neg
  otherwise (paper: 1.0 / 1.05); its gradient 4 s(1-s) rho A grad logp (s the sigmoid) equals
  REINFORCE's at rho = 1 and fades smoothly off-policy. Pair with `seq_mean_token_mean`, as in
  the paper (verl and TRL do the same).
- `dppo_tv`, `dppo_kl`: Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement
  Learning" (DPPO): a token is masked (no loss, no gradient) when the policy has left a trust
  region around pi_old *in the direction its advantage pushes*, measured on the sampled token's
  probabilities p = pi(y_t), q = pi_old(y_t): binary total variation |p - q| (A > 0 and
  p - q > delta_high, or A < 0 and q - p > delta_low) or the binary KL
  q log(q/p) + (1-q) log((1-q)/(1-p)) (above delta_high with p > q for A > 0, above delta_low
  with p < q for A < 0). Kept tokens take the truncated importance-sampled policy gradient
  -sg(min(rho, dppo_ratio_cap)) A logp (the authors' code, cap 10). The anchor is pi_old, as in
  verl (the authors' default anchors on the rollout policy, which equals pi_old on-policy). Masked
  tokens stay in the normaliser, as PPO's clipped ones do. `clip_frac` reports the masked share.
- `topr`: Le Roux et al. 2025, "Tapered Off-Policy REINFORCE": per sequence, loss_t =
  -sg(c_i) A_t logp_t with c_i = 1 for A_i >= 0 (no importance weight: positive samples are
  imitated whoever generated them) and c_i = clip(pi(y_i) / mu(y_i), 0, 1) for A_i < 0, the
  sequence's product ratio to the policy that sampled it (`sampling_logp_NT`, the rollout
  engine's log-probs; an earlier policy's for stale or replayed samples). The sign is that of the
  advantage, i.e. of the reward against the estimator's baseline.

The corrections between the rollout engine's and the learner's log-probs (truncated and masked
importance sampling) are in correction.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from reasonrl.spec import declare

Metrics = dict[str, torch.Tensor]


# The config keys of hyper-parameters several objectives share (reasonrl.spec).
_CLIP = {"clip_low": "algo.clip_low", "clip_high": "algo.clip_high"}
_COV = {"clip_cov_ratio": "algo.clip_cov_ratio", "cov_low": "algo.cov_low", "cov_high": "algo.cov_high"}
_DPPO = {"dppo_delta_low": "algo.dppo_delta_low", "dppo_delta_high": "algo.dppo_delta_high",
         "dppo_ratio_cap": "algo.dppo_ratio_cap"}


def masked_mean(x_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    return (x_NT * mask_NT).sum() / mask_NT.sum().clamp(min=1)


@declare()
def reinforce(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor,
              ) -> tuple[torch.Tensor, Metrics]:
    """Vanilla policy gradient: loss = -A * logp (old_logp unused: no importance ratio)."""
    return -adv_NT * logp_NT, {}


@declare(knobs=_CLIP | {"dual_clip": "algo.dual_clip"})
def ppo_clip(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, *,
             clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float = 0.0) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate, asymmetric range, optional dual clip (0: off). (N, T) -> loss_NT."""
    ratio_NT = torch.exp(logp_NT - old_logp_NT)
    loss_NT, was_clipped_NT = _clipped_surrogate(ratio_NT, adv_NT, clip_low, clip_high)
    metrics = {"clip_frac": masked_mean(was_clipped_NT, mask_NT), "ratio_mean": masked_mean(ratio_NT.detach(), mask_NT)}
    if dual_clip:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or 0 for off), got {dual_clip}")
        cap_NT = -dual_clip * adv_NT
        capped_NT = (adv_NT < 0) & (loss_NT > cap_NT)
        loss_NT = torch.where(capped_NT, cap_NT, loss_NT)
        metrics["dual_clip_frac"] = masked_mean(capped_NT.float(), mask_NT)
    return loss_NT, metrics


@declare(knobs=_CLIP)
def gspo(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, *,
         clip_low: float = 3e-4, clip_high: float = 4e-4) -> tuple[torch.Tensor, Metrics]:
    """Sequence-level ratio (geometric mean of token ratios), clipped per sequence. (N, T) -> loss_NT."""
    seq_log_ratio_N1 = _row_mean(logp_NT - old_logp_NT, mask_NT)[:, None]
    # Value s_i on every token; gradient s_i * grad logp_t, whose token mean is grad s_i.
    ratio_NT = torch.exp(seq_log_ratio_N1.detach() + logp_NT - logp_NT.detach())
    loss_NT, was_clipped_NT = _clipped_surrogate(ratio_NT, adv_NT, clip_low, clip_high)
    metrics = {"clip_frac": masked_mean(was_clipped_NT, mask_NT),
               "seq_ratio_mean": masked_mean(ratio_NT.detach(), mask_NT)}
    return loss_NT, metrics


@declare(knobs=_CLIP)
def cispo(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, *,
          clip_low: float = 1.0, clip_high: float = 0.28) -> tuple[torch.Tensor, Metrics]:
    """Stop-gradient clipped importance weight times the REINFORCE term. (N, T) -> loss_NT."""
    ratio_NT = torch.exp(logp_NT.detach() - old_logp_NT)
    weight_NT = ratio_NT.clamp(1.0 - clip_low, 1.0 + clip_high)
    metrics = {"clip_frac": masked_mean((weight_NT != ratio_NT).float(), mask_NT),
               "ratio_mean": masked_mean(ratio_NT, mask_NT)}
    return -weight_NT * adv_NT * logp_NT, metrics


@declare(knobs=_CLIP)
def gmpo(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, *,
         clip_low: float = 0.4, clip_high: float = 0.4) -> tuple[torch.Tensor, Metrics]:
    """Geometric mean of token ratios clipped in log space; the sequence loss on each of its tokens."""
    adv_N = _row_mean(adv_NT, mask_NT)
    sign_N1 = torch.sign(adv_N)[:, None]
    log_ratio_NT = logp_NT - old_logp_NT
    # Pessimistic in the sign of A: the clip only bites when the ratio moves the loss down.
    clipped_NT = sign_N1 * torch.minimum(sign_N1 * log_ratio_NT, sign_N1 * log_ratio_NT.clamp(-clip_low, clip_high))
    seq_ratio_N = torch.exp(_row_mean(clipped_NT, mask_NT))
    loss_N = -adv_N * seq_ratio_N
    with torch.no_grad():
        # A sequence with A = 0 has no loss to clip (sign 0 zeroes its clipped log-ratio, not the clip).
        was_clipped_NT = ((clipped_NT != log_ratio_NT) & (sign_N1 != 0)).float()
        geometric_N1 = torch.exp(_row_mean(log_ratio_NT, mask_NT))[:, None]  # unclipped, as GSPO logs its own
        metrics = {"clip_frac": masked_mean(was_clipped_NT, mask_NT),
                   "ratio_mean": masked_mean(torch.exp(logp_NT - old_logp_NT), mask_NT),
                   "seq_ratio_mean": masked_mean(geometric_N1.expand_as(logp_NT), mask_NT)}
    return loss_N[:, None].expand_as(logp_NT), metrics


@declare(inputs=("generator", "selected_NT"), knobs=_CLIP | _COV)
def clip_cov(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, *,
             clip_low: float = 0.2, clip_high: float = 0.2, clip_cov_ratio: float = 2e-4, cov_low: float = 1.0,
             cov_high: float = 5.0, generator: torch.Generator | None = None, selected_NT: torch.Tensor | None = None,
             ) -> tuple[torch.Tensor, Metrics]:
    """PPO-clip with the `selected_NT` tokens detached (loss 0); without a selection, a random
    `clip_cov_ratio` share of these tokens' unclipped ones in the covariance band. (N, T) -> loss_NT."""
    ratio_NT = torch.exp(logp_NT - old_logp_NT)
    loss_NT, was_clipped_NT = _clipped_surrogate(ratio_NT, adv_NT, clip_low, clip_high)
    if selected_NT is None:
        selected_NT = clip_cov_selection(logp_NT, old_logp_NT, adv_NT, mask_NT, clip_low=clip_low, clip_high=clip_high,
                                         clip_cov_ratio=clip_cov_ratio, cov_low=cov_low, cov_high=cov_high,
                                         generator=generator)
    metrics = {"clip_frac": masked_mean(was_clipped_NT, mask_NT), "ratio_mean": masked_mean(ratio_NT.detach(), mask_NT),
               "cov_detached_frac": masked_mean(selected_NT.float(), mask_NT)}
    return torch.where(selected_NT, torch.zeros_like(loss_NT), loss_NT), metrics


@declare(inputs=("generator",), knobs=_CLIP | _COV)
def clip_cov_selection(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor,
                       *, clip_low: float = 0.2, clip_high: float = 0.2, clip_cov_ratio: float = 2e-4,
                       cov_low: float = 1.0, cov_high: float = 5.0, generator: torch.Generator | None = None,
                       ) -> torch.Tensor:
    """Clip-Cov's tokens to detach: max(int(clip_cov_ratio * tokens), 1) drawn at random among the
    tokens PPO-clip leaves unclipped whose covariance lies in (cov_low, cov_high). (N, T) bool."""
    ratio_NT = torch.exp(logp_NT.detach() - old_logp_NT)
    _, was_clipped_NT = _clipped_surrogate(ratio_NT, adv_NT, clip_low, clip_high)
    cov_NT = token_covariance(logp_NT, adv_NT, mask_NT)
    # Tokens the PPO clip already stopped are not candidates.
    in_band_NT = mask_NT.bool() & ~was_clipped_NT.bool() & (cov_NT > cov_low) & (cov_NT < cov_high)
    candidates_K = in_band_NT.flatten().nonzero().squeeze(1)
    count = min(len(candidates_K), max(int(clip_cov_ratio * float(mask_NT.sum())), 1))
    order_K = torch.randperm(len(candidates_K), generator=generator)[:count].to(candidates_K.device)
    selected_NT = torch.zeros_like(in_band_NT).flatten()
    selected_NT[candidates_K[order_K]] = True
    return selected_NT.view_as(in_band_NT)


@declare(inputs=("selected_NT",), knobs={"kl_cov_ratio": "algo.kl_cov_ratio",
                                        "kl_cov_coef": "algo.kl_cov_coef"})
def kl_cov(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, *,
           kl_cov_ratio: float = 2e-3, kl_cov_coef: float = 1.0, selected_NT: torch.Tensor | None = None,
           ) -> tuple[torch.Tensor, Metrics]:
    """Unclipped surrogate -rho A, plus kl_cov_coef |logp - old_logp| on the `selected_NT` tokens
    (without a selection: the top `kl_cov_ratio` share of these tokens by covariance). (N, T) -> loss_NT."""
    log_ratio_NT = logp_NT - old_logp_NT
    ratio_NT = torch.exp(log_ratio_NT)
    loss_NT = -ratio_NT * adv_NT
    if selected_NT is None:
        selected_NT = kl_cov_selection(logp_NT, old_logp_NT, adv_NT, mask_NT, kl_cov_ratio=kl_cov_ratio)
    loss_NT = torch.where(selected_NT, loss_NT + kl_cov_coef * log_ratio_NT.abs(), loss_NT)
    metrics = {"ratio_mean": masked_mean(ratio_NT.detach(), mask_NT),
               "cov_penalised_frac": masked_mean(selected_NT.float(), mask_NT)}
    return loss_NT, metrics


@declare(inputs=("generator",), knobs={"kl_cov_ratio": "algo.kl_cov_ratio"})
def kl_cov_selection(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor,
                     *, kl_cov_ratio: float = 2e-3, generator: torch.Generator | None = None) -> torch.Tensor:
    """KL-Cov's penalised tokens: the max(int(kl_cov_ratio * tokens), 1) of highest covariance. (N, T) bool."""
    cov_NT = token_covariance(logp_NT, adv_NT, mask_NT).masked_fill(~mask_NT.bool(), -torch.inf)
    count = min(int(mask_NT.sum()), max(int(kl_cov_ratio * float(mask_NT.sum())), 1))
    top_K = cov_NT.flatten().topk(count).indices
    selected_NT = torch.zeros(cov_NT.numel(), dtype=torch.bool, device=cov_NT.device)
    selected_NT[top_K] = True
    return selected_NT.view_as(cov_NT)


def token_covariance(logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """(logp_t - mean logp)(A_t - mean A), means over the masked tokens; no gradient. (N, T)."""
    logp_NT = logp_NT.detach()
    return (logp_NT - masked_mean(logp_NT, mask_NT)) * (adv_NT - masked_mean(adv_NT, mask_NT))


@declare(knobs={"sapo_tau_pos": "algo.sapo_tau_pos", "sapo_tau_neg": "algo.sapo_tau_neg"})
def sapo(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, *,
         sapo_tau_pos: float = 1.0, sapo_tau_neg: float = 1.05) -> tuple[torch.Tensor, Metrics]:
    """Soft gate (4/tau) sigmoid(tau (rho - 1)) on the advantage, tau by the advantage's sign. (N, T) -> loss_NT."""
    if sapo_tau_pos <= 0 or sapo_tau_neg <= 0:
        raise ValueError(f"sapo temperatures must be > 0, got {sapo_tau_pos} and {sapo_tau_neg}")
    ratio_NT = torch.exp(logp_NT - old_logp_NT)
    tau_NT = torch.where(adv_NT > 0, sapo_tau_pos, sapo_tau_neg).to(ratio_NT.dtype)
    gate_NT = torch.sigmoid(tau_NT * (ratio_NT - 1.0))
    with torch.no_grad():
        # The factor on REINFORCE's gradient: 4 s (1 - s) rho, 1 on-policy.
        weight_NT = 4.0 * gate_NT * (1.0 - gate_NT) * ratio_NT
        metrics = {"ratio_mean": masked_mean(ratio_NT, mask_NT), "gate_weight_mean": masked_mean(weight_NT, mask_NT)}
    return -(4.0 / tau_NT) * gate_NT * adv_NT, metrics


@declare(knobs=_DPPO)
def dppo_tv(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, *,
            dppo_delta_low: float = 0.15, dppo_delta_high: float = 0.15, dppo_ratio_cap: float = 10.0,
            ) -> tuple[torch.Tensor, Metrics]:
    """DPPO with the binary total-variation trust region. (N, T) -> loss_NT."""
    p_NT, q_NT = torch.exp(logp_NT.detach()), torch.exp(old_logp_NT)
    outside_NT = ((adv_NT > 0) & (p_NT - q_NT > dppo_delta_high)) | ((adv_NT < 0) & (q_NT - p_NT > dppo_delta_low))
    return _trust_region_masked(logp_NT, old_logp_NT, adv_NT, mask_NT, outside_NT, dppo_ratio_cap)


@declare(knobs=_DPPO)
def dppo_kl(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, *,
            dppo_delta_low: float = 0.05, dppo_delta_high: float = 0.05, dppo_ratio_cap: float = 10.0,
            ) -> tuple[torch.Tensor, Metrics]:
    """DPPO with the binary KL trust region. (N, T) -> loss_NT."""
    p_NT, q_NT = torch.exp(logp_NT.detach()), torch.exp(old_logp_NT)
    eps = 1e-8
    divergence_NT = q_NT * torch.log((q_NT + eps) / (p_NT + eps)) + \
        (1 - q_NT) * torch.log((1 - q_NT + eps) / (1 - p_NT + eps))
    outside_NT = (((adv_NT > 0) & (divergence_NT > dppo_delta_high) & (p_NT > q_NT))
                  | ((adv_NT < 0) & (divergence_NT > dppo_delta_low) & (p_NT < q_NT)))
    return _trust_region_masked(logp_NT, old_logp_NT, adv_NT, mask_NT, outside_NT, dppo_ratio_cap)


def _trust_region_masked(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor,
                         mask_NT: torch.Tensor, outside_NT: torch.Tensor, ratio_cap: float,
                         ) -> tuple[torch.Tensor, Metrics]:
    """-sg(min(rho, cap)) A logp on the tokens inside the trust region, 0 outside."""
    ratio_NT = torch.exp(logp_NT.detach() - old_logp_NT)
    kept_NT = (~outside_NT).to(logp_NT.dtype)
    metrics = {"clip_frac": masked_mean(outside_NT.float(), mask_NT), "ratio_mean": masked_mean(ratio_NT, mask_NT)}
    return -ratio_NT.clamp(max=ratio_cap) * kept_NT * adv_NT * logp_NT, metrics


@declare(inputs=("sampling_logp_NT",))
def topr(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, *,
         sampling_logp_NT: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """Tapered off-policy REINFORCE: weight 1 on sequences with A >= 0, their product ratio to the
    sampler clipped to [0, 1] on the others (the sampler defaults to pi_old). (N, T) -> loss_NT."""
    behaviour_NT = old_logp_NT if sampling_logp_NT is None else sampling_logp_NT
    log_ratio_N = ((logp_NT.detach() - behaviour_NT) * mask_NT).sum(dim=1)
    negative_N = _row_mean(adv_NT, mask_NT) < 0
    weight_N = torch.where(negative_N, torch.exp(log_ratio_N.clamp(max=0.0)), torch.ones_like(log_ratio_N))
    metrics = {"seq_weight_mean": masked_mean(weight_N[:, None].expand_as(mask_NT), mask_NT),
               "ratio_mean": masked_mean(torch.exp(logp_NT.detach() - old_logp_NT), mask_NT)}
    return -weight_N[:, None] * adv_NT * logp_NT, metrics


def _clipped_surrogate(ratio_NT: torch.Tensor, adv_NT: torch.Tensor, clip_low: float, clip_high: float,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    unclipped_NT = ratio_NT * adv_NT
    clipped_NT = torch.clamp(ratio_NT, 1.0 - clip_low, 1.0 + clip_high) * adv_NT
    return -torch.minimum(unclipped_NT, clipped_NT), (clipped_NT < unclipped_NT).detach().float()


def _row_mean(x_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    return (x_NT * mask_NT).sum(dim=1) / mask_NT.sum(dim=1).clamp(min=1)


OBJECTIVES: dict[str, Callable[..., tuple[torch.Tensor, Metrics]]] = {
    "reinforce": reinforce,
    "ppo_clip": ppo_clip,
    "gspo": gspo,
    "cispo": cispo,
    "gmpo": gmpo,
    "clip_cov": clip_cov,
    "kl_cov": kl_cov,
    "sapo": sapo,
    "dppo_tv": dppo_tv,
    "dppo_kl": dppo_kl,
    "topr": topr,
}

# Objectives whose token choice is a statistic of the whole optimizer step: the learner calls the
# selection once per optimizer step over all of its sequences and passes `selected_NT` on.
TOKEN_SELECTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "clip_cov": clip_cov_selection,
    "kl_cov": kl_cov_selection,
}
