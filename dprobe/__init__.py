"""dprobe: forecast GPU memory and utilisation of deep-learning workloads."""

__version__ = "0.1.0"
