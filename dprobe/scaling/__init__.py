"""Scaling decisions as pure logic, shared by the scaler service (:mod:`dprobe.services.scaler`) and the
simulator (:mod:`dprobe.sim`): a forecast demand -> a replica (or GPU) count by the HPA's rules
(:mod:`dprobe.scaling.policy`). No I/O, no clock, numpy-free: the services and the simulator import it alike."""
