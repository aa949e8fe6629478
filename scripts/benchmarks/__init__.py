"""The measurements behind ``scripts/bench.py``, one module per benchmark.

``common`` holds what they share (the run's context, worker processes, CPU readings, tables);
``baseline`` runs ``enqueue``, ``process`` and ``latency``; ``executors``, ``keyed`` and
``spark`` are the optional sections. Each section module has ``run(bench, quick)`` returning
its JSON-ready figures and ``report(...)`` printing its table.
"""
