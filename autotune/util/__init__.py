"""Small helpers every layer may use: text, numbers, YAML files, ports, units. Imports nothing above."""
