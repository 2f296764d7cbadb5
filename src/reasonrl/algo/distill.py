"""On-policy distillation: the per-token advantage of the reverse KL to a teacher.

Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from Self-Generated
Mistakes" (GKD) with the reverse KL and only the student's own samples (lambda = 1); the Qwen3
report (2025, "strong-to-weak distillation") also distils on the student's samples. Thinking
Machines' "On-Policy Distillation" (Lu 2025) trains it as RL, as here: the student samples, the
teacher scores the student's tokens, and each token's advantage is the negative single-sample
reverse KL,

    A_t = -(log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t)),

with the student's log-prob taken from the sampler (no extra forward pass), no discount (each token
gets only its own term: gamma = 0) and no group normalisation; the loss is the importance-sampled
policy gradient of RL. Mixed with a verifiable reward (KL-regularised RL whose reference is the
teacher): A_t = reward_weight * A_reward_t + weight * (-reverse KL_t).
"""

from __future__ import annotations

import torch

from reasonrl.algo.objectives import masked_mean


def reverse_kl_advantages(advantages_NT: torch.Tensor, student_logp_NT: torch.Tensor, teacher_logp_NT: torch.Tensor,
                          mask_NT: torch.Tensor, *, weight: float = 1.0, reward_weight: float = 1.0,
                          ) -> tuple[torch.Tensor, dict[str, float]]:
    """The advantages with the distillation term: reward_weight * advantages_NT - weight *
    (student_logp_NT - teacher_logp_NT), zero outside `mask_NT`, all (N, T). The student's
    log-probs are the sampler's. Metrics: the mean per-token reverse KL estimate and the teacher's
    mean log-prob of the student's tokens."""
    if weight < 0 or reward_weight < 0:
        raise ValueError(f"distillation weights must be >= 0 (a negative weight trains away from the teacher or "
                         f"the reward); got weight={weight}, reward_weight={reward_weight}")
    reverse_kl_NT = (student_logp_NT - teacher_logp_NT) * mask_NT
    distilled_NT = (reward_weight * advantages_NT - weight * reverse_kl_NT) * mask_NT
    return distilled_NT, {"distill/reverse_kl": masked_mean(reverse_kl_NT, mask_NT).item(),
                          "distill/teacher_logp": masked_mean(teacher_logp_NT, mask_NT).item(),
                          "distill/student_logp": masked_mean(student_logp_NT, mask_NT).item()}
