"""Stage recipe: composition, the typed Recipe, team repos, model import."""
