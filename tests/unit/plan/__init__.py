"""Stage plan: every derived number and every impossible combination."""
