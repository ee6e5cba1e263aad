"""Running one trial: hosts (local, SSH, Ray), the runner, the load generator, early stopping."""
