"""GPU sharing: the packing planner (``planner``), MIG profiles (``mig``), fragmentation and FGD (``fgd``),
cluster placement of GPU-sharing pods (``cluster``, ``openb``), the co-location slowdown model
(``interference``) and ``dprobe predict --colocate`` (``colocate``). numpy only: the services may use it."""
