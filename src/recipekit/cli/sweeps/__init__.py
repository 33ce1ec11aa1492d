"""A sweep as one thing: ``validate`` and ``compare`` of every run a matrix build made (its matrix root), each view in
its own module, called by the command it extends (cli/validate.py, cli/run/report.py)."""
