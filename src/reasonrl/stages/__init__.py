"""Ways of training a policy other than the RL loop, and the pipelines that chain them with it:

- `sft`: supervised fine-tuning on (prompt, solution) pairs (a cold start before RL);
- `rft`: rejection-sampling fine-tuning (expert iteration): sample, keep the verified, fine-tune;
- `preference`: DPO on offline pairs, and online DPO on the best and worst of sampled groups;
- `pipeline`: staged runs (e.g. SFT -> RL) as one resumable command.
- `prm_labels`, `prm`: Monte Carlo step labels and a process reward model trained on them
  (their commands: reasonrl.commands.prm).

Each stage reuses reasonrl.training (the learner, checkpoints, run directories, the run skeleton
around its steps) and builds its parts with reasonrl.build, as the loop does; it never copies the
learner. Only `pipeline` imports the loop (reasonrl.trainer), to run an RL stage; nothing below the
loop (training/, rollout/, distributed/, ...) imports a stage.
"""
