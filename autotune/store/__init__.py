"""The record of each trial in Optuna storage, and the views every surface reads."""
