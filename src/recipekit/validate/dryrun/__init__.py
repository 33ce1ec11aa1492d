"""The dry run: the bundle's own run.sh and runtime as simulated Volcano pods on this machine, judged."""
