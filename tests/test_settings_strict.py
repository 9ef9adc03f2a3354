"""Settings are parsed strictly, from flags, variables and the file alike: a value that is not of its option's
type is refused with the option and the value named, never rounded, guessed or dropped."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from dprobe.core.options import OptionSet, at_least, check_options, group, option, positive, settings
from dprobe.services.scaler import config as scaler_config
from dprobe.services.sidecar import config as sidecar_config


def _flag(module, name: str, value: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args([f"--{name.replace('_', '-')}", value])


def _load_each_way(module, prefix: str, section: str, tmp_path: Path, name: str, value, text: str | None = None):
    """The config loaded with option ``name`` set to ``value`` from the file (YAML data), and to ``text`` (default:
    ``str(value)``) from a variable and from a flag: three results, each a config or the ValueError raised."""
    text = str(value) if text is None else text
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({section: {name: value}}))
    out = []
    loads = [lambda: module.load_config({"config": str(path)}, env={}),
             lambda: module.load_config({}, env={prefix + name.upper(): text})]
    if str(module.OPTIONS.fields[name].type) != "bool":  # a bool's flags take no value: --x / --no-x
        loads.append(lambda: module.load_config(_flag(module, name, text), env={}))
    for load in loads:
        try:
            out.append(load())
        except ValueError as exc:
            out.append(exc)
    return out


SIDECAR = (sidecar_config, "DPROBE_SIDECAR_", "sidecar")
SCALER = (scaler_config, "DPROBE_SCALER_", "scaler")


@pytest.mark.parametrize(("service", "name", "value", "text", "message"), [
    # whole numbers: a fraction is refused, never truncated (90.7 was 90)
    (SIDECAR, "horizon_seconds", [90.7, 300], "90.7,300",
     r"option horizon_seconds: item '?90.7'? of the list: expected a whole number"),
    (SIDECAR, "horizon_seconds", ["60", ""], "60,,300", "option horizon_seconds: empty item"),
    (SIDECAR, "horizon_seconds", "soon", "soon", "option horizon_seconds: .*expected a whole number, got 'soon'"),
    (SIDECAR, "port", 9477.5, "9477.5", "option port: expected a whole number, got '?9477.5'?"),
    (SIDECAR, "port", "", "", "option port: expected a whole number, got ''"),
    (SIDECAR, "max_targets", True, "1e3", "option max_targets: expected a whole number"),
    (SCALER, "horizon_seconds", 300.5, "300.5", "option horizon_seconds: expected a whole number"),
    (SCALER, "max_replicas", "8 pods", "8 pods", "option max_replicas: expected a whole number, got '8 pods'"),
    # negative where not allowed: the service's own check names the option
    (SIDECAR, "port", -1, "-1", "port must be 0-65535"),
    (SIDECAR, "horizon_seconds", [-60], "-60", "horizon_seconds must be at least step_seconds"),
    (SIDECAR, "min_points", -2, "-2", "min_points must be at least 1"),
    (SCALER, "max_replicas", -1, "-1", "min_replicas <= max_replicas"),
    (SCALER, "failure_threshold", -3, "-3", "failure_threshold must be >= 1"),
    (SCALER, "horizon_seconds", -300, "-300", "horizon_seconds must be positive"),
    # booleans: true/false, yes/no, on/off, 1/0 and nothing else
    (SIDECAR, "replay_loop", "maybe", "maybe", "option replay_loop: expected true/false .*got 'maybe'"),
    (SIDECAR, "replay_loop", 2, "2", "option replay_loop: expected true/false"),
    (SIDECAR, "replay_loop", "", "", "option replay_loop: expected true/false"),
    (SCALER, "discover", "enabled", "enabled", "option discover: expected true/false"),
    # durations (seconds)
    (SIDECAR, "stale_after", "30s", "30s", "option stale_after: expected a number, got '30s'"),
    (SIDECAR, "stale_after", "", "", "option stale_after: expected a number, got ''"),
    (SIDECAR, "sample_interval", -1, "-1", "sample_interval must be positive"),
    (SIDECAR, "job_timeout", 0, "0", "job_timeout must be positive"),
    (SCALER, "interval", "1m", "1m", "option interval: expected a number, got '1m'"),
    (SCALER, "interval", 1e-6, "1e-6", r"interval must be at least 0\.1 s \(and finite\), got 1e-06"),  # would spin
    (SCALER, "interval", math.inf, "inf", r"interval must be at least 0\.1 s \(and finite\), got inf"),
    # ratios: a utilisation target above 1 (100 %) is no target a GPU can meet
    (SCALER, "target", 2, "2", r"target must be a ratio above 0 and at most 1 \(1 = 100 %\), got 2"),
    (SCALER, "target", 0, "0", r"target must be a ratio above 0 and at most 1"),
    (SCALER, "scale_down_stabilization_seconds", -5, "-5", "stabilization_seconds must be >= 0"),
    # text options: YAML that is not text (a bare `no`, a number) is refused, not turned into 'False'
    (SIDECAR, "graph_file", False, None, "option graph_file: expected text, got False"),
    (SCALER, "vc_label", 7, None, "option vc_label: expected text, got 7"),
    # mappings of text
    (SIDECAR, "prometheus_headers", {"X-Scope-OrgID": ["a", "b"]}, '{"X-Scope-OrgID": ["a", "b"]}',
     "option prometheus_headers: the value of 'X-Scope-OrgID': expected text, got a list"),
    (SCALER, "prometheus_headers", ["X-Scope-OrgID"], "[X-Scope-OrgID]", "option prometheus_headers: expected a mapping"),
])
def test_bad_values_are_refused_from_file_env_and_flags(tmp_path: Path, service, name: str, value, text,
                                                        message: str) -> None:
    module, prefix, section = service
    results = _load_each_way(module, prefix, section, tmp_path, name, value, text)
    if text is None:  # a YAML type: only the file can say it
        results = results[:1]
    for result in results:
        assert isinstance(result, ValueError), f"{name}={value!r} was accepted: {getattr(result, name, result)}"
        assert re.search(message, str(result)), str(result)
    if text is not None and message.startswith("option "):  # a parse error says where the value came from
        assert prefix + name.upper() in str(results[1])
        assert len(results) == 2 or f"--{name.replace('_', '-')}" in str(results[2])


@pytest.mark.parametrize(("service", "name", "value", "text", "expected"), [
    (SIDECAR, "horizon_seconds", [300, 60], "300, 60", [60, 300]),
    (SIDECAR, "horizon_seconds", [60], "[60]", [60]),
    (SIDECAR, "port", 9100, "+9100", 9100),
    (SIDECAR, "replay_loop", False, "no", False),
    (SIDECAR, "replay_loop", True, "Yes", True),
    (SIDECAR, "replay_loop", True, "on", True),
    (SIDECAR, "nvml_per_process", False, "0", False),
    (SIDECAR, "stale_after", 45, "45", 45.0),
    (SIDECAR, "checkpoint", None, "", None),
    (SCALER, "fallback_replicas", None, "", None),
    (SCALER, "scale_up_tolerance", 0.05, "0.05", 0.05),
    (SCALER, "interval", 0.1, "0.1", 0.1),
    (SCALER, "target", 1, "1", 1.0),
    (SCALER, "prometheus_headers", {"X-Scope-OrgID": 42}, '{"X-Scope-OrgID": 42}', {"X-Scope-OrgID": "42"}),
])
def test_good_values_load_the_same_from_file_env_and_flags(tmp_path: Path, service, name: str, value, text,
                                                           expected) -> None:
    module, prefix, section = service
    for result in _load_each_way(module, prefix, section, tmp_path, name, value, text):
        assert not isinstance(result, ValueError), result
        assert getattr(result, name) == expected


def test_a_workloads_own_target_is_checked_as_the_option() -> None:
    """A ``workloads:`` entry overriding ``target`` gets the option's check, its place named."""
    bad = scaler_config.ScalerConfig(workloads=[{"namespace": "serving", "name": "llm", "target": 2}])
    with pytest.raises(ValueError, match=r"workloads\[0\] \(serving/llm\): target must be a ratio above 0 and at "
                                         r"most 1 \(1 = 100 %\), got 2"):
        bad.validate()
    good = scaler_config.ScalerConfig(workloads=[{"namespace": "serving", "name": "llm", "target": 0.95}])
    assert good.validate().workload_specs()[0].policy.target == 0.95


