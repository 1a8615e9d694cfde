"""Reusable test harnesses for real services: a real Prometheus and a vLLM-format exporter.

Import them from tests as ``from support.prometheus import PrometheusServer`` and
``from support.vllm_exporter import VllmExporter`` (pytest puts ``tests/`` on ``sys.path``).
"""
