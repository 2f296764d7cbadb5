"""Pure tensor math of policy optimisation, on the three axes of the design:
advantage estimator (advantages.py) x per-token objective (objectives.py) x loss aggregation
(aggregation.py), plus KL estimators (kl.py). Nothing here knows about models or configs."""
