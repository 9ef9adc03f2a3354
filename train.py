"""Train dprobe: ``python train.py +exp=gnn`` (any Hydra override works, e.g. ``trainer.max_epochs=1``)."""

import hydra
from omegaconf import DictConfig

from dprobe.config import CONFIG_DIR, register_resolvers
from dprobe.training import run

register_resolvers()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
