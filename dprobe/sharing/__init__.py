"""GPU sharing: the packing planner (``planner``), MIG profiles (``mig``), fragmentation and FGD (``fgd``),
cluster placement of GPU-sharing pods (``cluster``, ``openb``), the co-location models (``interference``:
each job's slowdown beside another, whether they fit; ``gavel``: the measured pairs they are fitted and
scored on; ``interference_fit``: the fit, with LightGBM) and ``dprobe predict --colocate`` (``colocate``).
numpy and pandas only, but ``interference_fit``: the services may use it."""
