"""What holds across the stages: the floor plan, style, docs, hostile input, every option."""
