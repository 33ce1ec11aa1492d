"""Stage 5, the bundle: its documents (ds_config, Job, launch data, recipe.yaml's operations section, monitoring),
the plan's terminal view, rendering into files, the atomic write, sweeps and rescales. ``build`` runs the stages in
order and hands the compiled record on.
"""
