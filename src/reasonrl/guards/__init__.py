"""Guards against a run that looks normal and is not (docs/troubleshooting.md).

- `sync_check`: after every weight sync, the engine's log-probs on a small fixed probe against the
  learner's; a sync that changed nothing or a large gap stops the run, naming the backend.
- `alarms`: thresholds and the monitor over a run's per-step metrics (entropy collapse, reward
  hacking, length and truncation surges, clipping outliers, KL blow-up, groups without gradient,
  gradient norm); `alarm_participant` hands it each step's metrics as a participant of the loop.
- `watchdog`: each phase of a step timed against its running median; a hang prints every thread's
  stack, once.

`alarms` and `watchdog` import nothing of the loop (the config reads the alarm names); `sync_check`
and `alarm_participant` are participants and sit at the loop's level.
"""
