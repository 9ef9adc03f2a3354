"""What a fitted co-location model has seen: the GPU architectures, job classes and utilisations it was fitted
on (its *support*). Inside it, the learned model may run; outside it, the rule does, and the prediction
says why.

A job's class is read from its model's name, by words any framework's names share ("resnet", "bert",
"gan", "a3c", "recommend" ...): ``vision``, ``language``, ``recommendation``, ``reinforcement`` (an RL
agent), ``generative``, or ``unknown`` where no word marks one. An unknown class is outside every support.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dprobe.core.gpus import generation

# word stems per job class, matched at the start of a word of the model's name (lower case, split at
# anything but letters and digits; the first class in this order that matches): "timm:resnet50" ->
# "resnet50" starts with "resnet" -> vision; "transformers:T5Config/..." -> "t5config" -> language
CLASS_WORDS: dict[str, tuple[str, ...]] = {
    "generative": ("gan", "cyclegan", "dcgan", "stylegan", "pix2pix", "vae", "diffusion", "unet", "ddpm",
                   "autoencoder"),
    "reinforcement": ("a3c", "a2c", "ppo", "dqn", "ddpg", "td3", "sac", "impala", "rl", "reinforce"),
    "recommendation": ("recommend", "ncf", "neumf", "dlrm", "deepfm", "dcn", "movielens"),
    "language": ("lm", "lstm", "gru", "rnn", "transformer", "bert", "roberta", "gpt", "t5", "llama", "opt",
                 "bart", "mistral", "qwen", "xlnet", "electra", "albert", "distilbert", "deepspeech", "translation",
                 "seq2seq", "whisper", "wav2vec"),
    "vision": ("resnet", "resnext", "wide_resnet", "vgg", "mobilenet", "efficientnet", "densenet", "inception",
               "alexnet", "squeezenet", "shufflenet", "regnet", "convnext", "vit", "deit", "swin", "beit", "yolo",
               "detr", "rcnn", "retinanet", "ssd", "pointnet", "cifar", "imagenet", "mnasnet", "ghostnet", "levit",
               "xcit", "cait", "coat", "dla", "dpn", "hrnet", "nfnet", "repvgg", "mixer", "poolformer", "segformer",
               "deeplab", "fcn", "lenet", "googlenet", "edgenext", "fastvit", "efficientformer", "maxvit"),
}
JOB_CLASSES = (*CLASS_WORDS, "unknown")


def job_class(model: str | None) -> str:
    """The class of a job from its model's name (see the module docstring); "unknown" without a match."""
    name = re.sub(r"^(timm|torchvision|transformers|module|zoo):", "", (model or "").lower())  # the library
    words = [w for w in re.split(r"[^a-z0-9]+", name) if w]
    for cls, stems in CLASS_WORDS.items():
        for w in words:
            if any(w.startswith(s) for s in stems):
                return cls
    return "unknown"


@dataclass(frozen=True)
class Support:
    """The inputs a model was fitted on: GPU architectures (:func:`dprobe.core.gpus.generation`), job
    classes, and the lowest utilisation (0-1) of a job in its pairs (below it a job is close to idle, where
    the limit "a job beside an idle one runs at full speed" governs, not what was fitted)."""

    generations: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    min_utilization: float = 0.0
    max_utilization: float = 1.0

    def reasons_outside(self, gpu_name: str, classes: tuple[str, str], utilization: tuple[float, float]) -> list[str]:
        """Why a pair is outside the support (empty: inside)."""
        out = []
        arch = generation(gpu_name)
        if arch not in self.generations:
            out.append(f"{gpu_name or 'this GPU'} ({arch}) is not an architecture it was fitted on "
                       f"({', '.join(self.generations)})")
        for who, cls in zip(("job A", "job B"), classes, strict=True):
            if cls not in self.classes:
                out.append(f"{who}'s class ({cls}) is not one it was fitted on ({', '.join(self.classes)})")
        for who, u in zip(("job A", "job B"), utilization, strict=True):
            if u < self.min_utilization:
                out.append(f"{who}'s utilisation {u:.3f} is below the lowest it was fitted on "
                           f"({self.min_utilization:.3f})")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"generations": list(self.generations), "classes": list(self.classes),
                "min_utilization": self.min_utilization, "max_utilization": self.max_utilization}

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> Support:
        d = d or {}
        return Support(tuple(d.get("generations", ())), tuple(d.get("classes", ())),
                       float(d.get("min_utilization", 0.0)), float(d.get("max_utilization", 1.0)))
