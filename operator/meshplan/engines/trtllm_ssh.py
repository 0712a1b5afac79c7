"""The ssh material of a TensorRT-LLM multi-node deployment: one Secret, made by the operator.

TensorRT-LLM runs one MPI world over the pods of a replica group: the leader's `mpirun` starts
the ranks of the other pods over ssh (Open MPI's rsh launcher; TensorRT-LLM / Dynamo multi-node
examples), and the release image ships sshd but no host key and no authorized key. The
operator makes, per deployment, an Ed25519 client key pair (the leader's identity), an Ed25519
host key (the workers' sshd) and a `known_hosts` line for it, so ssh checks the workers' host
key instead of trusting whatever answers. `meshplan.engines.trtllm` mounts the Secret read-only
with mode 0400 and points sshd/ssh at the files by options (docs/trtllm-multinode.md).

Standard library only (the operator image has no crypto package): Ed25519 public keys are
derived as RFC 8032 section 5.1.5 specifies, and the keys are written in OpenSSH's own formats
(PROTOCOL.key "openssh-key-v1" private keys, RFC 8709 / RFC 4253 public key blobs). The
private keys come from `secrets.token_bytes` (the OS CSPRNG).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import struct
from typing import Any, Mapping

from meshplan.engines.trtllm import (
    SSH_AUTHORIZED_KEYS,
    SSH_CLIENT_KEY,
    SSH_HOST_KEY,
    SSH_KNOWN_HOSTS,
    ssh_secret_name,
)

# ---- Ed25519 (RFC 8032 section 5.1) ----------------------------------------------------------
_P = 2 ** 255 - 19
_L = 2 ** 252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_BY = 4 * pow(5, _P - 2, _P) % _P
_BX_SQ = (_BY * _BY - 1) * pow(_D * _BY * _BY + 1, _P - 2, _P) % _P
_BX = pow(_BX_SQ, (_P + 3) // 8, _P)
if (_BX * _BX - _BX_SQ) % _P:
    _BX = _BX * pow(2, (_P - 1) // 4, _P) % _P
if _BX & 1:
    _BX = _P - _BX
_B = (_BX, _BY, 1, _BX * _BY % _P)      # extended coordinates (X, Y, Z, T)


def _add(p: tuple[int, int, int, int], q: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    a = (p[1] - p[0]) * (q[1] - q[0]) % _P
    b = (p[1] + p[0]) * (q[1] + q[0]) % _P
    c = 2 * p[3] * q[3] * _D % _P
    d = 2 * p[2] * q[2] % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def _mul(s: int, p: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    q = (0, 1, 1, 0)
    while s:
        if s & 1:
            q = _add(q, p)
        p = _add(p, p)
        s >>= 1
    return q


def ed25519_public_key(seed: bytes) -> bytes:
    """The 32-byte public key of a 32-byte Ed25519 private key (seed), RFC 8032 section 5.1.5."""
    if len(seed) != 32:
        raise ValueError("an Ed25519 private key is 32 bytes")
    h = hashlib.sha512(seed).digest()
    a = int.from_bytes(h[:32], "little")
    a &= (1 << 254) - 8
    a |= 1 << 254
    x, y, z, _ = _mul(a, _B)
    zi = pow(z, _P - 2, _P)
    x, y = x * zi % _P, y * zi % _P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


# ---- OpenSSH formats ---------------------------------------------------------------------------
def _string(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def public_blob(public: bytes) -> bytes:
    return _string(b"ssh-ed25519") + _string(public)


def public_line(public: bytes, comment: str) -> str:
    """`ssh-ed25519 AAAA... comment` (authorized_keys / .pub format)."""
    return f"ssh-ed25519 {base64.b64encode(public_blob(public)).decode()} {comment}".rstrip()


def private_pem(seed: bytes, comment: str, checkint: int | None = None) -> str:
    """An unencrypted OpenSSH private key file ("openssh-key-v1", OpenSSH PROTOCOL.key)."""
    public = ed25519_public_key(seed)
    check = secrets.randbits(32) if checkint is None else checkint
    body = (struct.pack(">II", check, check) + _string(b"ssh-ed25519") + _string(public)
            + _string(seed + public) + _string(comment.encode()))
    body += bytes(range(1, 1 + (-len(body)) % 8))           # padding 1, 2, 3, ... to the cipher block (8)
    blob = (b"openssh-key-v1\0" + _string(b"none") + _string(b"none") + _string(b"") + struct.pack(">I", 1)
            + _string(public_blob(public)) + _string(body))
    text = base64.b64encode(blob).decode()
    lines = [text[i:i + 70] for i in range(0, len(text), 70)]
    return "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END OPENSSH PRIVATE KEY-----\n"


def ssh_files(deployment: str, *, client_seed: bytes | None = None, host_seed: bytes | None = None) -> dict[str, str]:
    """The Secret's files: client private key, its authorized_keys line, host key, known_hosts."""
    client = client_seed or secrets.token_bytes(32)
    host = host_seed or secrets.token_bytes(32)
    return {
        SSH_CLIENT_KEY: private_pem(client, f"meshplan-{deployment}-mpirun"),
        SSH_AUTHORIZED_KEYS: public_line(ed25519_public_key(client), f"meshplan-{deployment}-mpirun") + "\n",
        SSH_HOST_KEY: private_pem(host, f"meshplan-{deployment}-sshd"),
        # `*`: every worker of the deployment presents this host key, whatever its DNS name and port
        SSH_KNOWN_HOSTS: "* " + public_line(ed25519_public_key(host), "").strip() + "\n",
    }


