"""Data-parallel training: step time, throughput and scaling efficiency of a job on several GPUs
(``dprobe predict --gpus``), from its one-GPU step time and gradient bytes, with all-reduce parameters
fitted on measured placements (``datasets/pollux-placements``)."""
