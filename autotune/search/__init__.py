"""Proposing the next configuration: samplers, the feasibility model, implied failures."""
