"""Stage 2, the base images: the image matrix per hardware family and Dockerfile reading. Reads the recipe only."""
