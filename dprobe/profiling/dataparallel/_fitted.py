"""Data-parallel parameters fitted on datasets/pollux-placements; written by
``python -m dprobe.profiling.dataparallel.fit --write`` (do not edit)."""

FITTED = {'models': ['bert', 'cifar10', 'deepspeech2', 'imagenet', 'ncf'],
 'p90_step_factor': 1.2956,
 'p90_sync_factor': 2.523,
 'params': {'inter_bandwidth': 503927000.0,
            'inter_latency': 0.000164233,
            'intra_bandwidth': 1552270000.0,
            'intra_latency': 0.00139825,
            'overlap': 1.64781,
            'per_gpu_on_node': 0.0327147,
            'straggler': 0.041177,
            'tail': 5.57619e-12,
            'two_node_penalty': 0.478992},
 'rows': 4950}
