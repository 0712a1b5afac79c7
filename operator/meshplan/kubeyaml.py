"""Read manifests as kubectl reads them: YAML -> JSON by sigs.k8s.io/yaml over go-yaml v2.

`meshplan plan`/`render` must see the manifest `kubectl apply` sends (issue 17, finding 10:
`1e1` was a string to meshplan and 10 to kubectl; a 568-byte alias bomb cost 68 s and 643 MB).
kubectl (v1.36: sigs.k8s.io/yaml v1.6.0, go.yaml.in/yaml/v2 v2.4.3) converts YAML to JSON with
go-yaml v2's resolver, which is YAML 1.1 with these rules (go.yaml.in/yaml/v2 resolve.go, decode.go):

- plain scalars only (quoted ones are strings); the first character picks the candidates;
- bool: y Y yes Yes YES true True TRUE on On ON, n N no No NO false False FALSE off Off OFF
  (PyYAML has no y/n);
- null: empty, ~, null, Null, NULL; .nan .NaN .NAN; [+-].inf .Inf .INF;
- a scalar starting with a sign or digit: underscores removed, then Go's ParseInt(s, 0, 64)
  (0x, 0o, 0b and leading-0 octal: 0755 is 493), then ParseUint, then a float when it matches
  `^[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?$` (so 1e1 is 10; PyYAML wants a dot);
  timestamps (2001-12-14) stay the text they are; no base-60 numbers (1:30 is a string);
- a scalar starting with '.': Go's ParseFloat (.5);
- map keys become JSON strings (`n: 1` is the key "false"), and JSON has no NaN or infinities
  (kubectl refuses them: "json: unsupported value");
- aliases: decoding fails with "document contains excessive aliasing" once more than 100
  aliased nodes were decoded, more than 1000 in all, and the aliased share exceeds 99 % (up
  to 400,000 nodes), falling linearly to 10 % at 4,000,000 (decode.go, allowedAliasRatio).

A JSON number is then what the API server reads: an integral float such as 10.0 arrives as 10.
tests/test_kubeyaml.py compares this reader with sigs.k8s.io/yaml itself (a Go program).
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterator

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_BOOL = {**{s: True for s in ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")},
         **{s: False for s in ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")}}
_NULL = {"", "~", "null", "Null", "NULL"}
_SPECIAL_FLOAT = {".nan": math.nan, ".NaN": math.nan, ".NAN": math.nan,
                  **{p + s: (-math.inf if p == "-" else math.inf) for p in ("", "+", "-") for s in (".inf", ".Inf", ".INF")}}
_YAML_STYLE_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?\Z")
# Go's ParseInt(s, 0, 64) syntax (strconv: base prefix 0b/0o/0x, or a leading 0 for octal)
_GO_INT = re.compile(r"^[-+]?(0[bB][01]+|0[oO][0-7]+|0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)\Z")
# Go's ParseFloat for a scalar starting with '.' (decimal only here: .5, .5e3)
_DOT_FLOAT = re.compile(r"^\.[0-9]+([eE][-+]?[0-9]+)?\Z")
# go-yaml v2 parseTimestamp formats: 2006-1-2T15:4:5.999999999Z07:00 (t or space too), 2006-1-2
_TIMESTAMP = re.compile(r"^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt ][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\.[0-9]+)?"
                        r"(Z|[-+][0-9]{2}:[0-9]{2})?)?\Z")
_INT_LIMIT = 2 ** 63
_UINT_LIMIT = 2 ** 64
# decode.go
ALIAS_RATIO_LOW, ALIAS_RATIO_HIGH = 400_000, 4_000_000


class KubeYamlError(ValueError):
    """A manifest kubectl would not send (excessive aliasing, NaN/Inf, not YAML)."""


def _go_int(text: str) -> int | None:
    if not _GO_INT.match(text):
        return None
    sign = -1 if text[0] == "-" else 1
    body = text.lstrip("+-")
    if body[:2] in ("0b", "0B"):
        v = int(body[2:], 2)
    elif body[:2] in ("0o", "0O"):
        v = int(body[2:], 8)
    elif body[:2] in ("0x", "0X"):
        v = int(body[2:], 16)
    elif len(body) > 1 and body[0] == "0":
        v = int(body[1:], 8)
    else:
        v = int(body)
    v *= sign
    if -_INT_LIMIT <= v < _INT_LIMIT:                          # ParseInt
        return v
    if text[0] not in "+-" and 0 <= v < _UINT_LIMIT:            # ParseUint (takes no sign)
        return v
    return None


def resolve_plain(text: str) -> Any:
    """The value go-yaml v2 gives a plain (unquoted) scalar, as it reaches JSON (see module doc)."""
    if text in _BOOL:
        return _BOOL[text]
    if text in _NULL:
        return None
    if text in _SPECIAL_FLOAT:
        return _SPECIAL_FLOAT[text]
    first = text[0]
    if first == ".":
        return float(text) if _DOT_FLOAT.match(text) else text
    if first in "+-0123456789":
        if _TIMESTAMP.match(text):
            return text                      # sigs.k8s.io/yaml keeps a timestamp's text
        plain = text.replace("_", "")
        v = _go_int(plain)
        if v is not None:
            return v
        if _YAML_STYLE_FLOAT.match(plain):
            return float(plain)
        if plain.startswith("0b"):
            try:
                return int(plain[2:], 2)
            except ValueError:
                pass
        elif plain.startswith("-0b"):
            try:
                return -int(plain[3:], 2)
            except ValueError:
                pass
    return text


def _json_number(v: Any, where: str) -> Any:
    if isinstance(v, float):
        if not math.isfinite(v):
            raise KubeYamlError(f"{where}: {v} is not a JSON number (kubectl refuses it: json: unsupported value)")
        if v.is_integer() and abs(v) < 1e21:
            return int(v)                    # Go's JSON encoding of 10.0 is 10
    return v


def _go_g(v: float) -> str:
    """Go's strconv.FormatFloat(v, 'g', -1, 64): shortest digits, %e below 1e-4 or from 1e+06 (Go's
    ftoa.go: with the shortest precision the %e threshold is an exponent of 6)."""
    from decimal import Decimal

    sign, digits, exponent = Decimal(repr(v)).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    dp = len(digits) + exponent                      # decimal point position
    exp = dp - 1
    neg = "-" if sign else ""
    if ds == "0":
        return neg + "0"
    if exp < -4 or exp >= 6:
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{neg}{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if dp <= 0:
        return f"{neg}0.{'0' * -dp}{ds}"
    if dp >= len(ds):
        return neg + ds + "0" * (dp - len(ds))
    return f"{neg}{ds[:dp]}.{ds[dp:]}"


def _key(v: Any) -> str:
    """A map key as sigs.k8s.io/yaml writes it into JSON (its convertToJSONableObject)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        raise KubeYamlError("a null map key: kubectl refuses it (unsupported map key)")
    if isinstance(v, float):
        return _go_g(v)
    if isinstance(v, int) and v >= _INT_LIMIT:
        raise KubeYamlError(f"map key {v} is beyond int64: kubectl refuses it (unsupported map key)")
    return str(v)


