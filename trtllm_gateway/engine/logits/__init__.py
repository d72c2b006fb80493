"""Logits processors: the interface (processor.py), loading and applying them (load.py), and the
seeds' test processor (hello_world.py)."""
