"""The tuner's own benchmark: whole studies against the simulator's model."""
