"""The run's training data: input files → chunks → records → tokenised rows → memory-mapped shards, prepared
ahead, by many workers, or streamed; and the order the rows are trained in.
"""
