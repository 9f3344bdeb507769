"""Where fetched bytes are kept and paced: the block cache, the disk cache, the memory budget,
read-ahead pacing per host, and verified fetches of Icechunk's virtual chunks."""
