"""Each recipe's header states its readings (arithmetic at the default job's rate, with overlong filtering
where it was measured, spelling at the recipe's own rate over seeds 0-2 and over seeds 0-5, and with groups kept
by reward where that was measured): the numbers must be those of the summaries in benchmarks/results, so that a record rerun, or a
seed added, cannot leave a header quoting the old interval."""

from __future__ import annotations

import json
import re
import statistics
from typing import NamedTuple

import pytest
from benchmarks.runs import RESULTS

from reasonrl.recipes import PACKAGED_RECIPES

READING = re.compile(r"a median of (-?[\d.]+)%(?: over seeds 0-2)? \(mean (-?[\d.]+)% \[(-?[\d.]+), (-?[\d.]+)\], "
                     r"(-?[\d.]+) points wide")


class Summary(NamedTuple):
    opening: str  # where the header's reading begins
    file: str  # the summary under benchmarks/results
    task: str
    every_recipe_read: bool  # whether each recipe of the summary must give this reading
    at_least: int  # how many headers must quote it


SUMMARIES = {
    "default_rate": Summary("At the default job's rate", "recipes_default_rate.json", "arithmetic", True, 23),
    "masked": Summary("With sampling.mask_truncated=true as well", "recipes_default_rate_masked.json", "arithmetic",
                      False, 6),
    "spelling_own_rate": Summary("On spelling at its own rate", "recipes_own_rate_spelling.json", "spelling", True, 23),
    "spelling_keep_reward": Summary('With sampling.dynamic_keep = "reward" as well',
                                    "recipes_own_rate_keep_reward_spelling.json", "spelling", True, 4),
    "spelling_six_seeds": Summary("Over seeds 0-5 on spelling", "recipes_own_rate_spelling_6seeds.json", "spelling",
                                  True, 23),
}


def header_text(recipe: str) -> str:
    lines = (PACKAGED_RECIPES / f"{recipe}.toml").read_text().splitlines()
    return " ".join(line[2:] for line in lines if line.startswith("# "))


def stated(recipe: str, opening: str) -> tuple[float, ...] | None:
    text = header_text(recipe)
    if opening not in text:
        return None
    found = READING.search(text, text.index(opening))
    assert found, f"{recipe}: no reading after {opening!r}"
    return tuple(float(group) for group in found.groups())


def measured(result: dict) -> tuple[float, ...]:
    median = statistics.median(seed["after"] for seed in result["seeds"])
    return (100 * median, 100 * result["after_mean"], 100 * result["after_ci_low"], 100 * result["after_ci_high"],
            100 * result["ci_width"])


@pytest.mark.parametrize("reading", SUMMARIES)
def test_each_header_quotes_the_summary_it_names(reading):
    opening, file, task, every_recipe_read, at_least = SUMMARIES[reading]
    results = json.loads((RESULTS / file).read_text())["tasks"][task]
    quoted = 0
    for recipe in sorted(results):
        numbers = stated(recipe, opening)
        assert numbers is not None or not every_recipe_read, f"{recipe}'s header does not give its {reading} reading"
        if numbers is None:
            continue
        median, *rounded = measured(results[recipe])
        assert numbers[0] == pytest.approx(median, abs=0.006), recipe  # the median to two decimals
        assert numbers[1:] == pytest.approx(rounded, abs=0.051), recipe  # the rest to one
        quoted += 1
    assert quoted >= at_least
