"""recipekit: one declarative recipe compiled into a reproducible LLM training bundle for Volcano clusters."""

__version__ = "0.1.0"
