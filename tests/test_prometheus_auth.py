"""Reaching Prometheus with credentials, as KEDA's TriggerAuthentication gives them to its Prometheus trigger.

A real Prometheus serves TLS (a certificate from a CA made here), basic auth (bcrypt, Prometheus's web
config) and client-certificate auth; bearer tokens are checked by a loopback proxy in front of it, as
kube-rbac-proxy or an oauth proxy would. The scaler must get signals with the right credentials, a
precise error without them, never send them to a trigger's own ``prometheusAddress``, and show them
nowhere: not in errors, ``/decisions``, ``/metrics`` or its log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from support.http_proxy import HttpProxy
from support.pki import Pki, make_pki
from support.prometheus import PrometheusServer, eventually
from support.scaler_process import ScalerProcess
from support.vllm_exporter import VllmExporter

from scaler.signals import Signals
from scaler.sources import SourceError, Target
from scaler.sources.prometheus import PrometheusSource, shown
from scaler.sources.prometheus_auth import REDACTED, PrometheusAuth

WINDOW_S = 3.0
TARGET = Target("tiny", rate_window_s=WINDOW_S)
USER, PASSWORD, TOKEN = "scaler", "pa55-w0rd-9f3c", "tok-8d2e1b7a"
META = {"model": "tiny", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000", "maxNumSeqs": "64",
        "kvCacheTokens": "100000", "rateWindow": f"{WINDOW_S:g}", "leadTime": "5"}


def auth_dir(tmp: Path, **files: str | Path) -> Path:
    """A directory like a mounted Secret: one file per TriggerAuthentication parameter."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (tmp / name).write_bytes(Path(content).read_bytes() if isinstance(content, Path) else content.encode())
    return tmp


# --- flags: every mistake named at startup -------------------------------------------------------------------------
@pytest.mark.parametrize(("modes", "files", "match"), [
    ("bearer", None, "needs --prometheus-auth-dir"),
    ("oauth", {}, "oauth is not a mode; allowed: bearer, basic, tls"),
    ("bearer,basic", {}, "bearer and basic exclude each other"),
    ("bearer", {}, "needs the file bearerToken"),
    ("basic", {"password": "x"}, "needs the file username"),
    ("tls", {"cert": "c"}, "needs the file key"),
], ids=["no-dir", "unknown-mode", "bearer-and-basic", "no-token", "no-username", "no-key"])
def test_bad_auth_flags_name_the_flag_and_the_file(tmp_path: Path, modes: str, files: dict[str, str] | None,
                                                   match: str) -> None:
    directory = str(auth_dir(tmp_path / "auth", **files)) if files is not None else None
    with pytest.raises(ValueError, match=match):
        PrometheusAuth.from_flags(modes, directory)


def test_no_flags_no_auth_and_a_ca_alone_needs_no_mode(tmp_path: Path) -> None:
    assert PrometheusAuth.from_flags(None, None) is None
    auth = PrometheusAuth.from_flags("", str(auth_dir(tmp_path / "a", ca="PEM")))
    assert auth is not None and auth.material().verify == str(tmp_path / "a" / "ca")
    assert auth.material().headers == {} and auth.material().basic is None


def test_files_are_reread_when_they_change(tmp_path: Path) -> None:
    directory = auth_dir(tmp_path / "a", bearerToken="one\n")  # a trailing newline (kubectl --from-file) is dropped
    auth = PrometheusAuth.from_flags("bearer", str(directory))
    assert auth is not None
    first = auth.material()
    assert first.headers == {"Authorization": "Bearer one"} and auth.material() is first  # cached while unchanged
    (directory / "bearerToken").write_text("two-rotated")
    os.utime(directory / "bearerToken", ns=(time.time_ns() + 10**9,) * 2)
    assert auth.material().headers == {"Authorization": "Bearer two-rotated"}
    assert auth.material().redact("Bearer two-rotated failed") == f"Bearer {REDACTED} failed"


def test_urls_are_shown_without_their_password() -> None:
    assert shown("http://user:secret@prom:9090/x") == f"http://{REDACTED}@prom:9090/x"
    assert shown("https://prom:9090") == "https://prom:9090"


