"""Finished runs, read back: a run's report with plots and plan vs measured, and the alignment of two runs.

After validate in the stage order: it reads what a bundle's run left in its output directory (metrics, run records,
checkpoint timings), never a live cluster, and imports nothing that builds bundles.
"""