def check_aliasing(node: Node) -> None:
    """Fail as go-yaml v2 does on excessive aliasing (decode.go), without expanding the document."""
    seen: set[int] = set()
    decode_count = alias_count = 0
    # (node, inside an alias) in document order; a node met again is an alias and is decoded again
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:
        n, aliased = stack.pop()
        again = id(n) in seen and isinstance(n, (MappingNode, SequenceNode, ScalarNode))
        aliased = aliased or again
        seen.add(id(n))
        decode_count += 1
        if aliased:
            alias_count += 1
        if alias_count > 100 and decode_count > 1000:
            if decode_count <= ALIAS_RATIO_LOW:
                allowed = 0.99
            elif decode_count >= ALIAS_RATIO_HIGH:
                allowed = 0.10
            else:
                allowed = 0.99 - 0.89 * (decode_count - ALIAS_RATIO_LOW) / (ALIAS_RATIO_HIGH - ALIAS_RATIO_LOW)
            if alias_count / decode_count > allowed:
                raise KubeYamlError(
                    f"the document contains excessive aliasing ({alias_count} of {decode_count} nodes decoded "
                    "through aliases): kubectl refuses it too ('yaml: document contains excessive aliasing')")
        if isinstance(n, MappingNode):
            for k, v in reversed(n.value):
                stack.append((v, aliased))
                stack.append((k, aliased))
        elif isinstance(n, SequenceNode):
            for v in reversed(n.value):
                stack.append((v, aliased))


class KubeLoader(yaml.SafeLoader):
    """PyYAML's safe loader with go-yaml v2's resolution of plain scalars (see module doc)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is ScalarNode and implicit[0]:
            if value == "<<":
                return "tag:yaml.org,2002:merge"
            return "tag:meshplan.dev,2026:plain"
        return super().resolve(kind, value, implicit)

    def construct_plain(self, node: ScalarNode) -> Any:
        return resolve_plain(node.value)


KubeLoader.add_constructor("tag:meshplan.dev,2026:plain", KubeLoader.construct_plain)
# Explicit tags (!!str, !!int, ...) are rare in manifests; PyYAML's own constructors read them.


def _jsonable(obj: Any, where: str = "") -> Any:
    if isinstance(obj, dict):
        return {_key(k): _jsonable(v, f"{where}.{_key(k)}" if where else _key(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, (bytes, bytearray)):
        import base64

        return base64.b64encode(obj).decode()
    if hasattr(obj, "isoformat") and not isinstance(obj, str):
        return obj.isoformat()
    return _json_number(obj, where or "document")


def load_all(text: str) -> Iterator[Any]:
    """Each document of `text` as kubectl would send it (JSON-able; None for an empty document)."""
    loader = KubeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            check_aliasing(node)
            yield _jsonable(loader.construct_document(node))
    except yaml.YAMLError as exc:
        raise KubeYamlError(f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def load(text: str) -> Any:
    docs = list(load_all(text))
    if len(docs) != 1:
        raise KubeYamlError(f"expected one YAML document, found {len(docs)}")
    return docs[0]


__all__ = ["KubeLoader", "KubeYamlError", "check_aliasing", "load", "load_all", "resolve_plain"]
