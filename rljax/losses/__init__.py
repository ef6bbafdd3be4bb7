"""Per-token and per-pair losses (pure functions; filled by the modules below)."""
