"""``dprobe train`` where its data is not there (dprobe installed from the package, run outside its repository):
one line saying where the data sets are looked for, exit status 2, no traceback, before Hydra or torch start."""

from __future__ import annotations

from pathlib import Path

import pytest

import dprobe.train as train
from dprobe.cli import main
from dprobe.data import DatasetError

DATASETS = Path(__file__).resolve().parents[1] / "datasets"


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """As where dprobe is installed from a wheel: no checkout (``paths.root_dir`` is the current directory), no
    ``./datasets``, no ``$DPROBE_DATA_DIR``."""
    monkeypatch.delenv("DPROBE_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "project_root", Path.cwd)
    return tmp_path


def test_the_data_directory_a_run_reads_follows_the_config(installed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As conf/paths/default.yaml resolves ``paths.data_dir``: the override, else $DPROBE_DATA_DIR, else the root's
    datasets/; an override naming a stage's own data leaves the check to the composed config."""
    assert train.default_data_dir([]) == installed / "datasets"
    assert train.default_data_dir(["paths.root_dir=/r", "+exp=gnn"]) == Path("/r/datasets")
    assert train.default_data_dir(["paths.data_dir=/d"]) == Path("/d")
    assert train.default_data_dir(["data.datasets=[/x]"]) is None
    assert train.default_data_dir(["coldstart.data_dir=/x"]) is None
    assert train.default_data_dir(["-m", "paths.data_dir=/a,/b"]) is None  # a sweep: the composed config says
    monkeypatch.setenv("DPROBE_DATA_DIR", "/env")
    assert train.default_data_dir(["paths.root_dir=/r"]) == Path("/env")
    assert train.default_data_dir(["++paths.data_dir=/d"]) == Path("/d")


def test_dprobe_train_without_data_says_where_in_one_line(installed: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def hydra_started() -> None:
        raise AssertionError("Hydra started without data")

    monkeypatch.setattr(train, "main", hydra_started)
    assert main(["train", "+exp=gnn"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"dprobe train: error: no training data: {installed / 'datasets'}")
    assert all(where in err for where in ("DPROBE_DATA_DIR", "datasets/", "paths.data_dir="))
    with pytest.raises(DatasetError, match="/nope is not a directory"):
        train.check_data_dir(["paths.data_dir=/nope"])
    monkeypatch.setenv("DPROBE_DATA_DIR", str(DATASETS))  # pointed at the data: it goes on to Hydra
    with pytest.raises(AssertionError, match="Hydra started"):
        train.command([])


@pytest.mark.parametrize("flag", ["--help", "--cfg", "--cfg=job", "--hydra-help", "--info", "--config-name=other"])
def test_flags_that_only_print_need_no_data(installed: Path, flag: str) -> None:
    train.check_data_dir([flag])  # no error: Hydra prints the help or the config


@pytest.mark.slow
def test_a_composed_run_whose_series_are_missing_stops_in_one_line(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Past the check before Hydra (a stage's own data named): the composed config's directories are checked
    before anything trains, and the run ends with the one line, exit status 2, not Hydra's traceback."""
    from dprobe.config import compose
    from dprobe.training import check_data, data_dirs

    missing = tmp_path / "nowhere"
    cfg = compose([f"data.datasets=[{missing}]", f"paths.output_dir={tmp_path / 'out'}", "+exp=gnn"])
    assert data_dirs(cfg)["data.datasets"] == [str(missing)]
    assert data_dirs(cfg)["kernel_gnn.data_dir"] == [str(DATASETS / "timm-infer-gpus")]
    with pytest.raises(DatasetError, match=rf"{missing} \(data.datasets\) is not a directory; set DPROBE_DATA_DIR"):
        check_data(cfg)
    with pytest.raises(SystemExit) as stop:
        train.task(cfg)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no training data" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before the run wrote anything
