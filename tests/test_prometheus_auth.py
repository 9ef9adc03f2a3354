"""Credentials, TLS settings and extra headers of the sidecar's and the scaler's Prometheus client: what goes
on the wire (a stand-in Prometheus API on loopback records it), token rotation, and the refusals at start."""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dprobe.forecaster.loading import open_forecaster
from dprobe.services.scaler import config as scaler_config
from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.scaler.demand import pod_forecasts
from dprobe.services.scaler.service import Scaler
from dprobe.services.sidecar import config as sidecar_config
from dprobe.services.sidecar.config import SidecarConfig
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources.base import SourceError
from dprobe.services.sources.http import HttpAuth, http_get, redact, redact_url
from dprobe.services.sources.prometheus import AUTH_FIELDS, PrometheusAccess, query_vector

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"target": "serving/llm-0", "namespace": "serving", "pod": "llm-0"}, "value": [0, "0.5"]}]}}


class _Api(BaseHTTPRequestHandler):
    """Answers every GET with :data:`VECTOR` when the request carries ``server.token``, else 401; records
    each request's headers (names in lower case: they are case-insensitive) in ``server.seen``; ``/moved`` redirects."""

    def do_GET(self) -> None:  # noqa: N802
        self.server.seen.append({k.lower(): v for k, v in self.headers.items()})  # type: ignore[attr-defined]
        if self.path.startswith("/moved"):
            self.send_response(302)
            self.send_header("Location", "http://elsewhere.example/api/v1/query")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        ok = self.headers.get("Authorization") == self.server.token  # type: ignore[attr-defined]
        body = json.dumps(VECTOR if ok else {"status": "error"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def api(token: str) -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    srv.seen, srv.token = [], token  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def _rotate(path: Path, text: str) -> None:
    """A new file swapped in, as the kubelet updates a projected volume."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_bearer_token_is_read_again_when_it_rotates_and_headers_go_along(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    with api("Bearer first") as srv:
        config = ScalerConfig(prometheus_url=_url(srv), prometheus_bearer_token_file=str(token),
                              prometheus_headers={"X-Scope-OrgID": "team-a"}).validate()
        assert pod_forecasts(config.queries) == {("serving", "llm-0"): (0.5, VECTOR["data"]["result"][0]["metric"])}
        assert srv.seen[-1]["authorization"] == "Bearer first" and srv.seen[-1]["x-scope-orgid"] == "team-a"
        _rotate(token, "second")
        srv.token = "Bearer second"
        assert pod_forecasts(config.queries)  # the new token, without a restart
        assert srv.seen[-1]["authorization"] == "Bearer second"
        srv.token = "Bearer third"  # the server moved on, the file did not: refused, and said so
        with pytest.raises(SourceError, match="HTTP 401 .*a bearer token given .*prometheus_bearer_token_file"):
            pod_forecasts(config.queries)
        token.unlink()  # gone mid-rotation: an error naming the option, never a request without credentials
        n = len(srv.seen)
        with pytest.raises(SourceError, match="prometheus_bearer_token_file: cannot read"):
            pod_forecasts(config.queries)
        assert len(srv.seen) == n
        token.write_text("  \n")
        with pytest.raises(SourceError, match="prometheus_bearer_token_file: .* is empty"):
            pod_forecasts(config.queries)


def test_basic_auth_reads_the_password_file(tmp_path: Path) -> None:
    (tmp_path / "password").write_text("pa:ss\n")
    auth = SidecarConfig(prometheus_username="dprobe", prometheus_password_file=str(tmp_path / "password"))
    with api("Basic ZHByb2JlOnBhOnNz") as srv:  # base64 of dprobe:pa:ss
        assert query_vector(_url(srv), "up", 2.0, auth.prometheus_auth())[0][1] == 0.5
        with pytest.raises(SourceError, match="HTTP 401 .*no credentials given"):
            query_vector(_url(srv), "up", 2.0)


def test_credentials_never_follow_a_redirect(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    with api("Bearer t") as srv, pytest.raises(SourceError, match="HTTP 302 .*not followed"):
        http_get(_url(srv) + "/moved", 2.0, auth=HttpAuth(bearer_token_file=str(tmp_path / "token")))


def test_the_auth_object_is_kept_while_the_options_stay_the_same(tmp_path: Path) -> None:
    config = ScalerConfig(prometheus_headers={"X-Scope-OrgID": "a"})
    first = config.prometheus_auth()
    assert config.prometheus_auth() is first
    config.prometheus_headers = {"X-Scope-OrgID": "b"}
    assert config.prometheus_auth() is not first and config.prometheus_auth().headers == {"X-Scope-OrgID": "b"}


@pytest.mark.parametrize(("options", "message"), [
    ({"prometheus_bearer_token_file": "TOKEN", "prometheus_username": "u", "prometheus_password_file": "PW"},
     "two ways to authenticate"),
    ({"prometheus_username": "u"}, "basic auth needs both prometheus_username and prometheus_password_file"),
    ({"prometheus_password_file": "PW"}, "basic auth needs both"),
    ({"prometheus_key_file": "PW"}, "prometheus_key_file needs prometheus_cert_file"),
    ({"prometheus_bearer_token_file": "/nonexistent/token"}, "prometheus_bearer_token_file: cannot read"),
    ({"prometheus_ca_file": "PW"}, "prometheus_ca_file: .* is not a usable CA bundle"),
    ({"prometheus_cert_file": "PW"}, "cannot load the client certificate"),
    ({"prometheus_ca_file": "PW", "prometheus_insecure_skip_verify": True}, "set one"),
    ({"prometheus_headers": {"X Scope": "a"}}, "'X Scope' is not a valid header name"),
    ({"prometheus_headers": {"X-Scope-OrgID": "a\r\nHost: evil"}}, "line break"),
    ({"prometheus_bearer_token_file": "TOKEN", "prometheus_headers": {"authorization": "Bearer x"}},
     "Authorization is set by"),
])
def test_contradictory_or_unusable_settings_are_refused_at_start(tmp_path: Path, options: dict,
                                                                  message: str) -> None:
    (tmp_path / "TOKEN").write_text("t")
    (tmp_path / "PW").write_text("not a certificate")
    options = {k: str(tmp_path / v) if k.endswith("_file") and not v.startswith("/") else v
               for k, v in options.items()}
    url = "https://prometheus:9090"
    with pytest.raises(ValueError, match=message):
        ScalerConfig(prometheus_url=url, **options).validate()
    with pytest.raises(ValueError, match=message):  # the sidecar's source: the same options, the same checks
        SidecarConfig(source="prometheus", prometheus_url=url, **options).validate()
    SidecarConfig(source="synthetic", prometheus_url=url, **options).validate()  # not its source: not checked


def test_tls_options_need_an_https_url(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prometheus_insecure_skip_verify is for an https:// server"):
        ScalerConfig(prometheus_url="http://prometheus:9090", prometheus_insecure_skip_verify=True).validate()


def _flags(add_arguments, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(("module", "section", "env_prefix"), [(sidecar_config, "sidecar", "DPROBE_SIDECAR_"),
                                                              (scaler_config, "scaler", "DPROBE_SCALER_")])
def test_every_option_from_file_env_and_flags(tmp_path: Path, module, section: str, env_prefix: str) -> None:
    (tmp_path / "token").write_text("t")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"{section}:\n  prometheus:\n    url: https://prom:9090\n"
                   f"    bearer_token_file: {tmp_path / 'token'}\n    headers: {{X-Scope-OrgID: 42}}\n")
    env = {env_prefix + "CONFIG": str(cfg), env_prefix + "PROMETHEUS_INSECURE_SKIP_VERIFY": "true"}
    c = module.load_config(_flags(module.add_arguments, "--prometheus-headers", '{"X-Scope-OrgID": "7"}'), env=env)
    assert (c.prometheus_bearer_token_file, c.prometheus_headers, c.prometheus_insecure_skip_verify) == (
        str(tmp_path / "token"), {"X-Scope-OrgID": "7"}, True)
    c = module.load_config({}, env=env)
    assert c.prometheus_headers == {"X-Scope-OrgID": "42"}
    auth = c.prometheus_auth()
    assert auth.request_headers() == {"X-Scope-OrgID": "42", "Authorization": "Bearer t"}
    assert auth.ssl_context().verify_mode.name == "CERT_NONE"
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    for name in AUTH_FIELDS:
        assert f"--prometheus-{name.replace('_', '-')}" in parser.format_help()


def test_both_services_share_the_options() -> None:
    assert set(AUTH_FIELDS) == set(PrometheusAccess.__dataclass_fields__)  # one group, prometheus_* in both
    names = {"prometheus_" + n for n in AUTH_FIELDS}
    assert names <= set(sidecar_config.OPTIONS.fields) and names <= set(scaler_config.OPTIONS.fields)


SECRET_URL = "http://dprobe:s3cret%21@127.0.0.1"  # user info is no way to give credentials: never shown


def test_redact_url_hides_the_password_of_a_urls_user_info() -> None:
    assert redact_url("https://dprobe:s3cret@prom:9090/api?x=1") == "https://dprobe:xxxxx@prom:9090/api?x=1"
    assert redact_url("https://glpat-token@prom") == "https://xxxxx@prom"  # a token as the user: all of it
    assert redact_url("https://a:b@c@prom/x and http://u:p@q") == "https://a:xxxxx@prom/x and http://u:xxxxx@q"
    assert redact_url("https://prom:9090/api?q=a@b") == "https://prom:9090/api?q=a@b"  # no user info: as it is
    message = "http://dprobe:s3cret%21@127.0.0.1: nonnumeric port: 's3cret!@127.0.0.1'"
    assert redact(message, SECRET_URL) == "http://dprobe:xxxxx@127.0.0.1: nonnumeric port: 'xxxxx@127.0.0.1'"


def test_credentials_in_prometheus_url_are_never_shown(tmp_path: Path, caplog) -> None:
    """A prometheus_url with user info: the password appears in no log line, no /readyz answer (which anyone
    reaching the port may read) and no error at start, of the sidecar or the scaler."""
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    with pytest.raises(SourceError) as failed:
        http_get(SECRET_URL + "/api/v1/query", 2.0)
    shown.append(str(failed.value))
    sidecar = Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, source="prometheus",
                                    prometheus_url=SECRET_URL, sample_interval=0.1, model="ewma"),
                      model=open_forecaster(None, "ewma"))
    scaler = Scaler(ScalerConfig(prometheus_url=SECRET_URL, listen_address="127.0.0.1", port=0, interval=0.1,
                                 workloads=[{"namespace": "serving", "name": "llm"}]).validate())
    sidecar.start()
    scaler.start()
    try:
        for service in (sidecar, scaler):
            deadline = time.monotonic() + 5
            while "failing" not in (answer := _readyz(service.server.url)) and "cannot read" not in answer:
                assert time.monotonic() < deadline, answer
                time.sleep(0.05)
            assert "dprobe:xxxxx@127.0.0.1" in answer, answer
            shown.append(answer)
    finally:
        scaler.stop()
        sidecar.stop()
    for options in ({"prometheus_url": "ftp://dprobe:s3cret%21@prom"},
                    {"prometheus_url": SECRET_URL, "prometheus_insecure_skip_verify": True}):
        for config in (ScalerConfig(**options), SidecarConfig(source="prometheus", **options)):
            with pytest.raises(ValueError, match="dprobe:xxxxx@") as refused:
                config.validate()
            shown.append(str(refused.value))
    shown += [r.getMessage() for r in caplog.records]
    assert any("forecasts from http://dprobe:xxxxx@127.0.0.1" in line for line in shown)  # the scaler's start
    assert not [line for line in shown if "s3cret" in line]


def _readyz(url: str) -> str:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=3) as r:
            return r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode()
