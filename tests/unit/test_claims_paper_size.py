"""benchmarks/claims.py against the paper's effect: each stated effect names a test its claim has (a
misspelt label would test nothing), and the verdict is taken against that effect, not against zero."""

from __future__ import annotations

import pytest
from benchmarks.claims import CLAIMS, PAPER_EFFECTS, verdict
from benchmarks.claims import tests_against as claim_tests  # not collected as a test


@pytest.mark.parametrize("name", sorted(PAPER_EFFECTS))
def test_every_paper_effect_names_one_of_its_claims_tests(name):
    labels = {label for label, _, _ in CLAIMS[name].tests}
    assert set(PAPER_EFFECTS[name]) <= labels
    assert len(claim_tests(name, "paper")) == len(PAPER_EFFECTS[name])


def test_against_zero_keeps_the_claims_own_tests():
    assert claim_tests("cov", "zero") == CLAIMS["cov"].tests


def test_the_threshold_is_the_papers_effect():
    (label, fn, side), = claim_tests("dapo_clip_higher", "paper")
    assert side == ">0.297" and "+0.297" in label
    runs = {"clip_higher": {"curves": {"entropy/mean": [0.5] * 10}},
            "symmetric": {"curves": {"entropy/mean": [0.4] * 10}}}
    assert fn(runs) == pytest.approx(0.1)


def test_an_effect_clearly_above_zero_but_below_the_papers_contradicts_the_papers_size():
    values = [0.10, 0.12, 0.08, 0.11]  # mean 0.1025, sd 0.017: interval [0.075, 0.130]
    assert verdict(values, ">0")["verdict"] == "reproduced"
    assert verdict(values, ">0.297")["verdict"] == "contradicted"
    assert verdict([0.40, 0.42, 0.44], ">0.297")["verdict"] == "reproduced"
    assert verdict([0.0, 0.6, 0.3], ">0.297")["verdict"] == "inconclusive"


def test_a_claim_short_of_its_planned_seeds_has_no_verdict(monkeypatch):
    from benchmarks import claims

    def record(study, name):
        entropy = 0.5 if "clip_higher" in name else 0.4
        return {"curves": {"entropy/mean": [entropy] * 10}, "eval_last": {claims.ACCURACY: 0.5}}

    present = {"before", *(f"{arm}_seed{seed}" for arm in ("ppo_clip_mini4", "ppo_clip_mini4_clip_higher")
                           for seed in (0, 1))}
    monkeypatch.setattr(claims, "record_path", lambda study, name: type("P", (), {"exists": lambda self: name in present})())
    monkeypatch.setattr(claims, "read_record", record)
    complete = claims.run_claim("dapo_clip_higher", [0, 1], "claims/x", 20)
    short = claims.run_claim("dapo_clip_higher", [0, 1, 2, 3], "claims/x", 20)
    assert complete["verdict"] == "reproduced" and complete["seeds"] == [0, 1]
    assert short["verdict"] == "incomplete: 2 of 4 seeds"
    (test,) = short["tests"].values()
    assert (test["verdict"], test["interim_verdict"]) == ("incomplete", "reproduced")
