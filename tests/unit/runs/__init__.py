"""Stage runs: reports, comparisons and recovery history of a run directory."""
