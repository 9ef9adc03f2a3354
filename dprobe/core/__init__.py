"""What every part of dprobe shares: metric vocabulary, error metrics, conformal shifts, worker processes,
service options, plots and the lazy imports that keep the services free of torch."""
