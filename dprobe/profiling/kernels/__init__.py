"""Per-kernel efficiency from a GPU's spec sheet, learnt on NeuSight's measured calls on five GPUs."""
