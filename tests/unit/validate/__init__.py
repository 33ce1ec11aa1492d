"""Stage validate: the static checks and the dry run's pieces."""
