"""The report's HTML page: self-contained (inline SVG, the rollouts embedded as JSON, vanilla
JavaScript), nothing fetched from the network; run text is escaped everywhere and the viewer writes
it with textContent only."""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from reasonrl.report.data import RolloutSample, Run, Series, alarm_steps, step_ranges
from reasonrl.report.plots import file_name
from reasonrl.report.settings import settings_of

# (label, dotted config key) shown in the summary when present.
CONFIG_HIGHLIGHTS = (
    ("model", "model.name"), ("task", "task.name"), ("verifier", "reward.verifier"),
    ("advantage", "algo.advantage"), ("objective", "algo.objective"), ("aggregation", "algo.aggregation"),
    ("KL coefficient", "algo.kl_coef"), ("prompts per step", "rollout.prompts_per_step"),
    ("group size", "rollout.group_size"), ("max new tokens", "rollout.max_new_tokens"),
    ("temperature", "rollout.temperature"), ("learning rate", "train.lr"), ("steps", "train.steps"),
    ("LoRA rank", "train.lora_rank"), ("seed", "run.seed"))
HEADLINE_EVAL = ("eval/greedy_accuracy", "eval/sampled_accuracy")


def render_page(run: Run, svgs: Mapping[str, str], compute_svgs: Mapping[str, str] | None = None) -> str:
    name = html.escape(run.directory.resolve().name)
    sections = [_notes(run), _alarms(run.series), _summary(run), _curves(svgs), _eval_table(run.series), _compute(compute_svgs or {}),
                _viewer(run.rollouts),
                _reward_errors(run.reward_errors), _config(run.config_text)]
    parts = {"TITLE": f"reasonrl report: {name}", "BODY": "\n".join(sections), "SCRIPT": _SCRIPT}
    # One pass: run text inside the body that happens to read "@SCRIPT@" stays as it is.
    return re.sub(r"@(TITLE|BODY|SCRIPT)@", lambda match: parts[match.group(1)], _PAGE)


def embed_json(value: Any) -> str:
    """JSON safe inside a <script> element: <, > and & as \\u escapes, so no "</script>" (or "<!--") in
    the data can end the element early; JSON.parse reads them back as the same characters."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _alarms(series: Mapping[str, Series]) -> str:
    fired = {name: steps for name, steps in alarm_steps(series).items() if steps}
    if not fired:
        return ""
    rows = "".join(f"<li><b>{html.escape(name)}</b> at steps {step_ranges(steps)}</li>" for name, steps in fired.items())
    return ('<section id="alarms" class="alarms"><h2>&#9888; Alarms</h2><ul>' + rows + "</ul>"
            "<p>What each means and what to do: docs/troubleshooting.md. The console showed the numbers.</p></section>")


def _notes(run: Run) -> str:
    if not run.notes:
        return ""
    return '<div class="notes">' + "".join(f"<p>{html.escape(note)}</p>" for note in run.notes) + "</div>"


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _summary(run: Run) -> str:
    rows = [(label, _lookup(run.config, key)) for label, key in CONFIG_HIGHLIGHTS]
    config_rows = "".join(f"<tr><th>{html.escape(label)}</th><td>{html.escape(_fmt(value))}</td></tr>"
                          for label, value in rows if value is not None)
    train_steps = [s for key, line in run.series.items() if not key.startswith("eval/") for s in line.steps]
    last_step = max(train_steps, default=0)
    planned = _lookup(run.config, "train.steps")
    facts = [("settings", settings_of(run.config).describe()),
             ("steps logged", f"{last_step}" + (f" of {planned}" if planned else ""))]
    if planned and last_step < planned:
        facts.append(("status", "stopped early or still running"))
    if "perf/step_s" in run.series:
        facts.append(("training time", f"{sum(v for v in run.series['perf/step_s'].values if math.isfinite(v)):.1f} s"))
    if "reward/mean" in run.series:
        rewards = run.series["reward/mean"].values
        tail = rewards[-5:]
        facts.append(("reward/mean", (f"first step {rewards[0]:.4g}, last {rewards[-1]:.4g}, "
                                      f"mean of the last {len(tail)} steps {sum(tail) / len(tail):.4g}")))
    for key in HEADLINE_EVAL:
        if key in run.series:
            line = run.series[key]
            change = f"{line.values[-1] - line.values[0]:+.4g}"
            before = f"{line.values[0]:.4g} at step {line.steps[0]}"
            after = f"{line.values[-1]:.4g} at step {line.steps[-1]}"
            facts.append((key, f"{before} → {after} ({change})"))
    facts.append(("checkpoints", ", ".join(run.checkpoints) or "none"))
    if run.reward_errors:
        facts.append(("groups with a failed reward", str(len(run.reward_errors))))
    fact_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return (f'<section id="summary"><h2>Summary</h2><p class="dir">{html.escape(str(run.directory.resolve()))}</p>'
            f'<div class="cols"><table class="kv">{fact_rows}</table><table class="kv">{config_rows}</table></div>'
            "</section>")


def _curves(svgs: Mapping[str, str]) -> str:
    figures = "".join(f'<figure class="plot" id="plot-{file_name(family)}" data-family="{html.escape(family)}">'
                      f"{svg}</figure>" for family, svg in svgs.items())
    return f'<section id="curves"><h2>Training curves</h2>{figures}</section>'


def _compute(svgs: Mapping[str, str]) -> str:
    if not svgs:
        return ""
    figures = "".join(f'<figure class="plot" id="compute-{file_name(name)}">{svg}</figure>'
                      for name, svg in svgs.items())
    return f'<section id="compute"><h2>Accuracy against compute</h2>{figures}</section>'


def _eval_table(series: Mapping[str, Series]) -> str:
    keys = sorted(key for key in series if key.startswith("eval/"))
    if not keys:
        return '<section id="eval"><h2>Evaluation</h2><p>No eval/* metrics in this run.</p></section>'
    steps = sorted({s for key in keys for s in series[key].steps})
    head = "".join(f"<th>step {s}</th>" for s in steps)
    body = []
    for key in keys:
        by_step = dict(zip(series[key].steps, series[key].values))
        cells = "".join(f"<td>{_fmt(by_step[s]) if s in by_step else ''}</td>" for s in steps)
        values = series[key].values
        change = f"{values[-1] - values[0]:+.4g}" if len(values) > 1 else ""
        body.append(f"<tr><th>{html.escape(key)}</th>{cells}<td>{change}</td></tr>")
    return (f'<section id="eval"><h2>Evaluation</h2><table class="grid" id="eval-table"><tr><th>metric</th>{head}'
            f"<th>change</th></tr>{''.join(body)}</table></section>")


def _viewer(rollouts: RolloutSample) -> str:
    shown = list(rollouts.groups_by_step)
    if not shown:
        return '<section id="rollouts"><h2>Rollouts</h2><p>No rollouts logged.</p></section>'
    cap = ("" if len(shown) == len(rollouts.all_steps) else
           f'<p class="cap">Showing the rollouts of the last {len(shown)} of {len(rollouts.all_steps)} logged steps '
           f"(steps {shown[0]}–{shown[-1]}), to keep the page small: <code>reasonrl report RUN_DIR "
           "--rollout-steps N</code> embeds more (0: all).</p>")
    data = {"steps": shown, "groups": {str(step): groups for step, groups in rollouts.groups_by_step.items()},
            "components": list(rollouts.components)}
    return f"""<section id="rollouts"><h2>Rollouts</h2>{cap}
