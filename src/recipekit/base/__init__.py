"""The floor every stage stands on: the one error type, where recipekit's data lives, bounded reads, and the
safe YAML and TOML readers.
"""
