"""Credentials for the scaler's Prometheus, named the way KEDA's own Prometheus scaler names them.

KEDA hands an external scaler no TriggerAuthentication parameter: it keeps ``caCert``, ``tlsClientCert``
and ``tlsClientKey`` for its own gRPC connection and sends only the trigger's metadata (KEDA's
``pkg/scalers/external_scaler.go``). So the scaler holds its Prometheus credentials itself, in the form
a TriggerAuthentication for KEDA's ``prometheus`` trigger gives them: a directory (the chart mounts a
Secret there) whose files are named after that trigger's parameters, and ``authModes`` as in its
metadata.

    auth = PrometheusAuth.from_flags("bearer", "/etc/leadscale/prometheus-auth")
    material = auth.material()     # headers, basic auth, CA and client certificate; re-read when files change

Parameters (files): ``bearerToken`` (mode ``bearer``), ``username`` and ``password`` (mode ``basic``),
``cert`` and ``key`` (mode ``tls``: a client certificate), ``ca`` (any mode, or none: the CA that
Prometheus's certificate must chain to). ``bearer`` and ``basic`` exclude each other, as in KEDA.
Files are re-read when their modification time changes, so a rotated token is picked up without a
restart. NOTE: KEDA's ``custom`` mode (an arbitrary header) is left out.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("bearer", "basic", "tls")
PARAMETERS = ("bearerToken", "username", "password", "ca", "cert", "key")
NEEDS = {"bearer": ("bearerToken",), "basic": ("username",), "tls": ("cert", "key")}
REDACTED = "<redacted>"


@dataclass(frozen=True)
class Material:
    """What one Prometheus request carries; ``secrets`` are the strings no message may show."""

    headers: dict[str, str] = field(default_factory=dict)
    basic: tuple[str, str] | None = None
    verify: str | bool = True
    """A CA bundle path, or True for the system's trust store."""
    cert: tuple[str, str] | None = None
    secrets: tuple[str, ...] = ()

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced (error messages from HTTP clients may echo them)."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text


@dataclass
class PrometheusAuth:
    """The ``--prometheus-auth-modes`` and ``--prometheus-auth-dir`` of ``leadscale serve``, validated."""

    modes: frozenset[str]
    directory: Path
    _stamp: tuple[tuple[str, int, int], ...] | None = field(default=None, init=False, repr=False)
    _material: Material | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def from_flags(cls, modes: str | None, directory: str | None) -> PrometheusAuth | None:
        """None when neither flag is set; ValueError naming the flag, the file and what is needed otherwise."""
        wanted = frozenset(m.strip().lower() for m in (modes or "").split(",") if m.strip())
        if not wanted and not directory:
            return None
        if not directory:
            raise ValueError(f"--prometheus-auth-modes={modes!r} needs --prometheus-auth-dir (a directory holding "
                             f"{', '.join(PARAMETERS)})")
        unknown = sorted(wanted - set(MODES))
        if unknown:
            raise ValueError(f"--prometheus-auth-modes={modes!r}: {', '.join(unknown)} is not a mode; allowed: "
                             f"{', '.join(MODES)} (comma-separated; bearer and basic exclude each other)")
        if {"bearer", "basic"} <= wanted:
            raise ValueError(f"--prometheus-auth-modes={modes!r}: bearer and basic exclude each other")
        auth = cls(wanted, Path(directory))
        if not auth.directory.is_dir():
            raise ValueError(f"--prometheus-auth-dir={directory!r}: not a directory")
        for mode in sorted(wanted):
            for name in NEEDS[mode]:
                if not (auth.directory / name).is_file():
                    raise ValueError(f"--prometheus-auth-modes={mode}: needs the file {name} in "
                                     f"--prometheus-auth-dir={directory!r} (the TriggerAuthentication parameter "
                                     f"{name!r})")
        auth.material()  # unreadable files fail here, at startup, not on the first evaluation
        return auth

    def _paths(self) -> dict[str, Path]:
        return {name: self.directory / name for name in PARAMETERS if (self.directory / name).is_file()}

    def material(self) -> Material:
        """The current credentials; the same object until a file changes (callers may compare with ``is``)."""
        paths = self._paths()
        try:
            stamp = tuple(sorted((name, p.stat().st_mtime_ns, p.stat().st_size) for name, p in paths.items()))
        except OSError:  # a file swapped while we looked (a Secret update): keep what we have, look again next time
            stamp = self._stamp or ()
        with self._lock:
            if self._material is None or stamp != self._stamp:
                self._material, self._stamp = self._read(paths), stamp
            return self._material

    def _read(self, paths: dict[str, Path]) -> Material:
        def text(name: str) -> str:
            try:
                return paths[name].read_text().rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"--prometheus-auth-dir={str(self.directory)!r}: {name}: cannot read: {exc}") from None

        headers: dict[str, str] = {}
        secrets: list[str] = []
        basic = None
        if "bearer" in self.modes:
            token = text("bearerToken")
            headers["Authorization"] = f"Bearer {token}"
            secrets.append(token)
        if "basic" in self.modes:
            user, password = text("username"), text("password") if "password" in paths else ""
            basic = (user, password)
            secrets += [s for s in (password,) if s]
        cert = (str(paths["cert"]), str(paths["key"])) if "tls" in self.modes else None
        verify: str | bool = str(paths["ca"]) if "ca" in paths else True
        return Material(headers, basic, verify, cert, tuple(sorted(set(secrets), key=len, reverse=True)))
