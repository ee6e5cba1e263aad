"""What the user declares: the study config, the search space, the objective, secrets."""
