"""Signal sources: adapters that turn Prometheus, pod scrapes or the Kubernetes API into ``Signals``.

``base`` holds the shared types; ``prometheus`` (batched PromQL) and ``scrape`` (pods' ``/metrics``)
are the two load sources. Import the concrete sources from their modules: they pull in HTTP clients.
"""

from scaler.sources.base import SignalSource, SourceError, Target

__all__ = ["SignalSource", "SourceError", "Target"]