def test_unknown_and_duplicate_keys_in_the_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    for doc, message in (
            ({"prot": 1}, "unknown option.*prot"),
            ({"prometheus": {"url": "http://p:9090", "tenant": "a"}}, "unknown option.*prometheus_tenant"),
            ({"dcgm": {"url": "http://a:9400/metrics"}, "dcgm_url": "http://b:9400/metrics"},
             "option dcgm_url is given twice"),
            ({"sidecar": {"port": 1}, "horizon_seconds": [60]},
             r"unknown key\(s\) horizon_seconds beside the sidecar: section"),
            ({"sidecar": {"port": 1, "replay": {"loop": "maybe"}}}, "option replay_loop: expected true/false")):
        path.write_text(yaml.safe_dump(doc))
        with pytest.raises(ValueError, match=message):
            sidecar_config.load_config({"config": str(path)}, env={})
    # one file for both services: each reads its own section
    path.write_text(yaml.safe_dump({"sidecar": {"port": 9100}, "scaler": {"port": 9200}}))
    assert sidecar_config.load_config({"config": str(path)}, env={}).port == 9100
    assert scaler_config.load_config({"config": str(path)}, env={}).port == 9200


BAD_YAML = (  # text, where the parser stops (line, column from 1), what it says
    ("port: 9477\nsource: [dcgm\nlog_level: info\n", "line 3, column 10",
     r"expected ',' or '\]', but got ':' \(while parsing a flow sequence that starts at line 2, column 9\)"),
    ("sidecar:\n  port: 1\n\t- dcgm\n", "line 3, column 1", r"found character '\\t' that cannot start any token"),
    ('horizon_seconds: "60,300\n', "line 2, column 1", "found unexpected end of stream"),
    ("port: 1\x00\n", "line 1, column 8", "character U\\+0000"),
)


