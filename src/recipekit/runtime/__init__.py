"""Files copied verbatim into every bundle. They must not import recipekit: a bundle runs where recipekit is absent."""
