"""The long-running services: metric sources, the sidecar and its Prometheus exporter, the scaler."""
