"""refmount: mount kerchunk/fsspec reference sets as a read-only FUSE filesystem."""

__version__ = "0.1.0"