@pytest.mark.parametrize(("text", "where", "what"), BAD_YAML)
def test_malformed_yaml_is_one_line_naming_file_line_and_column(tmp_path: Path, text: str, where: str,
                                                                what: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    for module in (sidecar_config, scaler_config):
        with pytest.raises(ValueError) as info:
            module.load_config({"config": str(path)}, env={})
        message = str(info.value)
        assert "\n" not in message and "^" not in message, message
        assert message.startswith(f"{path}: {where}: not valid YAML: "), message
        assert re.search(what, message), message
    # YAML given in a variable is placed the same way
    with pytest.raises(ValueError, match=r"^DPROBE_SIDECAR_JOBS: option jobs: line 1, column 8: not valid YAML: [^\n]*$"):
        sidecar_config.load_config({}, env={"DPROBE_SIDECAR_JOBS": '{"a": ['})
    path.write_bytes(b"port: \xff\n")
    with pytest.raises(ValueError, match=r"bad.yaml: not UTF-8 text \(byte 7\)$"):
        sidecar_config.load_config({"config": str(path)}, env={})


@pytest.mark.slow  # starts the console script twice
@pytest.mark.parametrize("service", ["sidecar", "scaler"])
def test_malformed_config_file_fails_the_console_script_with_one_line(tmp_path: Path, service: str,
                                                                     console_script: str) -> None:
    """``dprobe SERVICE --config bad.yaml``: exit status 2 and one line on stderr naming the file, line and column,
    no traceback, nothing started."""
    path = tmp_path / "bad.yaml"
    path.write_text(f"{service}:\n  port: 9477\n  log_level: [info\n  interval: 5\n")
    proc = subprocess.run([console_script, service, "--config", str(path)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"dprobe {service}: error: {path}: line 4, column 11: not valid YAML: "), lines[0]
    assert "flow sequence that starts at line 3, column 14" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# option groups ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Inner:
    url: str = option("http://a", "where")
    tries: int = option(3, "how often", check=at_least(1))
    own: str = option("", "a name kept flat", name="own_name")


@dataclasses.dataclass
class _Plain:
    url: str = option("http://a", "where")


@dataclasses.dataclass
class _Feature:
    enabled: bool = option(False, "on or off")
    share: float = option(0.5, "a share", check=positive)


@settings
class _Toy:
    rate: float = option(1.0, "per second", check=positive)
    inner: _Inner = group(_Inner, "inner things")
    flat: _Plain = group(_Plain, "flat things", prefix="plain_")
    feature: _Feature = group(_Feature, when="enabled")
    level: str = option("info", "log level")


def test_groups_give_flat_names_flags_variables_and_nested_yaml(tmp_path: Path) -> None:
    options = OptionSet(_Toy, "TOY_", "toy")
    assert list(options.fields) == ["rate", "inner_url", "inner_tries", "own_name", "plain_url", "feature_enabled",
                                    "feature_share", "level"]
    assert options.group_of("inner_url") == "inner things" and options.group_of("feature_share") == "general"
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({"toy": {"inner": {"url": "http://file", "tries": 2}, "own_name": "x"}}))
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    assert "inner things options" in parser.format_help() and "TOY_INNER_TRIES" in parser.format_help()
    c = options.load(parser.parse_args(["--config", str(path), "--inner-tries", "5"]),
                     env={"TOY_PLAIN_URL": "http://env"})
    assert (c.inner.url, c.inner.tries, c.inner.own, c.flat.url) == ("http://file", 5, "x", "http://env")
    assert (c.inner_url, c.own_name, c.plain_url) == ("http://file", "x", "http://env")  # by flat name too
    with pytest.raises(ValueError, match="inner_tries must be at least 1, got 0"):
        options.load({}, env={"TOY_INNER_TRIES": "0"})
    with pytest.raises(ValueError, match="rate must be positive"):
        options.load({}, env={"TOY_RATE": "nan"})


def test_a_group_off_is_not_checked_and_flat_keywords_reach_copies_of_their_groups() -> None:
    c = _Toy(feature_share=-1.0, inner_tries=4)
    assert c.feature.share == -1.0 and c.inner.tries == 4
    check_options(c)  # feature off: its share is not checked
    c.feature_enabled = True
    assert c.feature.enabled
    with pytest.raises(ValueError, match="feature_share must be positive"):
        check_options(c)
    d = dataclasses.replace(c, inner_url="http://b")
    assert (d.inner.url, d.inner.tries, c.inner.url) == ("http://b", 4, "http://a")
    d.flat.url = "http://c"  # a copy: the original's groups are its own
    assert c.flat.url == "http://a"
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        _Toy(nope=1)


@pytest.mark.parametrize("service", [SIDECAR, SCALER], ids=["sidecar", "scaler"])
def test_web_options_reach_the_http_server(tmp_path: Path, service) -> None:
    from prometheus_client.registry import CollectorRegistry

    from dprobe.services.exporter.server import ExporterServer

    module, prefix, section = service
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({section: {"web": {"reserved_connections": 2}, "listen_address": "127.0.0.1"}}))
    args = _flag(module, "web_max_connections", "8")
    args.config = str(path)
    config = module.load_config(args, env={prefix + "WEB_HEADER_TIMEOUT": "0.5", prefix + "PORT": "0"})
    assert (config.web_header_timeout, config.web.max_connections, config.web.reserved_connections) == (0.5, 8, 2)

    class State:
        def ready(self) -> tuple[bool, str]:
            return True, ""

    srv = ExporterServer(CollectorRegistry(), State(), **config.web.server_kwargs())
    try:
        assert (srv.httpd.header_timeout, srv.httpd.max_connections, srv.httpd.reserve) == (0.5, 8, 2)
        assert srv.httpd.request_timeout == 10.0 and srv.httpd.server_address[0] == "127.0.0.1"
    finally:
        srv.stop()
    for name, value, message in (("WEB_HEADER_TIMEOUT", "0", "web_header_timeout must be positive"),
                                 ("WEB_MAX_CONNECTIONS", "0", "web_max_connections must be at least 1"),
                                 ("WEB_RESERVED_CONNECTIONS", "64", "must be below web_max_connections")):
        with pytest.raises(ValueError, match=message):
            module.load_config({}, env={prefix + name: value})


