"""Serving-engine integrations of :class:`~dcut_sched.RatioController` (each importable without its engine)."""
