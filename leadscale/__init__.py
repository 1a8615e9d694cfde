"""The ``leadscale`` command's composition root: it joins the scaler's and the simulator's subcommands.

It lives outside both packages so that ``scaler/`` imports nothing from ``simulator/``: the live scaler
installs and runs alone (``pip install leadscale``), the simulator and advisor come with ``[sim]``.
"""
