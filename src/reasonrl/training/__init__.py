"""What updates weights, below the loop (reasonrl.trainer) and the stages (reasonrl.stages):

- `learner`: the policy's (or a value model's) trainable weights, optimizer and update, algorithm-blind;
- `packing`: how a batch becomes micro-batches, and padding-free packed rows for the CPU;
- `prefix_tree`: the token prefixes a micro-batch's sequences share, which a packed row holds once;
- `token_stats`: a model's log-probs and entropies at the loss positions, in one pass over the vocabulary;
- `recompute`: activation checkpointing: which activations an update keeps for backward and which it recomputes;
- `critic`: PPO's value model, trained by a learner of its own;
- `estimation`: what an advantage estimator needs (lengths, greedy completions, values), then advantages;
- `teachers`: on-policy distillation's teachers (local or served);
- `prime`: PRIME's implicit process reward model (its update and dense rewards);
- `targets`: given solutions as one-completion groups to train on (SFT, DPO, guidance);
- `checkpoint`, `runs`, `logging`: checkpoints, the run directory (lock, resume), metrics and console output;
- `skeleton`: what every training command does around each step (progress, checkpoints when due, budgets);
- `runtime`: process-wide settings that make PyTorch fast on CPUs.

Imports from here go down only: to `types`, `config`, `models`, `seeds`, `algo` and the metric names of
`eval`. Nothing here imports the loop, its builders (reasonrl.build), the participants or the stages
(tests/unit/test_import_cycles.py checks it); what a part needs from above is passed in.
"""