# --- a real Prometheus behind TLS, basic auth and client certificates ------------------------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), "prometheus-ca")


@pytest.fixture(scope="module")
def pod() -> Iterator[VllmExporter]:
    with VllmExporter(model="tiny") as exporter:
        exporter.set_load(prompt_tokens_per_s=4000, generation_tokens_per_s=400)
        exporter.set_queue(waiting=1, running=8, kv_usage=0.2)
        yield exporter


def web_config(pki: Pki, client_certs: bool = False) -> dict[str, Any]:
    tls: dict[str, Any] = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    if client_certs:
        tls |= {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca_path)}
    return {"tls_server_config": tls,
            "basic_auth_users": {USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}}


def serving(prom: PrometheusServer) -> PrometheusServer:
    prom.wait_until_up(1)
    prom.wait_until('count(rate(vllm:prompt_tokens_total[3s]))', bool)
    prom.wait_until_observed(WINDOW_S)
    return prom


@pytest.fixture(scope="module")
def secured(pki: Pki, pod: VllmExporter) -> Iterator[PrometheusServer]:
    """HTTPS with our CA's certificate and basic auth."""
    with PrometheusServer([pod.address], scrape_interval_s=0.5, web_config=web_config(pki),
                          client_verify=str(pki.ca_path), client_auth=(USER, PASSWORD)) as prom:
        yield serving(prom)


def fetch(url: str, auth: PrometheusAuth | None) -> Signals | SourceError:
    return PrometheusSource(url, auth=auth).fetch([TARGET], now=time.time())[TARGET]


@pytest.mark.prometheus
def test_basic_auth_over_tls_with_our_ca(secured: PrometheusServer, pki: Pki, tmp_path: Path) -> None:
    good = PrometheusAuth.from_flags("basic", str(auth_dir(tmp_path / "good", username=USER, password=PASSWORD,
                                                           ca=pki.ca_path)))
    result = fetch(secured.url, good)
    assert isinstance(result, Signals) and result.prompt_tokens_per_s > 0, result

    wrong = PrometheusAuth.from_flags("basic", str(auth_dir(tmp_path / "wrong", username=USER,
                                                            password="not-" + PASSWORD, ca=pki.ca_path)))
    refused = fetch(secured.url, wrong)
    assert isinstance(refused, SourceError) and "401" in str(refused), refused
    assert "not-" + PASSWORD not in str(refused)

    untrusted = fetch(secured.url, PrometheusAuth.from_flags("basic", str(auth_dir(
        tmp_path / "no-ca", username=USER, password=PASSWORD))))  # the system's CAs do not know ours
    assert isinstance(untrusted, SourceError) and "CERTIFICATE_VERIFY_FAILED" in str(untrusted), untrusted
    assert PASSWORD not in str(untrusted)


@pytest.mark.prometheus
def test_client_certificate_mode_tls(pki: Pki, pod: VllmExporter, tmp_path: Path) -> None:
    with PrometheusServer([pod.address], scrape_interval_s=0.5, web_config=web_config(pki, client_certs=True),
                          client_verify=str(pki.ca_path), client_auth=(USER, PASSWORD),
                          client_cert=(str(pki.client_cert_path), str(pki.client_key_path))) as prom:
        serving(prom)
        files = {"username": USER, "password": PASSWORD, "ca": pki.ca_path}
        with_cert = PrometheusAuth.from_flags("tls,basic", str(auth_dir(
            tmp_path / "cert", cert=pki.client_cert_path, key=pki.client_key_path, **files)))
        assert isinstance(fetch(prom.url, with_cert), Signals)
        without = fetch(prom.url, PrometheusAuth.from_flags("basic", str(auth_dir(tmp_path / "plain", **files))))
        assert isinstance(without, SourceError), without