<p class="rule">Correct: the "correct" reward component at full credit, 1 (without that component: reward &gt; 0).
Truncated: generation hit the token limit (finish reason "length").</p>
<div class="controls">
 <button id="prev" type="button">&larr;</button>
 <label>step <select id="step"></select></label>
 <button id="next" type="button">&rarr;</button>
 <label>show <select id="filter"><option value="all">all</option><option value="correct">correct</option>
 <option value="incorrect">incorrect</option><option value="truncated">truncated</option></select></label>
 <label>problem <input id="search" type="search" placeholder="id or prompt text"></label>
 <span id="count"></span>
</div>
<div id="groups"></div>
<script type="application/json" id="rollout-data">{embed_json(data)}</script>
</section>"""


def _reward_errors(errors: Sequence[Mapping[str, Any]], shown: int = 50) -> str:
    if not errors:
        return ""
    rows = "".join(f"<tr><td>{html.escape(str(e.get('step')))}</td><td>{html.escape(str(e.get('problem_id')))}</td>"
                   f"<td><pre>{html.escape(str(e.get('error')))}</pre></td></tr>" for e in errors[-shown:])
    more = f" (the last {shown})" if len(errors) > shown else ""
    return (f'<section id="reward-errors"><h2>Failed rewards: {len(errors)} groups{more}</h2>'
            f'<table class="grid"><tr><th>step</th><th>problem</th><th>error</th></tr>{rows}</table></section>')


def _config(config_text: str) -> str:
    return (f'<section id="config"><h2>Config</h2><details><summary>config.toml</summary>'
            f"<pre>{html.escape(config_text)}</pre></details></section>")

# Shared with the comparison page (reasonrl.report.compare).
STYLE = """body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1400px; padding: 0 1.5em 3em; color: #222; }
nav { position: sticky; top: 0; background: #fff; padding: .5em 0; border-bottom: 1px solid #ddd; z-index: 1; }
nav a { margin-right: 1.2em; }
h2 { margin-top: 1.6em; border-bottom: 1px solid #eee; }
.dir { color: #666; font-family: monospace; }
.cols { display: flex; gap: 3em; flex-wrap: wrap; align-items: flex-start; }
table.kv th { text-align: left; padding-right: 1.5em; font-weight: 600; }
table.grid { border-collapse: collapse; font-size: 90%; }
table.grid th, table.grid td { border: 1px solid #ddd; padding: .2em .6em; text-align: right; vertical-align: top; }
table.grid th:first-child { text-align: left; }
table.grid td.text { text-align: left; }
figure.plot { margin: 1em 0; }
#eval { overflow-x: auto; }
figure.plot svg { max-width: 100%; height: auto; }
.alarms { background: #fde2e1; border: 2px solid #d9534f; padding: .3em 1em; margin-top: 1em; }
.notes { background: #fff6d6; border: 1px solid #e8d48a; padding: .3em 1em; margin-top: 1em; }
.cap, .rule { color: #555; font-size: 90%; }
.controls { display: flex; gap: 1em; align-items: center; flex-wrap: wrap; margin: .8em 0; }
.group { border: 1px solid #ddd; border-radius: 6px; margin: .8em 0; padding: .4em .8em; }
.group h3 { font-size: 100%; margin: .3em 0; }
.group .stats { color: #555; font-weight: normal; margin-left: 1em; }
.completion { border-left: 4px solid #bbb; margin: .5em 0; padding: .1em .6em; background: #fafafa; }
.completion.correct { border-left-color: #2a9d4b; }
.completion.incorrect { border-left-color: #d04a3a; }
.meta { font-size: 85%; color: #444; }
.badge { display: inline-block; padding: 0 .4em; border-radius: 3px; background: #eee; margin-right: .4em; }
pre { white-space: pre-wrap; word-break: break-word; margin: .3em 0; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>@TITLE@</title>
<style>
""" + STYLE + """</style></head>
<body>
<nav><a href="#summary">Summary</a><a href="#curves">Curves</a><a href="#eval">Evaluation</a>
<a href="#rollouts">Rollouts</a><a href="#config">Config</a></nav>
<h1>@TITLE@</h1>
@BODY@
<script>@SCRIPT@</script>
</body></html>
"""

# The viewer writes run text with textContent only, never innerHTML: completions are untrusted text.
_SCRIPT = r"""
(function () {
  const source = document.getElementById("rollout-data");
  if (!source) return;
  const data = JSON.parse(source.textContent);
  const stepSelect = document.getElementById("step");
  const filterSelect = document.getElementById("filter");
  const search = document.getElementById("search");
  const groupsDiv = document.getElementById("groups");
  const count = document.getElementById("count");

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function num(value) {
    return typeof value === "number" ? (Number.isInteger(value) ? String(value) : value.toFixed(3)) : String(value);
  }
  const keep = {
    all: () => true,
    correct: (c) => c.correct,
    incorrect: (c) => !c.correct,
    truncated: (c) => c.truncated,
  };

  function render() {
    const groups = data.groups[stepSelect.value] || [];
    const wanted = keep[filterSelect.value];
    const query = search.value.trim().toLowerCase();
    groupsDiv.replaceChildren();
    let shown = 0, total = 0;
    for (const group of groups) {
      total += group.completions.length;
      const text = (String(group.problem_id) + " " + String(group.prompt)).toLowerCase();
      if (query && !text.includes(query)) continue;
      const matching = group.completions.filter(wanted);
      if (!matching.length) continue;
      shown += matching.length;
      const correct = group.completions.filter((c) => c.correct).length;
      const rewards = group.completions.map((c) => c.reward).filter((r) => typeof r === "number");
      const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : NaN;
      const box = el("div", "group");
      const title = el("h3", null, "problem " + group.problem_id);
      title.appendChild(el("span", "stats", correct + "/" + group.completions.length + " correct, mean reward "
        + num(mean) + ", answer: " + group.answer));
      box.appendChild(title);
      const prompt = el("details");
      prompt.appendChild(el("summary", null, "prompt"));
      prompt.appendChild(el("pre", null, group.prompt));
      box.appendChild(prompt);
      for (const c of matching) {
        const card = el("div", "completion " + (c.correct ? "correct" : "incorrect"));
        card.dataset.correct = c.correct;
        card.dataset.truncated = c.truncated;
        const meta = el("div", "meta");
        meta.appendChild(el("span", "badge", c.correct ? "correct" : "incorrect"));
        meta.appendChild(el("span", "badge", "reward " + num(c.reward)));
        for (const [name, value] of Object.entries(c.components)) {
          meta.appendChild(el("span", "badge", name + " " + num(value)));
        }
        meta.appendChild(el("span", "badge", "advantage " + num(c.advantage)));
        meta.appendChild(el("span", "badge", "finish " + c.finish_reason + (c.truncated ? " (truncated)" : "")));
        meta.appendChild(el("span", "badge", c.num_tokens + " tokens"));
        card.appendChild(meta);
        card.appendChild(el("pre", "text", c.text));
        box.appendChild(card);
      }
      groupsDiv.appendChild(box);
    }
    count.textContent = shown + " of " + total + " completions at step " + stepSelect.value;
  }

  for (const step of data.steps) stepSelect.appendChild(el("option", null, String(step)));
  stepSelect.value = String(data.steps[data.steps.length - 1]);
  function move(by) {
    const index = Math.min(Math.max(stepSelect.selectedIndex + by, 0), data.steps.length - 1);
    stepSelect.selectedIndex = index;
    render();
  }
  document.getElementById("prev").addEventListener("click", () => move(-1));
  document.getElementById("next").addEventListener("click", () => move(1));
  stepSelect.addEventListener("change", render);
  filterSelect.addEventListener("change", render);
  search.addEventListener("input", render);
  render();
})();
"""
