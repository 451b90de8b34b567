"""The unit tier: pure and in-process (synthetic traces, fake clocks, option checks). No Lightning
Trainer and no subprocess: tests/conftest.py makes both raise here (CONTRIBUTING.md)."""
