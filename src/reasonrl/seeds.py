"""Seeds derived from names: the same in every process and on every machine, so that a run's
random choices do not depend on how its work is split (steps, rounds, problems, sample rows)."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from (run seed, step, ...)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def derive_seed31(seed: int, *salt: object) -> int:
    """A stable 31-bit seed from `seed` and `salt`, for generators that take a 32-bit signed seed
    (an environment's problem streams): another hash than `derive_seed`'s, kept so that the problems
    a seed draws stay the same."""
    digest = hashlib.sha256("/".join(map(str, (seed, *salt))).encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def problem_seed(seed: int, index: int) -> int:
    """The sampling seed of the index-th problem of a call whose sampling seed is `seed`: a
    problem's samples then depend on (seed, index) only, not on the batch it is generated in."""
    return derive_seed(seed, "problem", index)
