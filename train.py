"""Train dprobe: ``python train.py +exp=gnn`` (any Hydra override works, e.g. ``trainer.max_epochs=1``); where
dprobe is installed, ``dprobe train +exp=gnn`` runs the same (:mod:`dprobe.train`).

A sweep, ``python train.py -m model.lr=1e-3,3e-3 ...``, runs once per value, each in its own numbered
directory of one sweep directory; main returns what sweepers minimise: the forecaster's validation
pinball loss (``val_pinball`` of :func:`dprobe.training.run`)."""

from dprobe.train import main

if __name__ == "__main__":
    main()
