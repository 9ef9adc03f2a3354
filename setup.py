"""Everything about the package is in pyproject.toml; this only adds the Hydra configs to it.

``conf/`` stays at the repository's root, where ``python train.py`` and the docs name it; a build copies its
files into the package as ``dprobe/conf/`` (package data), which ``dprobe train`` reads wherever dprobe is
installed (:data:`dprobe.config.CONFIG_DIR`). An editable install reads the checkout's ``conf/`` itself."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONF = Path(__file__).resolve().parent / "conf"


class BuildPyWithConf(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        if not (CONF / "train.yaml").is_file():
            raise FileNotFoundError(f"{CONF}/train.yaml: the Hydra configs are missing from the source tree")
        for src in sorted(CONF.rglob("*.yaml")):
            dest = Path(self.build_lib, "dprobe", "conf", src.relative_to(CONF))
            self.mkpath(str(dest.parent))
            self.copy_file(str(src), str(dest))


setup(cmdclass={"build_py": BuildPyWithConf})
