"""Pretraining the graph encoder: a corpus of traced architectures with labels that cost no GPU
(:mod:`dprobe.pretrain.corpus`), and the encoder fitted on it (:mod:`dprobe.pretrain.encoder`)."""
