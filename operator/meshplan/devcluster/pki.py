"""Throwaway PKI for the local control plane, made with the openssl CLI.

One CA signs: the kube-apiserver serving certificate (SANs for loopback and the
in-cluster names), and an admin client certificate in group `system:masters`.
A separate RSA key pair signs service-account tokens. Everything is fresh per
cluster and lives in the cluster's state directory.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVICE_IP = "10.96.0.1"  # first address of --service-cluster-ip-range=10.96.0.0/16


@dataclass(frozen=True)
class Pki:
    ca_crt: Path
    ca_key: Path
    apiserver_crt: Path
    apiserver_key: Path
    admin_crt: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _sign(d: Path, name: str, subject: str, ext: str, days: int = 30) -> None:
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=d)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", str(days), "-sha256", "-extfile", f"{name}.ext", cwd=d)


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "30", "-subj", "/CN=meshplan-dev-ca", cwd=d)
    sans = ",".join([
        "IP:127.0.0.1", f"IP:{SERVICE_IP}", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local",
    ])
    _sign(d, "apiserver", "/CN=kube-apiserver",
          f"basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
          f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n")
    _sign(d, "admin", "/O=system:masters/CN=meshplan-admin",
          "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    return Pki(d / "ca.crt", d / "ca.key", d / "apiserver.crt", d / "apiserver.key",
               d / "admin.crt", d / "admin.key", d / "sa.key", d / "sa.pub")
