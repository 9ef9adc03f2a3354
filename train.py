"""Train dprobe: ``python train.py +exp=gnn`` (any Hydra override works, e.g. ``trainer.max_epochs=1``).

A sweep, ``python train.py -m model.lr=1e-3,3e-3 ...``, runs once per value, each in its own numbered
directory of one sweep directory; main returns what sweepers minimise: the forecaster's validation
pinball loss (``val_pinball`` of :func:`dprobe.training.run`)."""

import hydra
from omegaconf import DictConfig

from dprobe.config import CONFIG_DIR, register_resolvers
from dprobe.training import run

register_resolvers()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    return run(cfg)["val_pinball"]


if __name__ == "__main__":
    main()
