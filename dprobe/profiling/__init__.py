"""Job profiling from the model graph: the cold-start profiler (before a job runs) and job scale (from its
first second of GPU samples)."""
