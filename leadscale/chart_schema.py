"""Write the trigger-key table (``scaler.keys``) into the chart's ``values.schema.json``.

``python -m leadscale.chart_schema [CHART_DIR]`` after changing a key; ``tests/test_keys.py`` fails while
the chart's schema and the table disagree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from scaler.keys import metadata_json_schema

CHART = Path(__file__).resolve().parent.parent / "charts" / "leadscale"


def metadata_node(schema: dict[str, Any]) -> dict[str, Any]:
    """The ``scaledObject.metadata`` node of a values schema."""
    node: dict[str, Any] = schema["properties"]["scaledObject"]["properties"]["metadata"]
    return node


def main(argv: list[str] | None = None) -> int:
    path = Path((argv if argv is not None else sys.argv[1:] or [str(CHART)])[0]) / "values.schema.json"
    schema = json.loads(path.read_text())
    node = metadata_node(schema)
    node.clear()
    node.update(metadata_json_schema())
    path.write_text(json.dumps(schema, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote the trigger-key table into {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
