"""The HTML run report: plots, evaluation tables and the rollout viewer, from a run directory written
by hand (the files the trainer writes), checked as text and, when Chromium is installed, in a browser."""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
from pathlib import Path

import pytest
from helpers import SCRIPT_BREAKER, STEP3, write_run

from reasonrl.report import RunDirError, embed_json, is_correct, load_run, render_page, trailing_mean, write_report

FAMILIES = ("reward", "eval", "loss", "kl", "entropy", "rollout", "perf", "source")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(write_run(tmp_path_factory.mktemp("report") / "run"))


def embedded_rollouts(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="rollout-data">(.*?)</script>', page, re.DOTALL)
    assert match, "no embedded rollout data"
    return json.loads(match.group(1))


def test_page_holds_plots_tables_and_rollouts_without_external_resources(report):
    page = report.read_text()
    assert report == report.parent / "report.html"
    for family in FAMILIES:
        assert re.search(rf'<figure class="plot" id="plot-{family}" data-family="{family}"><svg', page), family
    # Every link and source is a fragment of the page itself: nothing is fetched.
    assert all(ref.startswith("#") for ref in re.findall(r'(?:src|href)="([^"]*)"', page))
    assert "<link" not in page and "@import" not in page
    eval_table = re.search(r'<table class="grid" id="eval-table">.*?</table>', page, re.DOTALL).group(0)
    assert "<th>step 0</th><th>step 3</th>" in eval_table
    assert "<tr><th>eval/greedy_accuracy</th><td>0.25</td><td>0.75</td><td>+0.5</td></tr>" in eval_table
    assert "0.25 at step 0 → 0.75 at step 3 (+0.5)" in page  # the summary's before/after
    assert "tiny-llama" in page and "3 of 3" in page


def test_embedded_data_cannot_end_its_script_element(report):
    page = report.read_text()
    assert SCRIPT_BREAKER not in page and "</script><script>window.pwned" not in page
    data = embedded_rollouts(page)
    assert data["steps"] == [1, 2, 3]
    texts = [c["text"] for group in data["groups"]["3"] for c in group["completions"]]
    assert texts == [text for _, text, *_ in STEP3]  # the text comes back exactly
    assert json.loads(embed_json("</script>&<!--")) == "</script>&<!--"


def test_plots_are_also_png_files(report):
    for family in FAMILIES:
        png = (report.parent / "plots" / f"{family}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n", family
        width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk's first fields
        assert width > 100 and height > 100, (family, width, height)


def test_correct_is_the_correct_component_else_a_positive_reward():
    assert is_correct({"reward": 0.1, "components": {"correct": 0.0, "format": 0.1}}) is False  # a format bonus alone
    assert is_correct({"reward": 1.1, "components": {"correct": 1.0, "format": 0.1}}) is True
    assert is_correct({"reward": 0.5, "components": {"custom": 0.5}}) is True
    assert is_correct({"reward": 0.0, "components": {}}) is False
    assert is_correct({"reward": None, "components": {}}) is False


def test_trailing_mean_leaves_out_nan():
    # Window 2 over [1, 3, nan, 5]: [1] -> 1; [1, 3] -> 2; [3, nan] -> 3; [nan, 5] -> 5; [nan] alone -> nan.
    assert trailing_mean([1.0, 3.0, math.nan, 5.0], 2) == [1.0, 2.0, 3.0, 5.0]
    assert math.isnan(trailing_mean([math.nan], 3)[0])


def test_rollouts_are_capped_to_the_newest_steps_and_the_page_says_so(tmp_path):
    run_dir = write_run(tmp_path / "run")
    assert list(load_run(run_dir, rollout_steps=2).rollouts.groups_by_step) == [2, 3]
    # Step 3 alone holds 6 prompts of 10 characters plus its completions: a 200-character budget keeps it alone.
    run = load_run(run_dir, rollout_steps=0, rollout_chars=200)
    assert list(run.rollouts.groups_by_step) == [3] and run.rollouts.all_steps == (1, 2, 3)
    groups = run.rollouts.groups_by_step[3]
    assert [(g["problem_id"], len(g["completions"])) for g in groups] == [("p1", 3), ("p2", 3)]
    assert "Showing the rollouts of the last 1 of 3 logged steps (steps 3–3)" in render_page(run, svgs={})


def test_missing_files_and_empty_runs_are_errors_naming_what_is_missing(tmp_path):
    with pytest.raises(RunDirError, match=f"run directory {tmp_path / 'nowhere'} does not exist"):
        write_report(tmp_path / "nowhere")
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "metrics.jsonl").write_text("")
    with pytest.raises(RunDirError, match=r"runs is not a run directory: config.toml, metrics.jsonl missing; run "
                                          r"directories inside it: .*runs/a"):
        write_report(tmp_path / "runs")
    (tmp_path / "runs" / "a" / "config.toml").write_text("")
    with pytest.raises(RunDirError, match=r"a/metrics.jsonl is empty: the run has not logged its first step"):
        write_report(tmp_path / "runs" / "a")


def test_command_parses_its_options_and_reports_a_bad_run_dir_with_exit_code_2(tmp_path, capsys):
    import argparse

    from reasonrl.commands.report import add_report_parser, run_report_command

    parser = argparse.ArgumentParser()
    add_report_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", str(tmp_path / "nowhere"), "--rollout-steps", "5", "--out", "r.html"])
    assert (args.rollout_steps, args.rollout_mb, args.out) == (5, 30.0, "r.html")
    assert run_report_command(args) == 2
    assert f"reasonrl report: run directory {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err


def test_a_cut_off_last_line_is_skipped_and_a_corrupt_line_is_an_error(tmp_path):
    run_dir = write_run(tmp_path / "run")
    with (run_dir / "rollouts.jsonl").open("a") as f:
        f.write('{"step": 4, "problem_id": "p1", "comp')  # a run killed mid-write
    run = load_run(run_dir)
    assert list(run.rollouts.groups_by_step) == [1, 2, 3]
    assert any("skipped the cut-off last line 19" in note for note in run.notes)
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, oops}\n{"step": 3, "reward/mean": 0.5}\n')
    with pytest.raises(RunDirError, match=r"metrics.jsonl:2 is not valid JSON"):
        load_run(run_dir)


