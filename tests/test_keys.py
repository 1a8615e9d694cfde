"""The key table (``scaler.keys``) is the one declaration: the parser, the docs and the policy agree with it."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from scaler import keys, metadata
from scaler.metadata import MetadataError, parse_metadata

ROW = re.compile(r"^\| `([A-Za-z]+)` \| ([^|]*) \| ([^|]*) \|")
BASE = {"model": "m", "profile": "h100-llama3-8b"}
EXPLICIT = {"model": "m", "prefillTokensPerSecond": "1000", "decodeTokensPerSecond": "500"}
PARTNERS = {"activationThreshold": {"activationQuery": "sum(q)"}, "trafficWeight": {"routeSelector": "app=x"},
            "maxReplicas": {"minReplicas": "0"}, "minReplicas": {"maxReplicas": "100000"}}


def docs_rows() -> dict[str, tuple[str, str]]:
    """docs/scaler.md's trigger-key table: key -> (default cell, allowed cell), in order."""
    text = (ROOT / "docs" / "scaler.md").read_text()
    table = text[text.index("| key | default | allowed | meaning |"):]
    table = table[: table.index("\n\n")]
    return {m.group(1): (m.group(2).strip(), m.group(3).strip()) for line in table.splitlines()
            if (m := ROW.match(line))}


def test_docs_list_every_key_in_table_order() -> None:
    assert list(docs_rows()) == [key.name for key in keys.KEYS]


@pytest.mark.parametrize("key", [k for k in keys.KEYS if keys.default(k.name) is not None], ids=lambda k: k.name)
def test_docs_default_is_the_table_default(key: keys.Key) -> None:
    shown, _ = docs_rows()[key.name]
    assert shown == f"`{keys.default(key.name):g}`", (key.name, shown)


@pytest.mark.parametrize("key", [k for k in keys.KEYS if k.low is not None or k.high is not None],
                         ids=lambda k: k.name)
def test_parser_enforces_the_table_range(key: keys.Key) -> None:
    """Just outside the declared range is refused naming the key; just inside is accepted."""
    explicit = key.name in metadata.EXPLICIT_CAPACITY_KEYS + metadata.OPTIONAL_CAPACITY_KEYS
    base = EXPLICIT if explicit else BASE
    partner = PARTNERS.get(key.name, {})  # keys valid only together with another
    for bound, outside in ((key.low, -1), (key.high, +1)):
        if bound is None:
            continue
        step = 1 if key.kind == "integer" else max(abs(bound) * 1e-3, 1e-3)
        open_bound = outside < 0 and key.low_open
        bad, good = (bound, bound + step) if open_bound else (bound + outside * step, bound)
        with pytest.raises(MetadataError, match=rf"\b{key.name}\b"):
            parse_metadata({**base, key.name: f"{bad:g}"})
        parse_metadata({**base, **partner, key.name: f"{good:g}"})


def test_unset_keys_give_the_table_defaults() -> None:
    config = parse_metadata(BASE)
    policy = config.policy_config(0, 10)
    for field, name in keys.policy_fields().items():
        if keys.default(name) is not None:
            assert getattr(policy, field) == keys.default(name), name


def test_every_tunable_is_a_policy_field_with_a_default() -> None:
    defaults = keys.policy_defaults()
    for name, (field, _) in keys.tunables().items():
        assert field in defaults, (name, field)
    assert set(metadata.known_keys()) == {k.name for k in keys.KEYS}
