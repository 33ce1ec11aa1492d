"""The command line as a user meets it."""
