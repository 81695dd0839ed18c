"""absl entry points: run.py (one experiment), bench.py (speed), reproduce.py."""
