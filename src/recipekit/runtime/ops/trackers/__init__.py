"""The experiment trackers (W&B, MLflow, SwanLab): which clients a run's processes import (clients.py, before the
training stack), and the guard that keeps a tracker that is down from stopping training (guarded.py)."""