def ssh_secret(deployment: str, namespace: str, owner: Mapping[str, Any], labels: Mapping[str, str],
               files: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Secret manifest (owned by the LLMDeployment, so it goes with it)."""
    data = files if files is not None else ssh_files(deployment)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": ssh_secret_name(deployment), "namespace": namespace, "labels": dict(labels),
                     "ownerReferences": [dict(owner)]},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())},
    }


def needs_ssh_secret(objects: list[Mapping[str, Any]]) -> str | None:
    """The ssh Secret name the rendered pods mount (None when no pod mounts one)."""
    return mounted_secret(objects, "trtllm-ssh")


# ---- engine-neutral entry points (NVIDIA NIM multi-node uses them; the TensorRT-LLM ones above are unchanged) ----
def client_key_files(comment: str, *, private_name: str, public_name: str | None = None,
                     seed: bytes | None = None) -> dict[str, str]:
    """One fresh Ed25519 key pair as Secret files: the OpenSSH private key under `private_name` and, when
    `public_name` is given, its public line there (`ssh-keygen -y -f <private>` derives the same line)."""
    key = seed or secrets.token_bytes(32)
    files = {private_name: private_pem(key, comment)}
    if public_name:
        files[public_name] = public_line(ed25519_public_key(key), comment) + "\n"
    return files


def owned_secret(name: str, namespace: str, owner: Mapping[str, Any], labels: Mapping[str, str],
                 files: Mapping[str, str]) -> dict[str, Any]:
    """A Secret manifest named `name` holding `files`, owned by the LLMDeployment (so it goes with it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels), "ownerReferences": [dict(owner)]},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in sorted(files.items())},
    }


def mounted_secret(objects: list[Mapping[str, Any]], volume: str) -> str | None:
    """The Secret the rendered pods mount as volume `volume` (None when no pod mounts one)."""
    for obj in objects:
        if obj.get("kind") != "Pod":
            continue
        for vol in (obj.get("spec") or {}).get("volumes") or ():
            name = (vol.get("secret") or {}).get("secretName", "")
            if vol.get("name") == volume and name:
                return name
    return None


__all__ = ["client_key_files", "ed25519_public_key", "mounted_secret", "needs_ssh_secret", "owned_secret",
           "private_pem", "public_line", "ssh_files", "ssh_secret"]
