"""A callback of your own: a participant (reasonrl.Participant) takes part in every training step with
no edit of the package (docs/callbacks.md). This one is early stopping: it logs the best training
accuracy so far and the steps since it last rose (callback/*), writes each new best step's first
correct completion to a JSONL file, and ends the run, checkpoint saved, after `patience` steps
without a gain (the training below runs only when this file is run as a script)."""

import json

from reasonrl import Participant, load_config, train


class EarlyStopping(Participant):
    name = "early_stopping"  # its state is checkpointed under this name: a resumed run keeps counting

    def __init__(self, patience: int = 5, min_gain: float = 0.0, best_path: str = ""):
        self.patience, self.min_gain, self.best_path = patience, min_gain, best_path
        self.best, self.waited = float("-inf"), 0

    def metrics(self, step, rollouts):  # after each step; what it returns is logged with the step
        verdicts = [(c, v) for g in rollouts.groups for c, v in zip(g.completions, g.outcomes or ())]
        accuracy = sum(v > 0 for _, v in verdicts) / max(len(verdicts), 1)
        if accuracy > self.best + self.min_gain:
            self.best, self.waited = accuracy, 0
            correct = next((c.text for c, v in verdicts if v > 0), None)
            if self.best_path and correct is not None:
                with open(self.best_path, "a") as f:
                    f.write(json.dumps({"step": step + 1, "accuracy": accuracy, "completion": correct}) + "\n")
        else:
            self.waited += 1
        return {"callback/best_accuracy": self.best, "callback/steps_without_gain": float(self.waited)}

    def stop_reason(self, step):  # after each step is logged: a reason ends the run there
        if self.waited >= self.patience:
            return f"training accuracy has not risen above {self.best:.3f} for {self.waited} step(s)"
        return ""

    def state_dict(self):
        return {"best": self.best, "waited": self.waited}

    def load_state_dict(self, state):
        self.best, self.waited = state["best"], state["waited"]


if __name__ == "__main__":
    cfg = load_config(overrides=["train.steps=10", "run.dir=runs/callback"])
    result = train(cfg, participants=[EarlyStopping(patience=3, best_path=f"{cfg.run.dir}/best.jsonl")])
    print(f"stopped after {result.steps} steps; held-out accuracy {result.eval_after}")
