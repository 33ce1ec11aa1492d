"""Stage 6, after the bundle: packages for another machine, bundle diffs, and building the bundle's image."""
