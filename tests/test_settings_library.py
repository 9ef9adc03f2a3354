"""The services' settings on pydantic-settings: its sources (a YAML file, the environment, flags) in their order,
pydantic's checks in one-line errors that keep secrets out, former option names still taken (with one
deprecation warning), and ``--help`` showing the config file and the main flags only, ``--help-all`` every
option."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
from pathlib import Path

import pytest
import yaml

from dprobe.core.options import OptionSet, add_service_parser, group, option, settings
from dprobe.services.scaler import config as scaler_config
from dprobe.services.sidecar import config as sidecar_config

SERVICES = [(sidecar_config, "DPROBE_SIDECAR_", "sidecar"), (scaler_config, "DPROBE_SCALER_", "scaler")]


def _service_parser(module) -> argparse.ArgumentParser:
    """The parser of ``dprobe SERVICE`` as the CLI builds it."""
    top = argparse.ArgumentParser(prog="dprobe")
    return add_service_parser(top.add_subparsers(dest="command"), module.OPTIONS.section, "", "", module.OPTIONS,
                              lambda config: 0)


def test_the_sources_are_pydantic_settings_sources(tmp_path: Path) -> None:
    from pydantic_settings import BaseSettings, EnvSettingsSource
    from pydantic_settings.sources import YamlConfigSettingsSource

    from dprobe.core.option_sources import Environment, YamlFile, model_of

    model = model_of(sidecar_config.OPTIONS)
    assert issubclass(model, BaseSettings) and model is model_of(sidecar_config.OPTIONS)  # made once
    assert issubclass(YamlFile, YamlConfigSettingsSource) and issubclass(Environment, EnvSettingsSource)
    assert set(sidecar_config.OPTIONS.fields) | {"horizons"} == set(model.model_fields)


@pytest.mark.parametrize(("module", "prefix", "section"), SERVICES, ids=["sidecar", "scaler"])
def test_precedence_defaults_file_environment_flags(tmp_path: Path, module, prefix: str, section: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({section: {"port": 9001, "log_level": "debug", "web": {"max_connections": 9},
                                              "prometheus": {"url": "http://file:9090"}}}))
    env = {prefix + "CONFIG": str(path), prefix + "PORT": "9002", prefix + "prometheus_url": "http://env:9090"}
    c = module.load_config(_service_parser(module).parse_args(["--port", "9003"]), env=env)
    assert (c.port, c.log_level, c.web_max_connections, c.prometheus_url) == (9003, "debug", 9, "http://env:9090")
    assert module.load_config({}, env={}).port == module.OPTIONS.cls().port  # the defaults are the dataclass's
    assert module.load_config({"config": str(path)}, env={prefix + "PORT": "9002"}).port == 9002


def test_errors_name_the_option_and_its_source_and_hide_secrets(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"sidecar": {"prometheus": {"url": ["https://dprobe:s3cret@prom:9090"]}}}))
    with pytest.raises(ValueError) as info:
        sidecar_config.load_config({"config": str(path)}, env={})
    assert str(info.value) == f"{path}: option prometheus_url: expected text, got ['https://dprobe:xxxxx@prom:9090'] (list)"
    # a header may be a credential: its value is never shown
    with pytest.raises(ValueError) as info:
        sidecar_config.load_config({}, env={"DPROBE_SIDECAR_PROMETHEUS_HEADERS": '{"Authorization": ["Bearer t0k"]}'})
    assert "t0k" not in str(info.value) and "Authorization" in str(info.value)
    assert str(info.value).startswith("DPROBE_SIDECAR_PROMETHEUS_HEADERS: option prometheus_headers: ")
    # a choice refused names the choices; a flag's error names the flag
    with pytest.raises(ValueError, match=r"^--mode: option mode must be one of recommend, apply, got 'aply'$"):
        scaler_config.load_config({"mode": "aply"}, env={})


def test_a_former_name_is_taken_everywhere_with_one_warning(tmp_path: Path, caplog) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("sidecar:\n  horizons: [300, 60]\n")
    parser = _service_parser(sidecar_config)
    for args, env, where in (
            ({"config": str(path)}, {}, f"{path}: option horizons"),
            ({}, {"DPROBE_SIDECAR_HORIZONS": "60,300"}, "DPROBE_SIDECAR_HORIZONS: option horizons"),
            (parser.parse_args(["--horizons", "60,300"]), {}, "--horizons: option horizons")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dprobe.settings"):
            c = sidecar_config.load_config(args, env=env)
        assert c.horizon_seconds == [60, 300] and c.forecast.horizon_seconds == [60, 300]
        warned = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
        assert warned == [f"{where} is deprecated: use horizon_seconds"], warned
    # the new name from a later source wins over the former from an earlier one; both in one source are refused
    assert sidecar_config.load_config({"config": str(path)}, env={"DPROBE_SIDECAR_HORIZON_SECONDS": "900"}
                                      ).horizon_seconds == [900]
    assert sidecar_config.load_config({"horizon_seconds": "120"}, env={"DPROBE_SIDECAR_HORIZONS": "60"}
                                      ).horizon_seconds == [120]
    with pytest.raises(ValueError, match="option horizon_seconds is given twice \\(also as its former name horizons"):
        sidecar_config.load_config({}, env={"DPROBE_SIDECAR_HORIZONS": "60", "DPROBE_SIDECAR_HORIZON_SECONDS": "60"})
    # a bad value under the former name is named as it was written
    with pytest.raises(ValueError, match=r"^DPROBE_SIDECAR_HORIZONS: option horizons: item 'x' of the list"):
        sidecar_config.load_config({}, env={"DPROBE_SIDECAR_HORIZONS": "60,x"})
    # and in Python
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dprobe.settings"):
        c = sidecar_config.SidecarConfig(horizons=[30])
    assert c.horizon_seconds == [30] == c.horizons and "use horizon_seconds" in caplog.text


def test_former_names_are_generic() -> None:
    @dataclasses.dataclass
    class Inner:
        url: str = option("http://a", "where", aliases=("address",))

    @settings
    class Toy:
        rate: float = option(1.0, "per second", aliases=("speed",))
        inner: Inner = group(Inner, "inner")

    options = OptionSet(Toy, "TOY_", "toy")
    assert options.aliases == {"speed": "rate", "inner_address": "inner_url"}
    c = options.load({"speed": "2.5"}, env={"TOY_INNER_ADDRESS": "http://b"})
    assert (c.rate, c.inner_url) == (2.5, "http://b")
    with pytest.raises(ValueError, match="declared twice"):
        @settings
        class Twice:
            rate: float = option(1.0, "per second")
            other: float = option(1.0, "per second", aliases=("rate",))


@pytest.mark.parametrize(("module", "prefix", "section"), SERVICES, ids=["sidecar", "scaler"])
def test_help_shows_the_config_file_and_the_main_flags(module, prefix: str, section: str, capsys) -> None:
    parser = _service_parser(module)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    brief = capsys.readouterr().out
    shown = set(re.findall(r"^  (--[a-z-]+)", brief, re.M))
    flags = {"--" + n.replace("_", "-") for n in module.OPTIONS.flags}
    assert shown == {"--config", "--help-all", *flags}, shown
    assert 8 <= len(flags) <= 15 and "--port" in flags and "--log-level" in flags
    assert f"Every other option goes in the YAML file (--config) or a {prefix}<OPTION> variable" in brief
    assert len(brief.splitlines()) < 90
    with pytest.raises(SystemExit):
        parser.parse_args(["--help-all"])
    full = capsys.readouterr().out
    for name in module.OPTIONS.fields:  # every option, with its variable, in its section
        assert "--" + name.replace("_", "-") in full and prefix + name.upper() in full
    assert "general options:" in full and len(full.splitlines()) > 3 * len(brief.splitlines())
    # every option's flag is still taken, shown or not (deployments pass them)
    hidden = [n for n in module.OPTIONS.fields if n not in module.OPTIONS.flags and n != "log_level"]
    args = parser.parse_args(["--" + hidden[0].replace("_", "-"), "1"] if module.OPTIONS.fields[hidden[0]]
                             .type != "bool" else ["--" + hidden[0].replace("_", "-")])
    assert hidden[0] in vars(args)


def test_flags_deployments_pass_are_taken(tmp_path: Path) -> None:
    """The flags docs/ and deploy/ show (the sidecar's and the scaler's) parse as before."""
    (tmp_path / "sidecar.yaml").write_text("sidecar: {log_level: warning}\n")
    parse = _service_parser(sidecar_config).parse_args
    args = parse(["--config", str(tmp_path / "sidecar.yaml"), "--source", "synthetic", "--synthetic-targets",
                  "4", "--sample-interval", "0.5", "--forecast-interval", "5", "--pod-name", "ml/p-0", "--job",
                  "torchvision:resnet50 batch=64", "--listen-address", "127.0.0.1", "--port", "0", "--horizons",
                  "60", "--step-seconds", "5", "--min-points", "2", "--stale-after", "2"])
    c = sidecar_config.load_config(args, env={})
    assert (c.synthetic_targets, c.pod_name, c.step_seconds, c.horizon_seconds) == (4, "ml/p-0", 5.0, [60])
    assert c.log_level == "warning"
    args = _service_parser(scaler_config).parse_args(["--mode", "apply", "--vc-label", "team",
                                                      "--scale-up-tolerance", "0.2"])
    c = scaler_config.load_config(args, env={})
    assert (c.mode, c.vc_label, c.scale_up_tolerance) == ("apply", "team", 0.2)
