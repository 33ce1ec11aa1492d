"""Stage image: the base-image matrix and its pins."""
