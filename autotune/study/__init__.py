"""A study: the build from a config, the driver loop, leases, notes, progress, the service."""
