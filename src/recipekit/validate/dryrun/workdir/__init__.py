"""The dry run's work directory: the bundle re-planned for this machine, its toy dataset, and DeepSpeed's C++
ops built once.
"""
