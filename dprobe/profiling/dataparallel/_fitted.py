"""Data-parallel parameters fitted on datasets/pollux-placements; written by
``python -m dprobe.profiling.dataparallel.fit --write`` (do not edit)."""

FITTED = {'models': ['bert', 'cifar10', 'deepspeech2', 'imagenet', 'ncf'],
 'p90_step_factor': 1.1653,
 'p90_sync_factor': 1.9604,
 'params': {'inter_bandwidth': 714135000.0,
            'inter_latency': 0.0,
            'intra_bandwidth': 2304880000.0,
            'intra_latency': 0.0,
            'overlap': 1.44233,
            'per_gpu_on_node': 0.0683237,
            'straggler': 0.0345693,
            'tail': 4.97067e-12,
            'two_node_penalty': 0.488333},
 'rows': 4950}
