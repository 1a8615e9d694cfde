"""The key table (``scaler.keys``) is the one declaration: the parser, the docs and the policy agree with it."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import ROOT

from leadscale.chart_schema import CHART, metadata_node
from scaler import keys, metadata
from scaler.metadata import MetadataError, parse_metadata
from scaler.policy import FIELD_LIMITS, PolicyConfig, PolicyConfigError

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


def test_docs_allowed_cell_is_what_the_parser_says() -> None:
    for name, (_, cell) in docs_rows().items():
        assert cell == keys.allowed(name), name


NUMERIC = [k for k in keys.KEYS if (limit := keys.limit(k.name)) is not None
           and (limit.low is not None or limit.high is not None)]


@pytest.mark.parametrize("key", NUMERIC, ids=lambda k: k.name)
def test_parser_enforces_the_table_range(key: keys.Key) -> None:
    """Just outside the declared range is refused, naming the key and saying the docs' "allowed" cell;
    just inside is accepted."""
    limit = keys.limit(key.name)
    assert limit is not None
    explicit = key.name in metadata.EXPLICIT_CAPACITY_KEYS + metadata.OPTIONAL_CAPACITY_KEYS
    base = EXPLICIT if explicit else BASE
    partner = PARTNERS.get(key.name, {})  # keys valid only together with another
    for bound, outside, open_bound in ((limit.low, -1, limit.low_open), (limit.high, +1, limit.high_open)):
        if bound is None:
            continue
        step = 1 if limit.integer else max(abs(bound) * 1e-3, 1e-3)
        bad, good = (bound, bound - outside * step) if open_bound else (bound + outside * step, bound)
        with pytest.raises(MetadataError) as refused:
            parse_metadata({**base, **partner, key.name: f"{bad:g}"})
        assert f"{key.name}: got '{bad:g}'; allowed: {keys.allowed(key.name)}" in str(refused.value)
        parse_metadata({**base, **partner, key.name: f"{good:g}"})


def test_every_numeric_policy_field_is_validated() -> None:
    """A ``PolicyConfig`` number without a declared limit would escape validation (and the key table)."""
    numeric = {name for name, value in keys.policy_defaults().items()
               if isinstance(value, (int, float)) and not isinstance(value, bool)}
    assert numeric == set(FIELD_LIMITS)


def test_the_policy_names_every_bad_field_with_its_limit() -> None:
    capacity = parse_metadata(BASE).capacity
    with pytest.raises(PolicyConfigError) as refused:
        PolicyConfig(capacity=capacity, headroom_quantile=1.0, prior_horizons=1.5, ttft_slo_s=math.nan)
    fields = {name: allowed for name, _, allowed in refused.value.problems}
    assert fields == {name: FIELD_LIMITS[name].text()
                      for name in ("headroom_quantile", "prior_horizons", "ttft_slo_s")}


# --- the chart's values schema is typed from the table ------------------------------------------------
def chart_metadata_schema() -> dict[str, Any]:
    return metadata_node(json.loads((CHART / "values.schema.json").read_text()))


def test_chart_schema_is_the_table() -> None:
    assert chart_metadata_schema() == json.loads(json.dumps(keys.metadata_json_schema())), \
        "regenerate with: python -m leadscale.chart_schema"


def chart_examples() -> list[dict[str, str]]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["scaledObject"]["metadata"]
    found = [values]
    for path in sorted((CHART / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ScaledObject":
                found += [t["metadata"] for t in doc["spec"]["triggers"]]
    return found


def test_chart_examples_pass_the_schema_and_the_parser() -> None:
    examples = chart_examples()
    assert len(examples) >= 3
    for example in examples:
        jsonschema.validate(example, chart_metadata_schema())
        filled = {k: str(v) for k, v in example.items() if str(v)} | {"model": example.get("model") or "m"}
        if "profile" not in filled and "prefillTokensPerSecond" not in filled:
            filled["profile"] = BASE["profile"]
        parse_metadata(filled)


@pytest.mark.parametrize(("metadata_map", "where"), [
    ({"model": "m", "ttftSecond": "2"}, "ttftSecond"),
    ({"model": "m", "ttftSeconds": 0}, "ttftSeconds"),
    ({"model": "m", "leadTime": "soon"}, "leadTime"),
    ({"model": "m", "maxReplicas": "2.5"}, "maxReplicas"),
    ({"model": "m", "headroomQuantile": 1}, "headroomQuantile"),
])
def test_chart_schema_refuses_what_the_parser_refuses(metadata_map: dict[str, Any], where: str) -> None:
    with pytest.raises(jsonschema.ValidationError) as refused:
        jsonschema.validate(metadata_map, chart_metadata_schema())
    assert where in refused.value.json_path or where in refused.value.message
    with pytest.raises(MetadataError, match=rf"\b{where}\b"):
        parse_metadata({**BASE, **{k: str(v) for k, v in metadata_map.items()}})


def test_chart_schema_accepts_keda_keys_from_env_and_units() -> None:
    jsonschema.validate({"model": "m", "leadTime": "auto", "scaleDownDelay": "1.5m", "ttftSeconds": 2,
                         "modelFromEnv": "MODEL", "scalerAddress": "leadscale:9090", "rateWindow": ""},
                        chart_metadata_schema())


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
