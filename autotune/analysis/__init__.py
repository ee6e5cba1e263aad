"""What a finished study says: crash rules, parameter importance, ablation, explain."""
