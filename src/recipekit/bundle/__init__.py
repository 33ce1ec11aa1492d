"""Stage 5, the bundle: its documents (ds_config, Job, monitoring), the plan report, rendering and the atomic
write. ``build`` runs the stages in order and is the only caller of them all.
"""