# ------------------------------------------------------------------------------------------- in a browser

def chrome_driver():
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                 "--window-size=1300,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))


def test_page_in_a_browser_plots_render_and_filters_show_the_expected_completions(report):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = chrome_driver()
    try:
        driver.get(report.as_uri())
        sizes = driver.execute_script(
            "return [...document.querySelectorAll('figure.plot > svg')].map(s => s.getBoundingClientRect())"
            ".map(r => [r.width, r.height]);")
        assert len(sizes) == len(FAMILIES) and all(w > 100 and h > 100 for w, h in sizes), sizes

        def shown() -> list[str]:
            texts = driver.find_elements(By.CSS_SELECTOR, ".completion pre.text")
            return [e.get_attribute("textContent") for e in texts]

        step, show = Select(driver.find_element(By.ID, "step")), Select(driver.find_element(By.ID, "filter"))
        assert step.first_selected_option.text == "3"  # the newest step first
        texts = {letter: text for letter, text in zip("abcdef", (t for _, t, *_ in STEP3))}
        assert shown() == list(texts.values())
        expected = {"correct": "acf", "incorrect": "bde", "truncated": "bc", "all": "abcdef"}
        for value, letters in expected.items():
            show.select_by_value(value)
            assert shown() == [texts[letter] for letter in letters], value
        assert driver.find_element(By.ID, "count").text == "6 of 6 completions at step 3"
        step.select_by_visible_text("1")
        assert len(shown()) == 6 and shown()[0] == "step 1 p1 0"
        show.select_by_value("correct")
        assert shown() == ["step 1 p1 0", "step 1 p2 0"]
        driver.find_element(By.ID, "next").click()
        assert step.first_selected_option.text == "2" and shown() == ["step 2 p1 0", "step 2 p2 0"]
        assert driver.execute_script("return window.pwned === undefined;")
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == []
    finally:
        driver.quit()


def test_eval_outputs_add_accuracy_against_compute_plots(tmp_path):
    run_dir = write_run(tmp_path / "run")
    eval_dir = tmp_path / "eval_step40"
    eval_dir.mkdir()
    curve = {"majority": [{"budget": 1, "accuracy": 0.2, "tokens": 40.0},
                          {"budget": 4, "accuracy": 0.35, "tokens": 160.0}],
             "beam": [{"budget": 2, "accuracy": 0.3, "tokens": 90.0}, {"budget": 4, "accuracy": 0.5, "tokens": 210.0}]}
    (eval_dir / "results.json").write_text(json.dumps({"tasks": {"gsm8k": {"tts": curve}, "aime24": {"tts": {}}}}))
    page = write_report(run_dir, eval_dirs=[eval_dir]).read_text()
    section = page[page.index('<section id="compute">'):]
    section = section[: section.index("</section>")]
    assert section.count("<svg") == 1  # gsm8k only: aime24 has no curves
    assert "eval_step40/gsm8k" in section and "majority" in section and "beam" in section
    assert (run_dir / "plots" / "compute_eval_step40_gsm8k.png").stat().st_size > 1000
    with pytest.raises(RunDirError, match="results.json does not exist"):
        write_report(run_dir, eval_dirs=[tmp_path / "nowhere"])
    assert '<section id="compute">' not in write_report(run_dir).read_text()


def test_a_file_is_named_a_file_not_a_missing_directory(tmp_path):
    run_dir = write_run(tmp_path / "run")
    with pytest.raises(RunDirError, match=r"metrics.jsonl is a file, not a run directory: .*pass that"):
        write_report(run_dir / "metrics.jsonl")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(RunDirError, match=r"notes.txt is a file, not a run directory"):
        write_report(tmp_path / "notes.txt")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.json").write_text("{}")
    with pytest.raises(RunDirError, match=r"results.json is a file, not a directory: .*eval, here"):
        write_report(run_dir, eval_dirs=[tmp_path / "eval" / "results.json"])