@pytest.fixture
def guarded(pod: VllmExporter) -> Iterator[tuple[PrometheusServer, HttpProxy]]:
    """Plain Prometheus behind a proxy that wants ``Authorization: Bearer TOKEN``."""
    with PrometheusServer([pod.address], scrape_interval_s=0.5) as prom, HttpProxy(prom.url) as proxy:
        proxy.bearer = TOKEN
        yield serving(prom), proxy


@pytest.mark.prometheus
def test_bearer_token_is_sent_rotated_and_only_to_our_prometheus(guarded: tuple[PrometheusServer, HttpProxy],
                                                                 tmp_path: Path) -> None:
    prom, proxy = guarded
    directory = auth_dir(tmp_path / "token", bearerToken=TOKEN + "\n")
    auth = PrometheusAuth.from_flags("bearer", str(directory))
    source = PrometheusSource(proxy.url, auth=auth)
    assert isinstance(source.fetch([TARGET], time.time())[TARGET], Signals)

    proxy.bearer = "rotated-" + TOKEN  # the token changes: the proxy refuses the old one ...
    refused = source.fetch([TARGET], time.time())[TARGET]
    assert isinstance(refused, SourceError) and "401" in str(refused) and TOKEN not in str(refused), refused
    (directory / "bearerToken").write_text("rotated-" + TOKEN)  # ... and the Secret's file follows
    os.utime(directory / "bearerToken", ns=(time.time_ns() + 10**9,) * 2)
    assert isinstance(source.fetch([TARGET], time.time())[TARGET], Signals)

    with HttpProxy(prom.url) as elsewhere:  # a trigger that names its own prometheusAddress
        other = Target("tiny", prometheus_address=elsewhere.url, rate_window_s=WINDOW_S)
        assert isinstance(source.fetch([other], time.time())[other], Signals)
        assert elsewhere.seen and all("Authorization" not in headers for _, headers in elsewhere.seen)


@pytest.mark.prometheus
def test_the_serve_process_shows_no_credential_anywhere(guarded: tuple[PrometheusServer, HttpProxy],
                                                        tmp_path: Path) -> None:
    """``leadscale serve`` with the chart's flags: good answers with the token; once Prometheus refuses it and
    the answers fail, the reason is in ``/decisions``, ``/metrics`` and the log, the token in none of them.
    A password inside --prometheus-url is hidden the same way."""
    _, proxy = guarded
    directory = auth_dir(tmp_path / "token", bearerToken=TOKEN)
    args = ["--prometheus-url", proxy.url, "--prometheus-auth-modes", "bearer", "--prometheus-auth-dir",
            str(directory), "--interval", "0.5", "--staleness-limit", "2"]
    with ScalerProcess(args, tmp_path) as scaler:
        keda = scaler.keda(META)
        eventually(lambda: _assert_ok(keda.get_metrics()))
        proxy.bearer = "another-token"
        eventually(lambda: _assert_refused(keda.get_metrics()))
        exposed = {"decisions": str(scaler.decisions()), "metrics": scaler.metrics()}
    exposed["log"] = scaler.log()
    assert "401" in exposed["decisions"] and "401" in exposed["log"]
    for where, text in exposed.items():
        assert TOKEN not in text, f"the token shows in {where}"

    host = proxy.url.removeprefix("http://")
    with ScalerProcess(["--prometheus-url", f"http://{USER}:{PASSWORD}@{host}", "--interval", "0.5",
                        "--staleness-limit", "2"], tmp_path / "userinfo") as scaler:
        keda = scaler.keda(META)
        eventually(lambda: _assert_refused(keda.get_metrics()))  # the proxy wants a bearer token, not basic
        exposed = {"answer": str(keda.get_metrics()), "decisions": str(scaler.decisions()), "metrics": scaler.metrics()}
    exposed["log"] = scaler.log()
    for where, text in exposed.items():
        assert PASSWORD not in text, f"the URL's password shows in {where}"
    assert REDACTED in exposed["decisions"]


def _assert_ok(answer: tuple[str, Any, float]) -> None:
    assert answer[0] == "ok", answer


def _assert_refused(answer: tuple[str, Any, float]) -> None:
    assert answer[0] == "UNAVAILABLE" and "401" in answer[1], answer
