"""Neural models: the DProbe forecaster (metric window + workload conditioning -> quantiles)."""
