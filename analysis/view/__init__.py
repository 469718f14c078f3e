"""A run's steps as every room of analysis/ reads them: the derived columns (compute,
idle, exchange) and the run, per-worker, per-phase and per-step summaries (`metrics`)."""
