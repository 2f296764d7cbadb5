"""`reasonrl report RUN_A RUN_B`: the comparison page names each run's recipe and overrides, lists
the settings that differ, overlays the curves (a line per run, in every family) and puts the
evaluations side by side; checked as text and, when Chromium is installed, in a browser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w
from helpers import write_run
from test_report import chrome_driver

from reasonrl.commands.cli import main
from reasonrl.report.compare import run_labels, write_comparison

GSPO = {"objective": "gspo", "aggregation": "seq_mean_token_mean", "clip_low": 3e-4, "clip_high": 4e-4}
GSPO_SAMPLING = {"mask_truncated": False}  # the recipe keeps the cut completions' loss


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("compare")
    plain = write_run(base / "plain")
    gspo = write_run(base / "gspo")
    config = {"algo": GSPO, "sampling": GSPO_SAMPLING, "train": {"mini_batches": 4, "lr": 2e-6, "steps": 3},
              "run": {"dir": str(gspo)}}
    (gspo / "config.toml").write_text(tomli_w.dumps(config))
    metrics = [json.loads(line) for line in (gspo / "metrics.jsonl").read_text().splitlines()]
    for line in metrics:  # the second run learns faster: its own curves and evaluations
        for key in ("reward/mean", "eval/greedy_accuracy"):
            if key in line:
                line[key] = min(1.0, 2 * line[key])
    (gspo / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in metrics))
    return plain, gspo


@pytest.fixture(scope="module")
def page(two_runs) -> Path:
    plain, gspo = two_runs
    return write_comparison([plain, gspo], plain.parent / "comparison.html")


def test_runs_are_named_by_recipe_and_overrides_with_the_settings_that_differ(page):
    text = page.read_text()
    assert "recipe gspo + train.lr=2e-06" in text
    assert "defaults + model.name=tiny-llama" in text  # the hand-written run: no recipe
    differences = text[text.index('id="differences-table"'):text.index("</table>", text.index('id="differences'))]
    for row in ("algo.objective</th><td>ppo_clip</td><td>gspo", "train.lr</th><td>1e-05</td><td>2e-06"):
        assert row in differences
    assert "train.steps" not in differences  # the same in both


def test_curves_overlay_every_run_and_evaluations_sit_side_by_side(page):
    text = page.read_text()
    figures = text.count('<figure class="plot"')
    assert figures == len(list((page.parent / "comparison_plots").glob("*.png"))) >= 6
    curves = text[text.index('id="curves"'):text.index('id="eval"')]
    assert curves.count(">plain<") >= figures and curves.count(">gspo<") >= figures  # a legend entry per panel
    evaluation = text[text.index('id="eval-table"'):]
    assert "eval/greedy_accuracy</th><td>0.75 (step 3)</td><td>1 (step 3)</td>" in evaluation
    runs = text[text.index('id="runs-table"'):text.index("</table>", text.index('id="runs-table"'))]
    assert "0.25 → 0.75 (+0.5; steps 0–3)" in runs and "0.5 → 1 (+0.5; steps 0–3)" in runs


def test_labels_are_the_shortest_unique_tails(tmp_path):
    assert run_labels([tmp_path / "a" / "run", tmp_path / "b" / "run", tmp_path / "c"]) == ["a/run", "b/run", "c"]
    assert run_labels([tmp_path / "x", tmp_path / "x"])[0].startswith("0: ")


def test_the_command_compares_several_runs_and_refuses_eval_outputs_with_them(two_runs, tmp_path, capsys):
    plain, gspo = two_runs
    out = tmp_path / "both.html"
    assert main(["report", str(plain), str(gspo), "--out", str(out)]) == 0
    assert out.is_file() and (tmp_path / "both_plots").is_dir()
    assert main(["report", str(plain), str(gspo), "--eval", str(tmp_path)]) == 2
    assert "--eval adds to one run's report" in capsys.readouterr().err
    with pytest.raises(ValueError, match="needs two runs or more"):
        write_comparison([plain])


def test_the_single_run_report_names_its_settings(two_runs, tmp_path):
    from reasonrl.report import write_report

    text = write_report(two_runs[1], tmp_path / "one.html").read_text()
    assert "<th>settings</th><td>recipe gspo + train.lr=2e-06 + train.steps=3</td>" in text


def test_comparison_in_a_browser_plots_render_with_a_legend_per_panel(page):
    driver = chrome_driver()
    try:
        driver.get(page.as_uri())
        sizes = driver.execute_script(
            "return [...document.querySelectorAll('figure.plot > svg')].map(s => s.getBoundingClientRect())"
            ".map(r => [r.width, r.height]);")
        assert sizes and all(w > 100 and h > 100 for w, h in sizes), sizes
        legend_texts = driver.execute_script(
            "return [...document.querySelectorAll('figure.plot svg text')].map(t => t.textContent);")
        assert legend_texts.count("plain") >= len(sizes) and legend_texts.count("gspo") >= len(sizes)
        rows = driver.execute_script("return document.querySelectorAll('#differences-table tr').length;")
        assert rows >= 3  # the header and a row per differing setting
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()
