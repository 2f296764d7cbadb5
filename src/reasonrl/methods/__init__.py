"""Methods: what a run adds to the core loop when its config asks for it, one module each, with the
method's config reading, its state, its participant and `build(cfg, parts) -> Added`
(reasonrl.methods.parts): an estimation wrapper, participants, a wrapper of production's engine,
the KL coefficient's holder. The math stays in reasonrl.algo.

`METHODS` is the registry the builder walks, in order (reasonrl.build.build_methods): each build
sees what the methods before it added, and the order is behaviour: the critic joins the estimation
before distillation and PRIME wrap it (in that order), and the participants are called in this
order (guidance sees a group before replay changes it). A new method is a module here and a line
in `METHODS` (docs/architecture.md).

Methods sit below the loop: they import the layers under it (types, config, algo, rewards, sampling,
rollout, training, ...), never reasonrl.build, the trainer, the participants' container or the
stages; what they need from the run comes in `parts`.
"""

from reasonrl.methods import critic, distill, guidance, kl, prime, replay, tree
from reasonrl.methods.parts import Added, Method, RunParts

METHODS: tuple[Method, ...] = (critic, distill, prime, guidance, replay, kl, tree)

__all__ = ["METHODS", "Added", "Method", "RunParts"]