@pytest.mark.parametrize("service", [SIDECAR, SCALER], ids=["sidecar", "scaler"])
def test_tls_settings_make_the_http_server_speak_https(tmp_path: Path, service, make_certificate) -> None:
    import ssl
    import urllib.request

    from prometheus_client.registry import CollectorRegistry

    from dprobe.services.exporter.server import ExporterServer

    cert, key = make_certificate("server")
    module, prefix, section = service
    args = _flag(module, "tls_cert_file", str(cert))
    config = module.load_config(args, env={prefix + "TLS_KEY_FILE": str(key), prefix + "PORT": "0",
                                           prefix + "LISTEN_ADDRESS": "127.0.0.1"})
    assert (config.web.tls_cert_file, config.web.tls_key_file) == (str(cert), str(key))

    class State:
        def ready(self) -> tuple[bool, str]:
            return True, ""

    srv = ExporterServer(CollectorRegistry(), State(), **config.web.server_kwargs())
    srv.start()
    try:
        assert srv.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(srv.url.rstrip("/") + "/healthz", context=context, timeout=5) as r:
            assert r.status == 200
    finally:
        srv.stop()
    # one file without the other, or a file that cannot serve, is refused with the settings (exit 2 at the CLI)
    with pytest.raises(ValueError, match="needs both tls_cert_file and tls_key_file, not tls_cert_file alone"):
        module.load_config({}, env={prefix + "TLS_CERT_FILE": str(cert)})
    with pytest.raises(ValueError, match=f"cannot read the TLS key file {re.escape(str(tmp_path / 'nope.key'))}"):
        module.load_config({}, env={prefix + "TLS_CERT_FILE": str(cert), prefix + "TLS_KEY_FILE": str(tmp_path / "nope.key")})
