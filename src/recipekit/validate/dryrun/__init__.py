"""The dry run: the bundle's own launcher and runtime as simulated Volcano pods on this machine, judged."""
