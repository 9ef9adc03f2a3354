"""``dprobe gpu calibrate``: a GPU's throughput measured in a minute of microbenchmarks (GEMM per precision and
accumulate mode, a large copy, kernel launches, convolutions, attention), written as a ``--gpu-spec`` file with
a ``measured:`` block that prediction reads.

``device`` holds the device layer the timers run through (:class:`~dprobe.profiling.calibrate.device.TorchDevice`
on CUDA or the CPU, :class:`~dprobe.profiling.calibrate.device.FakeDevice` for tests); ``run`` the suite, its
budget and the spec document; ``cli`` the command. Nothing here imports torch until a real device is opened.
"""
