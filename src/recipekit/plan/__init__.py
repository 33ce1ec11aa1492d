"""Stage 3, the plan: every number the bundle uses (layout, parallelism, model and data sizes). Pure arithmetic."""
